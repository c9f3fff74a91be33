"""Accuracy of attention numerics: error against float64 attention on the same quantized inputs.

    python -m zyfa_tools.accuracy                      # the tables of docs/accuracy.md (tens of minutes on 2 cores)
    python -m zyfa_tools.accuracy --quick              # tiny shapes, seconds: checks the harness works
    python -m zyfa_tools.accuracy --json out.json --plot out.png

Each case draws float32 inputs (Gaussian or activation-like, see zyfa_tools.inputs), rounds them once to BF16
and once to FP8 (one descale per (batch, kv head)), and runs every configuration (zyfa.numerics with the options
below) against zyfa_tools.reference.attention_fp64 on exactly the inputs the configuration received. Reported
per case and configuration: the relative RMS error of the output, ||out - ref|| / ||ref|| over the whole output,
and the largest lse error |lse - lse_ref| in nats (beside the contract's bound, numerics.lse_error_bound).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from dataclasses import asdict, dataclass

import torch

from zyfa import numerics

from . import inputs
from .reference import attention_fp64, relative_rms_error

FP8 = torch.float8_e4m3fn

# Kinds of inputs: Gaussian ones (std 0.1 as in kernel benchmarks, std 1) and activation-like ones whose sink lies
# 8, 12 or 20 binades above the tail (20 puts tail keys beyond the 17 binades an unscaled, offset P can hold).
INPUTS = {
    "gauss0.1": functools.partial(inputs.gaussian, std=0.1),
    "gauss1": functools.partial(inputs.gaussian, std=1.0),
    "sink8": functools.partial(inputs.activation_like, sink_binades=8.0),
    "sink12": functools.partial(inputs.activation_like, sink_binades=12.0),
    "sink20": functools.partial(inputs.activation_like, sink_binades=20.0),
}
DEFAULT_NAME, PEER_NAME = "exact", "fa3-like"  # the ratio the FP8 contract's accuracy criteria are about


@dataclass(frozen=True)
class Variant:
    """One configuration of zyfa.numerics.attention (None: the contract's default)."""

    name: str
    dtype: torch.dtype
    p_mode: str
    block_scale: bool | None = None
    rowsum: str | None = None
    p_shift: int | None = None
    rescale_threshold: float | None = None
    note: str = ""

    def config(self, d_qk: int) -> numerics.Config:
        return numerics.resolve_config(self.dtype, d_qk, p_mode=self.p_mode, block_scale=self.block_scale,
                                       rowsum=self.rowsum, p_shift=self.p_shift,
                                       rescale_threshold=self.rescale_threshold)

    def run(self, q, k, v, descales):
        return numerics.attention(q, k, v, config=self.config(q.shape[-1]), return_lse=True, **descales)


VARIANTS = (
    Variant("bf16", torch.bfloat16, "bf16", note="the BF16 contract"),
    Variant("exact", FP8, "exact", note="the FP8 contract's default: exact P, +8, per-block scaling, rounded row sum"),
    Variant("lean", FP8, "lean", note="the contract with lean P (the gfx950 d=128 kernel's choice)"),
    Variant("exact fp32sum", FP8, "exact", rowsum="fp32", note="the default with FP32 row sum (isolates the sum)"),
    Variant("exact noblk", FP8, "exact", block_scale=False,
            note="the default without per-block scaling: what block scaling still buys once P is offset"),
    Variant("fa3-like", FP8, "exact", block_scale=False, rowsum="fp32", rescale_threshold=0.0,
            note="FA3's FP8: P = e4m3(2^(x - m + 8)), no block scaling, FP32 row sum, rescale at every tile"),
    Variant("aiter-like", FP8, "exact", block_scale=False, rowsum="fp32", p_shift=0,
            note="AITER's FP8: P = e4m3(2^(x - m)), no offset, no block scaling, FP32 row sum"),
)
COMPARISONS = (  # label, numerator, denominator
    ("default / FA3-like", DEFAULT_NAME, PEER_NAME),
    ("lean / FA3-like", "lean", PEER_NAME),
    ("lean / exact", "lean", "exact"),
    ("exact: no block scaling / block scaling", "exact noblk", "exact"),
    ("exact: fp32 row sum / rounded row sum", "exact fp32sum", "exact"),
    ("AITER-like / default", "aiter-like", DEFAULT_NAME),
)


@dataclass(frozen=True)
class Case:
    inputs: str
    seqlen: int
    d_qk: int
    d_v: int
    heads: int
    heads_k: int

    @property
    def label(self) -> str:
        return f"{self.inputs} S={self.seqlen} d={self.d_qk}/{self.d_v} h={self.heads}/{self.heads_k}"


# The default table: S = 4096 with 4 query heads on one kv head (GQA), S = 16384 with one head, d = 128.
DEFAULT_SHAPES = ((4096, 4, 1), (16384, 1, 1))


def cases(kinds, shapes, dims) -> list[Case]:
    """Every combination of input kind, (seqlen, heads, heads_k) shape and d_qk (d_v is 128)."""
    return [Case(kind, s, d, 128, h, hk) for kind in kinds for s, h, hk in shapes for d in dims]


class Progress:
    """A progress bar on stderr (one line per step where stderr is not a terminal)."""

    def __init__(self, total: int, stream=None):
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.stream = sys.stderr if stream is None else stream
        self.tty = self.stream.isatty()

    def step(self, what: str) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        bar = "#" * (20 * self.done // self.total)
        line = (f"[{bar:20s}] {self.done}/{self.total} {what} ({elapsed / 60:.1f} min, "
                f"{eta / 60:.1f} min left)")
        self.stream.write(f"\r{line:110s}" if self.tty else line + "\n")
        if self.tty and self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def steps(case_count: int, variants) -> int:
    """Progress steps of a run: one per configuration and one per float64 reference."""
    return case_count * (len(variants) + len({v.dtype for v in variants}))


def evaluate(case: Case, variants=VARIANTS, seed: int = 0, progress: Progress | None = None) -> dict:
    """Errors of every configuration on one case, plus the case's block statistics (on the float inputs)."""
    q, k, v = INPUTS[case.inputs](1, case.seqlen, case.heads, case.heads_k, case.d_qk, case.d_v, seed=seed)
    result = {"case": asdict(case), **inputs.block_statistics(q, k), "errors": {}, "lse_errors": {}}
    quantized = {}
    for variant in variants:
        if variant.dtype not in quantized:
            q_, k_, v_, descales = inputs.quantize(q, k, v, variant.dtype)
            quantized[variant.dtype] = (q_, k_, v_, descales, attention_fp64(q_, k_, v_, return_lse=True, **descales))
            if progress:
                progress.step(f"{case.label}: float64 reference ({variant.dtype})")
        q_, k_, v_, descales, (ref, ref_lse) = quantized[variant.dtype]
        out, lse = variant.run(q_, k_, v_, descales)
        result["errors"][variant.name] = relative_rms_error(out, ref)
        result["lse_errors"][variant.name] = (lse.double() - ref_lse).abs().max().item()
        if progress:
            progress.step(f"{case.label}: {variant.name}")
    return result


def _geomean(values) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def summary(results: list[dict]) -> list[str]:
    """Error ratios per kind of input (geometric mean and range over the cases): what each choice costs or saves."""
    lines = []
    for kind in [k for k in INPUTS if any(r["case"]["inputs"] == k for r in results)]:
        rows = [r["errors"] for r in results if r["case"]["inputs"] == kind]
        for label, a, b in COMPARISONS:
            if a in rows[0] and b in rows[0]:
                ratios = [row[a] / row[b] for row in rows]
                lines.append(f"{kind:9s} {label:42s} {_geomean(ratios):6.3f}x  "
                             f"(range {min(ratios):.3f}-{max(ratios):.3f})")
    return lines


def criteria(results: list[dict]) -> list[str]:
    """The FP8 contract's accuracy criteria against FA3-like numerics, case by case: PASS or FAIL with the ratio."""
    lines = []
    for r in results:
        errors = r["errors"]
        if DEFAULT_NAME not in errors or PEER_NAME not in errors:
            continue
        ratio = errors[DEFAULT_NAME] / errors[PEER_NAME]
        gaussian = r["case"]["inputs"].startswith("gauss")
        limit, rule = (1.0, "below FA3-like") if gaussian else (1.10, "within 1.10x of FA3-like")
        ok = ratio < limit if gaussian else ratio <= limit
        lines.append(f"{'PASS' if ok else 'FAIL'} {Case(**r['case']).label}: default / FA3-like = {ratio:.3f} "
                     f"(must be {rule})")
    return lines


def table(results: list[dict], variants=VARIANTS, key: str = "errors", fmt: str = "{:.2e}") -> str:
    """A markdown table: one row per case, one column per configuration, plus the block statistics."""
    names = [v.name for v in variants]
    head = ["inputs", "S", "d", "heads", "far blocks", "far mass", *names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        c = r["case"]
        cells = [c["inputs"], str(c["seqlen"]), f"{c['d_qk']}/{c['d_v']}", f"{c['heads']}/{c['heads_k']}",
                 f"{r['far_block_fraction']:.0%}", f"{r['far_block_mass']:.0%}",
                 *(fmt.format(r[key][n]) for n in names)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lse_bounds(variants=VARIANTS, d_qk: int = 128) -> dict[str, float | None]:
    """The contract's lse bound (nats) of every configuration; None where it promises none."""
    return {v.name: numerics.lse_error_bound(v.config(d_qk)) for v in variants}


def lse_lines(results: list[dict], variants=VARIANTS) -> list[str]:
    """Per configuration: the largest lse error over the cases beside its bound."""
    lines = []
    for name, bound in lse_bounds(variants).items():
        worst = max(r["lse_errors"][name] for r in results)
        verdict = "no bound" if bound is None else f"bound {bound:.4f}: {'holds' if worst <= bound else 'EXCEEDED'}"
        lines.append(f"{name:14s} max |lse error| {worst:.4f} nats  ({verdict})")
    return lines


def legend(variants=VARIANTS) -> str:
    lines = ["Columns: one per configuration; far blocks / far mass: share of (row, 64-key block) pairs more than 8",
             "binades below the row maximum, and their probability mass. '+8': P is written 2^8 larger before the",
             "FP8 rounding (p_shift 8)."]
    lines += [f"- {v.name}: {v.note}" for v in variants if v.note]
    return "\n".join(lines)


def plot(results: list[dict], path: str, variants=VARIANTS) -> None:
    """Grouped bars (log scale): output error and largest lse error, one group per case, one bar per config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(14, 9), squeeze=False)
    width = 0.8 / len(variants)
    colors = plt.get_cmap("tab10").colors
    labels = [Case(**r["case"]).label.replace(" d=", "\nd=") for r in results]
    panels = (("errors", "relative RMS error of the output"), ("lse_errors", "largest lse error (nats)"))
    for ax, (key, ylabel) in zip(axes[:, 0], panels, strict=True):
        for i, variant in enumerate(variants):
            xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(results))]
            ax.bar(xs, [max(r[key][variant.name], 1e-7) for r in results], width, label=variant.name,
                   color=colors[i % len(colors)])
        ax.set_xticks(range(len(results)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0, 0].set_title("ZYFA numerics vs float64 on the same quantized inputs (lower is better)")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="lower center", ncol=len(variants), fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)


def _shape(text: str) -> tuple[int, int, int]:
    try:
        seqlen, heads, heads_k = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is SEQLEN:HEADS:HEADS_K, got {text!r}") from None
    if min(seqlen, heads, heads_k) < 1 or heads % heads_k:
        raise argparse.ArgumentTypeError(f"shape {text!r}: sizes must be >= 1 and HEADS_K must divide HEADS")
    return seqlen, heads, heads_k


@torch.no_grad()
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zyfa_tools.accuracy",
        description=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=legend() + "\n\nProgress goes to stderr; the tables, the accuracy criteria and the ratios to stdout.",
    )
    parser.add_argument("--shapes", type=_shape, nargs="+", default=list(DEFAULT_SHAPES), metavar="S:H:HK",
                        help="sequence length, query heads and kv heads of each case (batch 1; default: "
                        + " ".join(f"{s}:{h}:{hk}" for s, h, hk in DEFAULT_SHAPES) + ")")
    parser.add_argument("--dims", type=int, nargs="+", default=[128], help="d_qk values (d_v is 128)")
    parser.add_argument("--inputs", nargs="+", default=list(INPUTS), choices=list(INPUTS),
                        help="kinds of inputs (see the module docstring and zyfa_tools.inputs)")
    parser.add_argument("--variants", nargs="+", choices=[v.name for v in VARIANTS], metavar="NAME",
                        help="only these configurations (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the input generators")
    parser.add_argument("--quick", action="store_true", help="S=256 with 2/1 heads: a smoke run in seconds")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice; on a busy "
                        "machine 1 avoids threads waiting on each other)")
    parser.add_argument("--json", metavar="PATH", help="also write every result as JSON")
    parser.add_argument("--plot", metavar="PATH", help="also draw the errors as a PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.quick:
        args.shapes = [(256, 2, 1)]
    variants = [v for v in VARIANTS if not args.variants or v.name in args.variants]
    if args.threads:
        torch.set_num_threads(args.threads)

    todo = cases(args.inputs, args.shapes, args.dims)
    progress = Progress(steps(len(todo), variants))
    start = time.perf_counter()
    results = [evaluate(case, variants, seed=args.seed, progress=progress) for case in todo]
    minutes = (time.perf_counter() - start) / 60

    print("Relative RMS error of the output:\n")
    print(table(results, variants))
    print("\nLargest lse error (nats):\n")
    print(table(results, variants, "lse_errors", "{:.4f}"))
    print()
    print(legend(variants))
    print("\nThe contract's lse bounds against the largest lse error over the cases:")
    print("\n".join(lse_lines(results, variants)))
    print("\nAccuracy criteria of the FP8 contract (default = exact):")
    print("\n".join(criteria(results)) or "(needs the exact and fa3-like configurations)")
    print("\nError ratios, geometric mean over the cases of each kind of input:")
    print("\n".join(summary(results)))
    print(f"\n{len(todo)} cases in {minutes:.1f} min, torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["python -m zyfa_tools.accuracy", *(argv or sys.argv[1:])]),
                       "torch": torch.__version__, "minutes": round(minutes, 2),
                       "variants": [{**asdict(v), "dtype": str(v.dtype)} for v in variants],
                       "lse_bounds": lse_bounds(variants), "results": results}, f, indent=1)
    if args.plot:
        plot(results, args.plot, variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
