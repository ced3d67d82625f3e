#define USE_FAST
#include "elem.cuh"
#include "uses.cuh"
__global__ void k1(ELEM* p) { *p = 0; }
