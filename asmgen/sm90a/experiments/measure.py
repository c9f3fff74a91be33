"""The sm90a FP8 kernels (exact and lean P) and their experiment variants on an H100/H200, in one run: accuracy and
determinism against the numerics model and float64 (FA3 FP8 on the same quantized inputs), then kernel-only speed
against FA3 FP8, through benchmarks/sm90a_fp8.py's inputs, calls and timing protocol.

    python -m asmgen.sm90a.experiments.measure --out DIR [--variants DIR] [--seqlens 2048 ...] [--head-dims 128,192]
        [--gqa 1,4] [--rounds 3] [--calls 50] [--no-accuracy] [--no-timing]

--variants: a folder from `python -m asmgen.sm90a.experiments DIR`. Every kernel is checked against the model its
own manifest entry configures: rel. RMS distance from it, error vs float64 (and its ratio to the model's and to
FA3's), lse vs the model, bitwise determinism over three calls. Speed: TFLOP/s = H S^2 (d_qk + d_v) / time from CUDA
graph replays, each kernel on a V^T made beforehand, FA3 FP8 (fa3_fwd_interface) in the same rounds.
Writes DIR/measure_fp8.json (after every configuration) and DIR/measure_fp8.md; prints the tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import zyfa
import zyfa_kernels
from benchmarks import sm90a_fp8 as bench
from zyfa import numerics
from zyfa_tools.bench.contenders import model_kwargs
from zyfa_tools.reference import attention_fp64
from zyfa_tools.reference import relative_rms_error as rel_rms

# (batch, seqlen, heads, heads_k): GQA at a protocol-like length, tails with batch > 1, an odd GQA length
SHAPES = ((1, 4096, 8, 2), (2, 1000, 4, 2), (1, 777, 6, 3))


def short(name: str) -> str:
    """A kernel's column name: "exact" / "lean" for the shipped kernels, the variant's suffix otherwise."""
    base = name.split("_independent")[0]
    tail = name.split("_independent")[-1].lstrip("_")
    mode = "lean" if base.endswith("_lean") else "exact"
    return f"{mode}_{tail}" if tail else mode


def accuracy(kernels, head_dims) -> list[dict]:
    rows = []
    public_names = {k.name for k in zyfa_kernels.manifest().kernels}
    mod = bench.fa3()
    for d_qk, d_v in head_dims:
        mine = [k for k in kernels if (k.d_qk, k.d_v) == (d_qk, d_v)]
        for shape in SHAPES:
            for kind in bench.INPUT_KINDS:
                q, k, v, desc = bench.fp8_inputs(*shape, d_qk, d_v, kind, seed=shape[1] + shape[2])
                ref, ref_lse = attention_fp64(q, k, v, **desc, return_lse=True)
                fa3_err = rel_rms(bench.fa3_call(mod, q, k, v, desc), ref) if mod is not None else None
                models = {}
                for kernel in mine:
                    config = tuple(sorted(model_kwargs(kernel).items()))
                    if config not in models:
                        models[config] = numerics.attention(q, k, v, **desc, **model_kwargs(kernel), return_lse=True)
                    model, model_lse = models[config]
                    with bench.watchdog(f"{kernel.name} on {shape}", bench.FIRST_CALL_LIMIT_S):
                        out, lse = bench.ours(kernel, q, k, v, desc)
                        torch.cuda.synchronize()
                    again = [bench.ours(kernel, q, k, v, desc) for _ in range(2)]
                    err, model_err = rel_rms(out, ref), rel_rms(model, ref)
                    row = {"kernel": kernel.name, "label": short(kernel.name), "shape": list(shape), "inputs": kind,
                           "rel_rms_vs_fp64": err, "model_vs_fp64": model_err, "fa3_vs_fp64": fa3_err,
                           "vs_model": rel_rms(out, model), "ratio_model": err / model_err,
                           "ratio_fa3": err / fa3_err if fa3_err else None,
                           "lse_vs_model": float((lse - model_lse).abs().max()),
                           "lse_vs_fp64": float((lse.double() - ref_lse).abs().max()),
                           "finite": bool(torch.isfinite(out).all() and torch.isfinite(lse).all()),
                           "deterministic": all(torch.equal(o, out) and torch.equal(lo, lse) for o, lo in again)}
                    if not kernel.p_mode_default and kernel.name in public_names:  # the API's p_mode reaches it
                        api = zyfa.flash_attn_func(q, k, v, causal=True, return_lse=True, p_mode=kernel.p_mode,
                                                   **desc)
                        row["api_equal"] = bool(torch.equal(api[0], out) and torch.equal(api[1], lse))
                    rows.append(row)
                    print(f"{row['label']:>12} d{d_qk} {shape} {kind}: fp64 {err:.3e} model {model_err:.3e} "
                          f"fa3 {fa3_err or float('nan'):.3e} | /model {row['ratio_model']:.3f} "
                          f"/fa3 {row['ratio_fa3'] or float('nan'):.3f} dist {row['vs_model'] / model_err:.3f}x "
                          f"lse {row['lse_vs_model']:.1e} det {row['deterministic']:d} api {row.get('api_equal', '-')}",
                          flush=True)
    return rows


def markdown(report) -> str:
    lines = [f"# sm90a FP8: exact P, lean P and the FMA-pipe exponentials, {report['device']}", "",
             f"torch {report['torch']}, CUDA {report['cuda']}, driver {report['driver']}, fa3-fwd "
             f"{report['fa3']}; {report['started']}. Kernel-only TFLOP/s from CUDA graph replays (median of "
             f"{report['rounds']} rounds); FA3 FP8 in the same rounds. Causal, batch 1, max(32, 262144/S) heads, "
             "Gaussian std 0.1 quantized to e4m3.", ""]
    timing = report.get("timing", [])
    if timing:
        names = [n for n in timing[0]["tflops"] if n not in ("zyfa", "fa3")]
        lines += ["| d | S | H/Hk | FA3 | " + " | ".join(f"{short_t(n)}" for n in names) + " | "
                  + " | ".join(f"{short_t(n)} / FA3" for n in names) + " | best % of peak |",
                  "|---|---|---|---|" + "---|" * (2 * len(names) + 1)]
        for r in timing:
            t = r["tflops"]
            fa = t.get("fa3")
            best = max(t.get(n, 0) for n in names)
            lines.append(f"| {r['d_qk']}/{r['d_v']} | {r['seqlen']} | {r['heads']}/{r['heads_k']} | "
                         f"{fa or float('nan'):.0f} | " + " | ".join(f"{t.get(n, float('nan')):.0f}" for n in names)
                         + " | " + " | ".join(f"{t[n] / fa:.3f}" if fa and n in t else "-" for n in names)
                         + f" | {100 * best / bench.FP8_PEAK_TFLOPS:.1f} |")
    acc = report.get("accuracy", [])
    if acc:
        lines += ["", "Accuracy: rel. RMS error vs float64 on the same quantized inputs; model = zyfa.numerics "
                  "configured from the kernel's entry; dist = rel. RMS distance from the model / the model's error.",
                  "", "| kernel | d | shape | inputs | ours | model | FA3 | ours / model | ours / FA3 | dist | "
                  "lse vs model | det |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for a in acc:
            lines.append(f"| {a['label']} | {a['kernel'].split('_')[3]} | {a['shape']} | {a['inputs']} | "
                         f"{a['rel_rms_vs_fp64']:.3e} | {a['model_vs_fp64']:.3e} | "
                         f"{a['fa3_vs_fp64'] or float('nan'):.3e} | {a['ratio_model']:.3f} | "
                         f"{a['ratio_fa3'] or float('nan'):.3f} | {a['vs_model'] / a['model_vs_fp64']:.3f} | "
                         f"{a['lse_vs_model']:.1e} | {a['deterministic']:d} |")
    return "\n".join(lines) + "\n"


def short_t(name: str) -> str:
    return "exact" if name == "kernel" else name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out")
    ap.add_argument("--variants", help="a folder from python -m asmgen.sm90a.experiments")
    ap.add_argument("--seqlens", type=int, nargs="+", default=list(bench.SEQLENS))
    ap.add_argument("--head-dims", default="128,192", help="d_qk values (d_v = 128)")
    ap.add_argument("--gqa", default="1,4", help="query heads per kv head")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    d_qks = [int(d) for d in args.head_dims.split(",")]
    shipped = [k for k in zyfa_kernels.manifest().kernels if k.target == "sm90a" and k.dtype == "fp8e4m3"
               and k.d_qk in d_qks]
    variants = []
    if args.variants:
        variants = [k for k in zyfa_kernels.Manifest.from_file(Path(args.variants) / "manifest.json").kernels
                    if k.d_qk in d_qks]
    mod = bench.fa3()
    driver = "?"
    try:
        import subprocess
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "driver": driver, "fa3": getattr(mod, "__version__", "0.0.3") if mod else None,
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "rounds": args.rounds}

    def save():
        (out / "measure_fp8.json").write_text(json.dumps(report, indent=1))
        (out / "measure_fp8.md").write_text(markdown(report))

    dims = [(d, 128) for d in d_qks]
    if not args.no_accuracy:
        report["accuracy"] = accuracy(shipped + variants, dims)
        save()
    if not args.no_timing:
        report["timing"] = []
        extra = [k for k in shipped + variants if not (k.p_mode_default and k in shipped)]  # exact: "kernel"
        for d_qk, d_v in dims:
            for seqlen in args.seqlens:
                for group in (int(g) for g in args.gqa.split(",")):
                    heads = bench.heads_for(seqlen)
                    runs = {short(k.name): k for k in extra if (k.d_qk, k.d_v) == (d_qk, d_v)}
                    row = bench.bench(seqlen, heads, heads // group, d_qk, d_v, args, runs)
                    row["tflops"].pop("zyfa", None)
                    report["timing"].append(row)
                    save()
                    print(f"d {d_qk} S {seqlen} {heads}/{heads // group}: "
                          + " ".join(f"{short_t(n)} {v:.0f}" for n, v in row["tflops"].items()), flush=True)
    save()
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
