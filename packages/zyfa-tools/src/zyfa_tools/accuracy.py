"""Accuracy of attention numerics: relative RMS error against float64 attention on the same quantized inputs.

    python -m zyfa_tools.accuracy                      # the table of docs/accuracy.md (a few minutes on 2 cores)
    python -m zyfa_tools.accuracy --quick              # tiny shapes, seconds: checks the harness works
    python -m zyfa_tools.accuracy --json out.json --plot out.png

Each case draws float32 inputs (Gaussian or activation-like, see zyfa_tools.inputs), rounds them once to BF16
and once to FP8 (one descale per (batch, kv head)), and runs every numerics variant (zyfa.numerics with the
options below) against zyfa_tools.reference.attention_fp64 on exactly the inputs the variant received. The error
of a case is ||out - ref|| / ||ref|| over the whole output.
"""

from __future__ import annotations

import argparse
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
GENERATORS = {"gaussian": inputs.gaussian, "activation": inputs.activation_like}


@dataclass(frozen=True)
class Variant:
    """One set of numerics options of zyfa.numerics.attention (None: the kernels' default)."""

    name: str
    dtype: torch.dtype
    p_mode: str
    block_scale: bool = True
    rowsum: str | None = None
    p_shift: int = 0
    rescale_threshold: float | None = None
    note: str = ""

    def run(self, q, k, v, descales):
        return numerics.attention(q, k, v, p_mode=self.p_mode, block_scale=self.block_scale, rowsum=self.rowsum,
                                  p_shift=self.p_shift, rescale_threshold=self.rescale_threshold, **descales)


def _fp8_grid():
    """FP8 lean and exact P, with and without per-block scaling, with the rounded and the FP32 row sum."""
    for p_mode in ("lean", "exact"):
        for block_scale in (True, False):
            for rowsum in ("rounded", "fp32"):
                name = f"{p_mode}{'' if block_scale else ' noblk'}{'' if rowsum == 'rounded' else ' fp32sum'}"
                yield Variant(name, FP8, p_mode, block_scale, rowsum)


VARIANTS = (
    Variant("bf16", torch.bfloat16, "bf16", note="the BF16 kernels"),
    *_fp8_grid(),
    Variant("fa3-like", FP8, "exact", False, "fp32", p_shift=8, rescale_threshold=0.0,
            note="FA3's FP8: P = e4m3(2^(x - m + 8)), FP32 row sum, rescale every tile"),
    Variant("lean +8", FP8, "lean", p_shift=8, note="proposal: lean codes offset by 8 binades (8y + 120)"),
    Variant("lean +8 fp32sum", FP8, "lean", rowsum="fp32", p_shift=8),
    Variant("exact +8", FP8, "exact", p_shift=8, note="proposal: exact P scaled by 2^8 before rounding"),
    Variant("exact +8 fp32sum", FP8, "exact", rowsum="fp32", p_shift=8),
)
NOTES = {
    "lean": "ZYFA FP8 d=128 (kernel default)",
    "exact": "ZYFA FP8 d_qk=192 (kernel default)",
    "exact noblk fp32sum": "AITER-like FP8: P relative to the row max, FP32 row sum",
}


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
        kind = "MHA" if self.heads == self.heads_k else "GQA"
        return f"{self.inputs} S={self.seqlen} d={self.d_qk}/{self.d_v} {kind} {self.heads}/{self.heads_k}"


def cases(seqlens, dims, inputs_kinds, heads, group):
    """Every combination, as Case records (dims: d_qk values; d_v is 128)."""
    return [Case(kind, s, d, 128, heads, heads_k)
            for kind in inputs_kinds for s in seqlens for d in dims for heads_k in (heads, heads // group)]


def evaluate(case: Case, variants=VARIANTS, seed: int = 0) -> dict:
    """Errors of every variant on one case, plus the case's block statistics (on the float inputs)."""
    q, k, v = GENERATORS[case.inputs](1, case.seqlen, case.heads, case.heads_k, case.d_qk, case.d_v, seed=seed)
    result = {"case": asdict(case), **inputs.block_statistics(q, k), "errors": {}}
    quantized = {}
    for variant in variants:
        if variant.dtype not in quantized:
            q_, k_, v_, descales = inputs.quantize(q, k, v, variant.dtype)
            quantized[variant.dtype] = (q_, k_, v_, descales, attention_fp64(q_, k_, v_, **descales))
        q_, k_, v_, descales, ref = quantized[variant.dtype]
        result["errors"][variant.name] = relative_rms_error(variant.run(q_, k_, v_, descales), ref)
    return result


def summary(results: list[dict]) -> list[str]:
    """Geometric-mean error ratios per kind of input: what each numerics choice costs or saves."""
    comparisons = [
        ("lean / exact (block scaling, rounded sum)", "lean", "exact"),
        ("lean: no block scaling / block scaling", "lean noblk", "lean"),
        ("exact: no block scaling / block scaling", "exact noblk", "exact"),
        ("lean: fp32 row sum / rounded row sum", "lean fp32sum", "lean"),
        ("exact: fp32 row sum / rounded row sum", "exact fp32sum", "exact"),
        ("AITER-like / ZYFA exact", "exact noblk fp32sum", "exact"),
        ("AITER-like / ZYFA lean", "exact noblk fp32sum", "lean"),
        ("FA3-like / ZYFA lean", "fa3-like", "lean"),
        ("lean +8 / lean", "lean +8", "lean"),
        ("lean +8 / exact", "lean +8", "exact"),
        ("exact +8 / exact", "exact +8", "exact"),
        ("lean +8 / exact +8", "lean +8", "exact +8"),
        ("lean +8: fp32 row sum / rounded row sum", "lean +8 fp32sum", "lean +8"),
        ("exact +8: fp32 row sum / rounded row sum", "exact +8 fp32sum", "exact +8"),
        ("FA3-like / lean +8", "fa3-like", "lean +8"),
    ]
    lines = []
    for kind in sorted({r["case"]["inputs"] for r in results}):
        rows = [r["errors"] for r in results if r["case"]["inputs"] == kind]
        for label, a, b in comparisons:
            if a in rows[0] and b in rows[0]:
                ratios = [row[a] / row[b] for row in rows]
                geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
                lines.append(f"{kind:10s} {label:45s} {geo:6.2f}x  (range {min(ratios):.2f}-{max(ratios):.2f})")
    return lines


def table(results: list[dict], variants=VARIANTS) -> str:
    """A markdown table: one row per case, one column per variant, plus the block statistics."""
    names = [v.name for v in variants]
    head = ["inputs", "S", "d", "heads", "far blocks", "far mass", *names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        c = r["case"]
        cells = [c["inputs"], str(c["seqlen"]), f"{c['d_qk']}/{c['d_v']}", f"{c['heads']}/{c['heads_k']}",
                 f"{r['far_block_fraction']:.0%}", f"{r['far_block_mass']:.0%}",
                 *(f"{r['errors'][n]:.2e}" for n in names)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def legend(variants=VARIANTS) -> str:
    lines = ["Columns: relative RMS error vs float64 attention on the same quantized inputs. 'noblk': no per-block",
             "scaling of P (e = 0); 'fp32sum': the row sum adds unrounded FP32 probabilities; far blocks / far mass:",
             "share of (row, 64-key block) pairs more than 8 binades below the row max, and their probability mass."]
    for v in variants:
        note = v.note or NOTES.get(v.name)
        if note:
            lines.append(f"- {v.name}: {note}")
    return "\n".join(lines)


def plot(results: list[dict], path: str, variants=VARIANTS) -> None:
    """Grouped bars (log scale): one panel per kind of input, one group per case, one bar per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({r["case"]["inputs"] for r in results})
    fig, axes = plt.subplots(len(kinds), 1, figsize=(14, 4.5 * len(kinds)), squeeze=False)
    width = 0.8 / len(variants)
    colors = plt.get_cmap("tab20").colors  # enough distinct colours for every variant
    for ax, kind in zip(axes[:, 0], kinds, strict=True):
        rows = [r for r in results if r["case"]["inputs"] == kind]
        for i, variant in enumerate(variants):
            xs = [j + (i - len(variants) / 2) * width for j in range(len(rows))]
            ax.bar(xs, [r["errors"][variant.name] for r in rows], width, label=variant.name,
                   color=colors[i % len(colors)])
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([Case(**r["case"]).label.split(" ", 1)[1].replace(" d=", "\nd=") for r in rows], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("relative RMS error")
        ax.set_title(f"{kind} inputs")
        ax.grid(axis="y", which="both", alpha=0.3)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="lower center", ncol=len(variants) // 2 + 1, fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)


@torch.no_grad()
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zyfa_tools.accuracy",
        description=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=legend() + "\n\nProgress goes to stderr, the table and a summary of error ratios to stdout.",
    )
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096], help="sequence lengths")
    parser.add_argument("--dims", type=int, nargs="+", default=[128, 192], help="d_qk values (d_v is 128)")
    parser.add_argument("--inputs", nargs="+", default=list(GENERATORS), choices=list(GENERATORS),
                        help="kinds of inputs (see zyfa_tools.inputs)")
    parser.add_argument("--heads", type=int, default=4, help="query heads (batch is 1)")
    parser.add_argument("--group", type=int, default=4, help="query heads per kv head in the GQA cases")
    parser.add_argument("--variants", nargs="+", choices=[v.name for v in VARIANTS], metavar="NAME",
                        help="only these variants (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the input generators")
    parser.add_argument("--quick", action="store_true", help="S=256 and 2 heads: a smoke run in seconds")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice; on a busy "
                        "machine 1 avoids threads waiting on each other)")
    parser.add_argument("--json", metavar="PATH", help="also write every result as JSON")
    parser.add_argument("--plot", metavar="PATH", help="also draw the errors as a PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seqlens, args.heads, args.group = [256], 2, 2
    if args.heads % args.group:
        parser.error(f"--group {args.group} must divide --heads {args.heads}")
    variants = [v for v in VARIANTS if not args.variants or v.name in args.variants]

    todo = cases(args.seqlens, args.dims, args.inputs, args.heads, args.group)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for i, case in enumerate(todo, 1):
        start = time.perf_counter()
        results.append(evaluate(case, variants, seed=args.seed))
        print(f"[{i}/{len(todo)}] {case.label}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)

    print(table(results, variants))
    print()
    print(legend(variants))
    print()
    print("Geometric mean of error ratios over the cases:")
    print("\n".join(summary(results)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["python -m zyfa_tools.accuracy", *(argv or sys.argv[1:])]),
                       "variants": [{**asdict(v), "dtype": str(v.dtype)} for v in variants],
                       "results": results}, f, indent=1)
    if args.plot:
        plot(results, args.plot, variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
