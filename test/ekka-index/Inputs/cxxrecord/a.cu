#define PREFIX alpha
#include "h.cuh"
