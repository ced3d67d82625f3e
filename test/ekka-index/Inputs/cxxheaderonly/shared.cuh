#pragma once
#ifndef SHARED
#define SHARED from_header
#endif
// A source includes this header too: its record counts before any header's.
__global__ void SHARED(float* p) {}
