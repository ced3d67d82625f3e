#include "elem.cuh"
#include "uses.cuh"
__global__ void k2(ELEM* p) { *p = 0; }
