//===- Lanes.h - Four doubles at a time over a tensor's bytes ---*- C++ -*-===//
//
// The loops that run over every element of a captured tensor — its
// statistics when it is recorded, the error ratio's sums when it is
// compared — widen elements to double four at a time into the lanes of a
// vector (GCC's and Clang's vector extensions), element i to lane i mod 4:
// four independent chains of additions, which a vector unit takes at once.
// The loops are written once as templates over a loader per dtype and
// compiled twice: for the baseline x86-64 and, chosen once at run time when
// the CPU has them, for AVX2 and FMA (EKKA_WIDE, wideLanes()).
//
// Header-only and free of LLVM: the tracing runtime uses it inside the
// traced process.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_SUPPORT_LANES_H
#define EKKA_SUPPORT_LANES_H

#include <cstddef>
#include <cstdint>
#include <cstring>

// Vectors of four doubles pass only between inlined functions of one
// translation unit, so GCC's warning that their calling convention depends
// on AVX does not apply: silenced here (GCC's and Clang's) for the functions
// that return one.
// Those that take one take it by reference: for a parameter passed by
// value GCC also notes that the ABI changed in GCC 4.6, a note this pragma
// does not silence.
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpsabi"
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace ekka {
namespace lanes {

typedef double Double4 __attribute__((vector_size(32)));
typedef int64_t Int4 __attribute__((vector_size(32)));

/// The four lanes' sum, in a fixed order.
inline double sum(const Double4 &V) { return (V[0] + V[1]) + (V[2] + V[3]); }

/// Four elements through a loader's one-element \c at.
template <typename L> struct Scalar4 {
  static Double4 at4(const char *P) {
    return Double4{L::at(P), L::at(P + L::Size), L::at(P + 2 * L::Size),
                   L::at(P + 3 * L::Size)};
  }
};

/// An arithmetic type as stored (float, double, the integers).
template <typename T> struct LoadAs {
  static constexpr size_t Size = sizeof(T);
  static double at(const char *P) {
    T V;
    std::memcpy(&V, P, sizeof(T));
    return double(V);
  }
  static Double4 at4(const char *P) {
    typedef T T4 __attribute__((vector_size(4 * sizeof(T))));
    T4 V;
    std::memcpy(&V, P, sizeof(V));
    return __builtin_convertvector(V, Double4);
  }
};

/// bfloat16: the high half of a float.
struct LoadBF16 {
  static constexpr size_t Size = 2;
  static double at(const char *P) {
    uint16_t H;
    std::memcpy(&H, P, 2);
    uint32_t U = uint32_t(H) << 16;
    float V;
    std::memcpy(&V, &U, 4);
    return V;
  }
  static Double4 at4(const char *P) {
    typedef uint16_t H4 __attribute__((vector_size(8)));
    typedef uint32_t U4 __attribute__((vector_size(16)));
    typedef float F4 __attribute__((vector_size(16)));
    H4 H;
    std::memcpy(&H, P, sizeof(H));
    U4 U = __builtin_convertvector(H, U4) << 16;
    F4 F;
    std::memcpy(&F, &U, sizeof(F));
    return __builtin_convertvector(F, Double4);
  }
};

/// A type widened element by element by \p Convert (half, the float8s).
template <typename Bits, double (*Convert)(Bits)>
struct LoadBy : Scalar4<LoadBy<Bits, Convert>> {
  static constexpr size_t Size = sizeof(Bits);
  static double at(const char *P) {
    Bits B;
    std::memcpy(&B, P, sizeof(Bits));
    return Convert(B);
  }
};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/// The attribute of a loop's AVX2 and FMA clone (flatten: the loaders and
/// arithmetic it calls are compiled for that target too).
#define EKKA_WIDE [[gnu::target("avx2,fma"), gnu::flatten]]
/// Tests run both builds of a loop: -1 (the default) leaves the choice to
/// the CPU, 0 forces the baseline, 1 the clone where the CPU has it.
inline int &wideOverride() {
  static int Override = -1;
  return Override;
}
/// For a test's lifetime, one build of the loops (0 the baseline, 1 the
/// clone): a parameterized test holds one, with its parameter.
struct ScopedWideOverride {
  explicit ScopedWideOverride(int Build) { wideOverride() = Build; }
  ~ScopedWideOverride() { wideOverride() = -1; }
  ScopedWideOverride(const ScopedWideOverride &) = delete;
  ScopedWideOverride &operator=(const ScopedWideOverride &) = delete;
};
/// Whether the clones run here.
inline bool wideLanes() {
  static const bool Has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return wideOverride() < 0 ? Has : wideOverride() && Has;
}
#endif

} // namespace lanes
} // namespace ekka

#endif
