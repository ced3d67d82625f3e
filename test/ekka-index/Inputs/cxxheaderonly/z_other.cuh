#define PREFIX other
#include "inner.cuh"
