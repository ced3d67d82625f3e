#define PREFIX beta
#include "h.cuh"
