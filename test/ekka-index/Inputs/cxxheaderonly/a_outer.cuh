// No source includes this header or inner.cuh: inner.cuh is recorded by the
// first header unit (by path) that includes it, as this one sees it. The
// standard headers make this unit slow, so that inner.cuh's own unit would
// finish first on another thread.
#include <complex>
#include <filesystem>
#include <future>
#include <random>
#include <regex>
#include <valarray>
#define PREFIX outer
#include "inner.cuh"
#include "shared.cuh"
