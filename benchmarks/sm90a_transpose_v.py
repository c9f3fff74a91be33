"""The sm90a FP8 V^T pre-pass on an H100/H200: bitwise against transposed_v_reference, and its copy rate.

For each shape (batch, seqlen, heads_k; d_v = 128) and layout (bshd, bhsd, and a V sliced from a packed kv tensor),
zyfa.backends.sm90a.transposed_v (one launch of the manifest's transpose_v kernel) must equal the torch reference
bit for bit. Its rate is (bytes read + bytes written) / kernel time, from CUDA events around `--iters` back-to-back
launches, beside the reference's (pad, permute, copy) and a plain device copy of V (torch's clone) as the copy
rate to compare with.

    python -m benchmarks.sm90a_transpose_v --out results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

SHAPES = ((1, 1000, 8), (2, 4096, 8), (1, 32768, 8), (4, 4097, 2), (1, 1, 1), (16, 8192, 8))
LAYOUTS = ("bshd", "bhsd", "packed-kv")


def make_v(batch, seqlen, heads_k, layout, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    codes = torch.randint(0, 256, (batch, seqlen, 2, heads_k, 128), generator=g, device="cuda", dtype=torch.uint8)
    fp8 = codes.view(torch.float8_e4m3fn)
    if layout == "packed-kv":
        return fp8[:, :, 1], "bshd"  # a strided view: V of a (b, s, 2, h, d) kv tensor
    v = fp8[:, :, 1].contiguous()
    return (v, "bshd") if layout == "bshd" else (v.transpose(1, 2).contiguous(), "bhsd")


def kernel_ms(fn, iters):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    from zyfa.backends import sm90a

    rows, failures = [], 0
    for batch, seqlen, heads_k in SHAPES:
        for layout in LAYOUTS:
            v, given = make_v(batch, seqlen, heads_k, layout, seed=seqlen + heads_k)
            got = sm90a.transposed_v(v, given)
            expected = sm90a.transposed_v_reference(v, given)
            equal = bool(torch.equal(got.view(torch.uint8), expected.view(torch.uint8)))
            failures += not equal
            moved = v.numel() + got.numel()  # one byte per element
            ms = kernel_ms(lambda v=v, given=given: sm90a.transposed_v(v, given), args.iters)
            ref_ms = kernel_ms(lambda v=v, given=given: sm90a.transposed_v_reference(v, given), args.iters)
            copy_ms = kernel_ms(v.clone, args.iters)
            row = {"batch": batch, "seqlen": seqlen, "heads_k": heads_k, "layout": layout, "bitwise_equal": equal,
                   "bytes": moved, "ms": ms, "gb_per_s": moved / ms / 1e6, "reference_ms": ref_ms,
                   "reference_gb_per_s": moved / ref_ms / 1e6, "clone_gb_per_s": 2 * v.numel() / copy_ms / 1e6}
            rows.append(row)
            print(f"b={batch} s={seqlen} hk={heads_k} {layout:9}: equal {equal:d}  {row['gb_per_s']:7.0f} GB/s "
                  f"({ms * 1e3:8.1f} us; reference {row['reference_gb_per_s']:6.0f} GB/s, clone "
                  f"{row['clone_gb_per_s']:6.0f} GB/s)", file=sys.stderr)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows, "failures": failures}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    print(f"{len(rows) - failures}/{len(rows)} bitwise equal")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
