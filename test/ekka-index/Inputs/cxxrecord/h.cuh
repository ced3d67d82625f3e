#pragma once
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
// What this kernel is called depends on the unit that includes it.
__global__ void CAT(PREFIX, _kernel)(float* p) {}
