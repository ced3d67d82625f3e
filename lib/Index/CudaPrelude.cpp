//===- CudaPrelude.cpp - Just enough CUDA for a host-side parse ----------===//
//
// Clang 16 and 19 cannot read CUDA 13's own headers (texture_fetch_functions.h
// uses builtins they lack), and an index needs declarations, not device code.
// So CUDA files are parsed in host mode with -nocudainc and this prelude: the
// execution-space qualifiers map onto Clang's CUDA attributes, which is what
// makes a `__global__` function a kernel in the AST, and the common vector,
// half, bfloat16 and fp8 types exist so kernel signatures parse.
//
//===----------------------------------------------------------------------===//
#include "ekka/Index/CxxIndexer.h"

namespace ekka {

llvm::StringRef cudaPrelude() {
  return R"prelude(
#pragma clang system_header
#define __CUDACC__ 1
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __managed__ __attribute__((managed))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
#define __restrict__ __restrict
#define __cluster_dims__(...)

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x = 1, unsigned y = 1, unsigned z = 1) : x(x), y(y), z(z) {}
};
#define EKKA_VEC2(T, N) struct N##1 { T x; }; struct N##2 { T x, y; }; \
  struct N##3 { T x, y, z; }; struct N##4 { T x, y, z, w; };
EKKA_VEC2(char, char) EKKA_VEC2(unsigned char, uchar) EKKA_VEC2(short, short)
EKKA_VEC2(unsigned short, ushort) EKKA_VEC2(int, int) EKKA_VEC2(unsigned, uint)
EKKA_VEC2(long, long) EKKA_VEC2(unsigned long, ulong) EKKA_VEC2(long long, longlong)
EKKA_VEC2(unsigned long long, ulonglong) EKKA_VEC2(float, float) EKKA_VEC2(double, double)
#undef EKKA_VEC2
extern const uint3 threadIdx, blockIdx;
extern const dim3 blockDim, gridDim;
extern const int warpSize;

struct __half { unsigned short __x; };
struct __half2 { __half x, y; };
typedef __half half;
typedef __half2 half2;
struct __nv_bfloat16 { unsigned short __x; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;
struct __nv_fp8_e4m3 { unsigned char __x; };
struct __nv_fp8_e5m2 { unsigned char __x; };
struct __nv_fp8x2_e4m3 { unsigned short __x; };
struct __nv_fp8x2_e5m2 { unsigned short __x; };
struct __nv_fp8x4_e4m3 { unsigned __x; };
struct __nv_fp8x4_e5m2 { unsigned __x; };
typedef unsigned char __nv_fp8_storage_t;
struct __nv_fp4_e2m1 { unsigned char __x; };

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef int cudaError_t;
enum { cudaSuccess = 0 };
typedef int CUresult;
enum cudaDataType_t { CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2 };
typedef enum cudaDataType_t cudaDataType;
)prelude";
}

} // namespace ekka
