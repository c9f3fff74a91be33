"""The launches `ci/gpu.sh profile` records with Nsight Compute: ZYFA's BF16 kernel at a short and a long sequence
length, and cuDNN's SDPA at the long one, one call each on the benchmark's inputs (zyfa_tools.bench.protocol:
Gaussian, std 0.1, causal, batch 1, max(32, 262144/S) heads, (batch, seqlen, heads, dim)). Not a benchmark: ncu
replays each kernel to read the counters.

    ncu [options] python -m ci.profile_sm90a [--seqlens 2048 16384] [--d-qk 128] [--cudnn-seqlen 16384]
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import zyfa
from zyfa_tools.bench.protocol import Config, heads_for, make_inputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 16384])
    ap.add_argument("--d-qk", type=int, default=128)
    ap.add_argument("--cudnn-seqlen", type=int, default=16384)
    args = ap.parse_args()
    for seqlen in args.seqlens:
        heads = heads_for(seqlen)
        x = make_inputs(Config("bf16", args.d_qk, 128, seqlen, heads, heads), torch.device("cuda"))
        zyfa.flash_attn_func(x.q, x.k, x.v, causal=True)
        torch.cuda.synchronize()
        if seqlen == args.cudnn_seqlen:
            q, k, v = (t.transpose(1, 2) for t in (x.q, x.k, x.v))  # SDPA's (batch, heads, seqlen, dim) views
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
