#pragma once
#include <cute/layout.hpp>

namespace lib {

template <typename A, typename B>
struct vec_cast {};

// Specialized over a type whose header is not there: Clang drops it.
template <>
struct vec_cast<float, __nv_fp4x2_e2m1> {
  static void cast() {}
};

// The base comes from the missing header: Clang drops the base.
struct Epilogue : public cute::Layout<int, 4>, private Tagged {
  int stride;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
struct BlackwellOnly {
  struct Inner {
    int x;
  };
};
#endif

__global__ void LAUNCH_BOUNDS(256) with_local_state(int* p) {
  struct LocalState {
    int x;
  };
  *p = 0;
}

// Not definitions: a forward declaration, an elaborated use, enum class,
// a template parameter.
struct Forward;
void use(struct Forward* f);
enum class Mode { kA, kB };
template <class T> void generic(T);

}  // namespace lib
