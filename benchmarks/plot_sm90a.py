"""Chart of sm90a benchmark runs: ZYFA's throughput relative to a peer's per sequence length (kernel-only), one panel
per head-dim configuration, MHA and GQA, one line per run (each run's ratios come from that run alone), with a target.

    python -m benchmarks.plot_sm90a RUN.json [RUN.json ...] --out docs/sm90a-ratios.png [--label NAME ...]
        [--dtype bf16|fp8] [--peer sdpa-cudnn|fa3|cudnn-fp8 ...] [--target 1.10]

RUN.json is what `python -m zyfa_tools.bench` writes (bench.json: rows of the contenders "zyfa", the public call as
dispatched in that run, and the peer), or, for BF16 against cuDNN only, a run of the earlier sm90a BF16 script
(bench_sm90a.json, whose rows hold every contender's TFLOP/s under "tflops", cuDNN's as "cudnn": the curated runs of
2026-11-29).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TARGET = 1.10  # over cuDNN BF16
HEAD_DIMS = ((128, 128), (192, 128))
PEER_NAMES = {"sdpa-cudnn": "cuDNN BF16", "fa3": "FA3", "cudnn-fp8": "cuDNN FP8"}


def ratios(report: dict, d_qk: int, d_v: int, gqa: bool, dtype: str = "bf16",
           peer: str = "sdpa-cudnn") -> list[tuple[int, float]]:
    """(seqlen, ours / peer) of one run for one configuration, in order of seqlen."""
    if report["rows"] and "contender" in report["rows"][0]:
        return _bench_ratios(report["rows"], d_qk, d_v, gqa, dtype, peer)
    if (dtype, peer) != ("bf16", "sdpa-cudnn"):
        raise ValueError("the earlier bench_sm90a.json format holds BF16 against cuDNN only")
    out = []
    for row in report["rows"]:
        if (row["d_qk"], row["d_v"]) != (d_qk, d_v) or (row["heads_k"] != row["heads"]) != gqa:
            continue
        t = row["tflops"]
        if "zyfa" in t and t.get("cudnn"):
            out.append((row["seqlen"], t["zyfa"] / t["cudnn"]))
    return sorted(out)


def _bench_ratios(rows: list[dict], d_qk: int, d_v: int, gqa: bool, dtype: str,
                  peer: str) -> list[tuple[int, float]]:
    """ratios() of zyfa_tools.bench's rows: one row per contender and configuration."""
    tflops: dict = {}
    for row in rows:
        if row["dtype"] == dtype and (row["d_qk"], row["d_v"]) == (d_qk, d_v) and \
                (row["heads_k"] != row["heads"]) == gqa:
            tflops.setdefault((row["seqlen"], row["heads"], row["heads_k"]), {})[row["contender"]] = row["tflops"]
    return sorted((key[0], t["zyfa"] / t[peer]) for key, t in tflops.items() if t.get("zyfa") and t.get(peer))


def device_name(report: dict) -> str:
    machine = report.get("machine")
    return machine.get("gpu", {}).get("name", machine["device"]) if machine else report["device"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="bench.json (or bench_sm90a.json) files")
    ap.add_argument("--out", required=True, help="image to write (.png)")
    ap.add_argument("--label", nargs="+", help="one name per run (default: the file names)")
    ap.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16")
    ap.add_argument("--peer", default="sdpa-cudnn", help="the contender ZYFA is divided by (default: sdpa-cudnn)")
    ap.add_argument("--target", type=float, default=TARGET, help=f"the dotted line (default {TARGET})")
    args = ap.parse_args()
    peer = PEER_NAMES.get(args.peer, args.peer)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = [json.loads(Path(path).read_text()) for path in args.runs]
    labels = args.label or [Path(path).stem for path in args.runs]
    if len(labels) != len(reports):
        ap.error("--label needs one name per run")
    fig, axes = plt.subplots(1, len(HEAD_DIMS), figsize=(11, 4), sharey=True)
    for ax, (d_qk, d_v) in zip(axes, HEAD_DIMS, strict=True):
        for index, (report, label) in enumerate(zip(reports, labels, strict=True)):
            for gqa, style in ((False, "-"), (True, "--")):
                points = ratios(report, d_qk, d_v, gqa, args.dtype, args.peer)
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, style, marker="o", color=f"C{index}",
                            label=f"{label}, {'GQA 4:1' if gqa else 'MHA'}")
        ax.axhline(args.target, color="grey", linewidth=1, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_title(f"d_qk = {d_qk}, d_v = {d_v}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"ZYFA / {peer} throughput (target {args.target:.2f})")
    for ax in axes:  # each panel names its own lines (runs may hold different head dims)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"sm90a {args.dtype.upper()} causal forward, {device_name(reports[0])}: kernel-only ratio to {peer} "
                 "in the same run")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
