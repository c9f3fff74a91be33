"""The launches `ci/gpu.sh profile` records with Nsight Compute: one call of each contender of the benchmark
(zyfa_tools.bench: ZYFA through the public call and, launched directly, its kernels of the other consumer schedule,
FA3, cuDNN) per configuration, on the benchmark's inputs (Gaussian, std 0.1, causal, batch 1, max(32, 262144/S)
heads). Not a benchmark: ncu replays each kernel to read the counters; profile ours beside a peer's kernel to see
where the two spend their cycles.

    ncu [options] python -m ci.profile_sm90a [--dtypes bf16 fp8] [--seqlens 2048 8192] [--d-qk 128]
        [--contenders zyfa fa3 sdpa-cudnn cudnn-fp8] [--variants DIR]

--variants DIR adds the kernel variants of DIR's manifest.json (python -m asmgen.sm90a.experiments DIR) as
contenders of their own, as the benchmark's --variants does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from zyfa_tools.bench.contenders import load_variants, prepare_all
from zyfa_tools.bench.protocol import Config, heads_for, make_inputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", choices=("bf16", "fp8"), default=["bf16"])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 16384])
    ap.add_argument("--d-qk", type=int, default=128)
    ap.add_argument("--contenders", nargs="+", default=["zyfa", "sdpa-cudnn"],
                    help="benchmark contender names (python -m zyfa_tools.bench --help); ZYFA's kernels of the "
                         "other schedule come with zyfa")
    ap.add_argument("--variants", type=Path, metavar="DIR", help="a folder with the manifest.json of kernel variants")
    args = ap.parse_args()
    try:
        variants = load_variants(args.variants) if args.variants else []
    except ValueError as bad:
        ap.error(str(bad))
    device = torch.device("cuda")
    for dtype in args.dtypes:
        for seqlen in args.seqlens:
            heads = heads_for(seqlen)
            config = Config(dtype, args.d_qk, 128, seqlen, heads, heads)
            ready, skipped = prepare_all(config, make_inputs(config, device), device, only=args.contenders,
                                         variants=variants)
            torch.cuda.synchronize()
            for contender in ready:  # prepare_all made each one's first call: the launch ncu records
                print(f"{dtype} S={seqlen}: {contender.name} ({contender.note})", file=sys.stderr)
            for skip in skipped:
                print(f"{dtype} S={seqlen}: {skip.name} skipped: {skip.reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
