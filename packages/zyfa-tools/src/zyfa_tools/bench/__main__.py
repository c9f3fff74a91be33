"""Benchmark ZYFA's causal forward attention against the peers installed on this machine.

    python -m zyfa_tools.bench --out results/           # the whole protocol (tens of minutes on an H200)
    python -m zyfa_tools.bench --quick --out results/   # S = 2K and 8K, fewer calls: a check in about a minute
    python -m zyfa_tools.bench --sustained --out results/   # sustained clocks, activation-like inputs, S = 8K, MHA
    python -m zyfa_tools.bench --device cpu --out /tmp/b    # dry run of the whole pipeline on the reference path

The protocol (docs/design.md): causal MHA and GQA 4:1, batch 1, S = 2K..32K with max(32, 262144/S) query heads,
Gaussian inputs with std 0.1, BF16 and FP8, d_qk/d_v = 128/128 and 192/128; throughput = B H S^2 (d_qk + d_v) /
time; per measurement the mean of 100 calls after 500 warm-up calls, 3 rounds with the order of the contenders
rotated (the median is reported), 5 s idle before S >= 16K. Two times per call are reported: kernel-only device
time (a CUDA graph of the calls; torch.profiler's kernel times where a call cannot be captured) and eager time
(events around back-to-back calls, launches included). --sustained: per contender 2 s idle, 1 s of back-to-back
calls, >= 3 s timed, median of 3 repetitions, on activation-like inputs (zyfa_tools.inputs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from . import contenders, protocol, report
from .protocol import Sustained
from .runner import Options, run

EPILOG = """\
Contenders: zyfa (the configurations of zyfa_kernels.manifest for this GPU's target, the call without p_mode, and
zyfa-<p_mode> for every other p_mode the manifest serves; the reference path on the CPU; on sm90a also
zyfa-<kernel>, each shipped kernel the call does not dispatch to at this S (named by what follows the head dims
in its name), and the kernel variants of --variants, each launched directly) and, where installed,
fa3 (flash_attn_interface or fa3_fwd_interface; FP8 descales of shape (batch, heads_k)), cudnn-fp8
(nvidia-cudnn-frontend's sdpa_fp8 graph, FP8 output), sdpa-cudnn / sdpa-flash / sdpa-efficient (torch SDPA with
one backend, BF16), flashinfer (BF16) and, on ROCm, aiter. Every contender gets the same inputs (FP8:
zyfa.fp8_quantize, one power-of-two descale per tensor) and its error against float64 is reported beside its speed.
What cannot run is listed under "Not measured" with the reason (not installed, no kernel in the manifest, a dtype
or shape the peer declines, the peer's own error message).

Output: the table on stdout; under --out: bench.json (every measurement, every run, versions, GPU, clocks and power
limit from nvidia-smi), bench.csv, bench.md, throughput.png (TFLOP/s against S per configuration) and
error_vs_speed.png. The files are rewritten after every configuration, so a run cut short keeps what it measured.
Progress goes to stderr.

On the CPU (--device cpu) the defaults shrink to S = 128 and 256, 4 query heads, 2 calls after 1 warm-up call and
no idle time: a dry run of the pipeline, not a measurement."""

QUICK = {"seqlens": [2048, 8192], "calls": 20, "warmup": 20, "idle": 1.0}
CPU = {"seqlens": [128, 256], "heads": 4, "calls": 2, "warmup": 1, "idle": 0.0, "settle": 0.0}


def parse(argv=None) -> tuple[argparse.Namespace, Options]:
    ap = argparse.ArgumentParser(prog="python -m zyfa_tools.bench", description=__doc__.split("\n\n", 2)[2],
                                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for the results (created)")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                    help="auto: the GPU if torch sees one, else the CPU dry run")
    ap.add_argument("--quick", action="store_true",
                    help=f"S = {QUICK['seqlens']}, {QUICK['calls']} calls after {QUICK['warmup']} warm-up calls, "
                         f"{QUICK['idle']} s idle; with --sustained a tenth of its durations, one repetition")
    ap.add_argument("--sustained", action="store_true",
                    help="the sustained-clock mode (default S = 8192, MHA, activation-like inputs)")
    ap.add_argument("--dtypes", nargs="+", default=list(protocol.DTYPES), choices=list(protocol.DTYPES))
    ap.add_argument("--head-dims", nargs="+", type=int, default=[128, 192], choices=(128, 192),
                    help="d_qk values (d_v is 128)")
    ap.add_argument("--seqlens", nargs="+", type=int, help=f"default {list(protocol.SEQLENS)}")
    ap.add_argument("--kinds", nargs="+", choices=("MHA", "GQA"), help="default both (--sustained: MHA)")
    ap.add_argument("--heads", type=int, help="query heads of every configuration (default max(32, 262144/S))")
    ap.add_argument("--calls", type=int, help=f"timed calls per measurement (default {protocol.CALLS})")
    ap.add_argument("--warmup", type=int, help=f"warm-up calls before them (default {protocol.WARMUP})")
    ap.add_argument("--rounds", type=int, default=protocol.ROUNDS, help="rounds, the contenders' order rotated")
    ap.add_argument("--idle", type=float, help=f"seconds idle before S >= {protocol.LONG_SEQLEN} "
                                               f"(default {protocol.IDLE_BEFORE_LONG_S})")
    ap.add_argument("--settle", type=float,
                    help=f"seconds of the contenders' calls back to back, untimed, before a configuration's first "
                         f"round (default {protocol.SETTLE_S}): the first calls after a pause run at a higher clock")
    ap.add_argument("--inputs", choices=("gaussian", "activation"),
                    help="gaussian (std 0.1, the default) or activation-like (the default with --sustained)")
    ap.add_argument("--contenders", nargs="+", metavar="NAME", default=[],
                    help="only these (zyfa, fa3, cudnn-fp8, sdpa-cudnn, sdpa-flash, sdpa-efficient, flashinfer, "
                         "aiter, sdpa-math on the CPU)")
    ap.add_argument("--error-heads", type=int, default=4, help="query heads of the float64 error measurement")
    ap.add_argument("--error-max-seqlen", type=int, default=8192, help="longest S whose error is measured")
    ap.add_argument("--variants", type=Path, metavar="DIR",
                    help="a folder with the manifest.json of kernel variants (python -m asmgen.sm90a.experiments "
                         "DIR): each is timed, under its name, in the "
                         "configurations of its dtype and head dims (sm90a)")
    ap.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    ap.add_argument("--seed", type=int, default=0, help="seed of the inputs")
    args = ap.parse_args(argv)

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no GPU (torch.cuda.is_available() is False)")
    device = torch.device(args.device)
    defaults = {"seqlens": list(protocol.SEQLENS), "calls": protocol.CALLS, "warmup": protocol.WARMUP,
                "idle": protocol.IDLE_BEFORE_LONG_S, "settle": protocol.SETTLE_S, "heads": None}
    if args.sustained:
        defaults["seqlens"] = [8192]
    if args.quick:
        defaults.update({k: v for k, v in QUICK.items() if not (args.sustained and k == "seqlens")})
    if device.type == "cpu":
        defaults.update(CPU)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("calls", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.idle < 0 or args.settle < 0:
        ap.error("--warmup, --idle and --settle must not be negative")
    unknown = sorted(set(args.contenders) - set(contenders.names(device)))
    if unknown:
        ap.error(f"--contenders {unknown}: not contenders on {device.type}; they are {contenders.names(device)}")
    kinds = args.kinds or (["MHA"] if args.sustained else ["MHA", "GQA"])
    sustained = None
    if args.sustained:
        sustained = Sustained()
        if args.quick or device.type == "cpu":
            sustained = sustained.shortened(10 if device.type == "cuda" else 100)
    dims = [(d, 128) for d in args.head_dims]
    try:
        variants = contenders.load_variants(args.variants) if args.variants else []
    except ValueError as bad:
        ap.error(str(bad))
    opts = Options(
        configs=protocol.configurations(args.dtypes, dims, args.seqlens, args.heads, kinds), device=device,
        out=args.out, calls=args.calls, warmup=args.warmup, rounds=args.rounds, idle_s=args.idle, settle_s=args.settle,
        inputs=args.inputs or ("activation" if args.sustained else "gaussian"), sustained=sustained,
        error_heads=args.error_heads, error_max_seqlen=args.error_max_seqlen, only=args.contenders,
        plots=not args.no_plots, seed=args.seed, variants=variants)
    if not opts.configs:
        ap.error("no configuration: --heads must allow heads_k = heads / 4 for GQA")
    return args, opts


@torch.no_grad()
def main(argv=None) -> int:
    _, opts = parse(argv)
    results = run(opts)
    print("\n".join(report.header(results)))
    print()
    print(report.table(results))
    plots = sorted(p.name for p in opts.out.glob("*.png")) if opts.plots else []
    if opts.plots and not plots:
        plots = ["no plots: matplotlib is not installed"]
    print(f"\nwrote {opts.out}/: bench.json, bench.csv, bench.md, {', '.join(plots) or 'no plots (--no-plots)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
