"""The float8 and float4 types of quantized inference, every byte as each:
what awkward.py smallfloats returns from a module, and (run as a script on
its trace) a check of what the trace recorded against what the program
computed. The values come from torch's own conversions, and for fp4, which
torch cannot convert, from the e2m1 format's definition: not from Ekka.
EKKA_SMALLFLOATS_DEVICE puts the program's tensors on another device
(utils/gpu-check: cuda); `--stats-only` checks a trace that captured
nothing (its statistics computed where the tensors are)."""
import math
import os
import sqlite3
import sys

import torch

TYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
         torch.float8_e5m2fnuz, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2]
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def codes(dtype, device=None):
    device = device or os.environ.get("EKKA_SMALLFLOATS_DEVICE", "cpu")
    return torch.arange(256, dtype=torch.int32, device=device).to(torch.uint8) \
        .reshape(16, 16).view(dtype)


def values(t):
    """The tensor's values in memory order of a contiguous copy."""
    t = t.contiguous()
    if t.dtype != torch.float4_e2m1fn_x2:
        return t.to(torch.float64).flatten().tolist()
    out = []
    for byte in t.view(torch.uint8).flatten().tolist():
        for nibble in (byte & 15, byte >> 4):  # the first in the low bits
            v = E2M1[nibble & 7]
            out.append(-v if nibble & 8 else v)
    return out


def total(xs):
    """Their sum, exactly where every one is finite."""
    xs = list(xs)
    return math.fsum(xs) if all(map(math.isfinite, xs)) else sum(xs)


def same(recorded, want):
    if recorded is None:  # a NaN statistic is NULL
        return math.isnan(want)
    return recorded == want or abs(recorded - want) <= 1e-12 * abs(want)


def main(trace, stats_only=False):
    from safetensors.torch import load_file
    expected = [codes(t, "cpu") for t in TYPES] + [codes(torch.float4_e2m1fn_x2, "cpu").t()]
    db = sqlite3.connect(trace + "/trace.db")
    rows = db.execute(
        "SELECT t.idx, t.dtype, t.shape, t.sum, t.sumsq, t.min, t.max, t.nan_count, "
        "t.inf_count, t.shard, t.key FROM tensors t WHERE t.owner = 'module_call' "
        "AND t.role = 'output' ORDER BY t.idx").fetchall()
    assert len(rows) == len(expected), rows
    for (idx, dtype, shape, s, sq, lo, hi, nans, infs, shard, key), t in zip(rows, expected):
        v = values(t)
        finite = [x for x in v if not math.isnan(x)]
        problems = []
        if not same(s, total(v)) or not same(sq, total(x * x for x in v)):
            problems.append(f"sums {s} {sq}")
        if lo != min(finite) or hi != max(finite):
            problems.append(f"min/max {lo} {hi}")
        if nans != sum(map(math.isnan, v)) or infs != sum(map(math.isinf, v)):
            problems.append(f"counts {nans} {infs}")
        got = load_file(trace + "/" + shard)[key] if shard else None
        if stats_only:
            if got is not None:
                problems.append("captured")
        elif got is None or got.dtype != t.dtype or got.shape != t.shape or \
                not torch.equal(got.view(torch.uint8), t.contiguous().view(torch.uint8)):
            problems.append("captured bytes differ")
        print(idx, dtype, shape, len(v), "; ".join(problems) or "ok")


if __name__ == "__main__":
    main(sys.argv[1], "--stats-only" in sys.argv[2:])
