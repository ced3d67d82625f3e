#pragma once
struct UsesElem {
  ELEM value;
};
#ifdef USE_FAST
__global__ void fast_k(float* p) { *p = 1; }
#endif
