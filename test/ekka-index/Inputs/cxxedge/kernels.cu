#include "proto.cuh"

__global__ void fwd_kernel(int* p) {
  *p = 1;
}

// #if branches that each open a brace: the span still ends at the body's end.
void branches(int x) {
#if defined(USE_FAST)
  if (x > 0) {
#else
  if (x < 0) {
#endif
    x = 0;
  }
}

// A function-try-block ends with its last handler.
int guarded(int x) try {
  return x;
} catch (int e) {
  return e;
}

#define KNAME(n) n##_k
// A kernel named by a macro is one kernel, not two.
__global__ void KNAME(macro)(int* p) { *p = 2; }
