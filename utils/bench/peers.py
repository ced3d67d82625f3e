"""The peers the benchmarks in utils/bench/ measure themselves against, in
the same run: copy rates of this machine."""
import time

import numpy


def memcpy_gbps(nbytes=256 << 20, repeats=5):
    """The best of a few copies of `nbytes` in memory, in GB/s."""
    src = numpy.ones(nbytes, dtype=numpy.uint8)
    dst = numpy.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        numpy.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def file_write_gbps(directory, nbytes=512 << 20, chunk=64 << 20):
    """Writing `nbytes` into a new file in `directory`, in chunks of a
    shard's size, as ekka-trace writes its shards (through the page cache,
    no fsync): the rate this file system takes data at, in GB/s."""
    import os
    path = os.path.join(directory, "peer-write.bin")
    block = numpy.ones(chunk, dtype=numpy.uint8).tobytes()
    t = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(max(1, nbytes // chunk)):
            f.write(block)
    elapsed = time.perf_counter() - t
    os.remove(path)
    return max(1, nbytes // chunk) * chunk / elapsed / 1e9
