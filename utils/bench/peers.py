"""The peers the benchmarks in utils/bench/ measure themselves against, in
the same run: copy rates of this machine."""
import time

import numpy


def memcpy_gbps(nbytes=256 << 20, repeats=5):
    """The best of a few copies of \\p nbytes in memory, in GB/s."""
    src = numpy.ones(nbytes, dtype=numpy.uint8)
    dst = numpy.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        numpy.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9
