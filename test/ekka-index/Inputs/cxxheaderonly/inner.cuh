#pragma once
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#ifndef PREFIX
#define PREFIX own
#endif
// What this kernel is called depends on the unit that records the header.
__global__ void CAT(PREFIX, _kernel)(float* p) {}
