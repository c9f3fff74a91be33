"""The launches `ci/gpu.sh profile` records with Nsight Compute: ZYFA's BF16 kernel at a short and a long sequence
length, and cuDNN's SDPA at the long one, one call each on the benchmark's inputs (Gaussian, std 0.1, causal,
batch 1, max(32, 262144/S) heads). Not a benchmark: ncu replays each kernel to read the counters.

    ncu [options] python ci/profile_sm90a.py [--seqlens 2048 16384] [--d-qk 128] [--cudnn-seqlen 16384]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

import zyfa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from sm90a_bf16 import heads_for, make_inputs, sdpa  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 16384])
    ap.add_argument("--d-qk", type=int, default=128)
    ap.add_argument("--cudnn-seqlen", type=int, default=16384)
    args = ap.parse_args()
    for seqlen in args.seqlens:
        q, k, v = make_inputs(seqlen, heads_for(seqlen), heads_for(seqlen), args.d_qk, 128)
        zyfa.flash_attn_func(q, k, v, causal=True, layout="bhsd")
        torch.cuda.synchronize()
        if seqlen == args.cudnn_seqlen:
            sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v)
            torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
