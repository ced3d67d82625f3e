#define SHARED from_source
#include "shared.cuh"
