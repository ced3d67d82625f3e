// Each kernel is named by a macro from a header that the include search
// finds: "defs.h" in include/ (the includer's directory csrc/ has none yet),
// <conf.h> in include/ (the root, searched first, has none yet), "gen.h"
// nowhere yet.
#include "defs.h"
#include <conf.h>
#include "gen.h"
#ifndef C_KERNEL
#define C_KERNEL missing_c
#endif

__global__ void A_KERNEL(float *x) {}
__global__ void B_KERNEL(float *x) {}
__global__ void C_KERNEL(float *x) {}
