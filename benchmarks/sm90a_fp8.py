"""Benchmark and accuracy of the sm90a FP8 kernels against FA3's FP8 forward (fa3_fwd_interface, BF16 output) and
cuDNN's FP8 SDPA (cudnn-frontend, FP8 output) in the same run.

Timing (docs/design.md's protocol, fewer repetitions when asked): causal, batch 1, S in --seqlens, max(32, 262144/S)
query heads, MHA and GQA 4:1, Gaussian inputs (std 0.1) quantized to e4m3 with per-(batch, kv head) descales;
throughput = H S^2 (d_qk + d_v) / time. Kernel-only device time from CUDA graph replays ("graph"), and eager
back-to-back calls timed with events ("eager"). Ours: "zyfa" = the V^T pre-pass + the kernel (what a call costs),
"kernel" = the kernel alone on a V^T made beforehand, "vt" = the pre-pass alone; the variants of --variants DIR
(python -m asmgen.sm90a.experiments DIR). Contenders in rotated order over --rounds rounds, the median reported.

Accuracy (--accuracy): relative RMS error against float64 on the same quantized inputs (Gaussian; activation-like
with a sink 12 and 8 binades above the tail), of ours, FA3 FP8 and the numerics model configured from the kernel's
manifest entry (and the model with per-64-key-block scaling, to show what it would gain); the kernel against the
model (BF16 units, lse), determinism, any sequence length (no padding: the kernels mask their last tiles).

    python -m benchmarks.sm90a_fp8 --out DIR [--seqlens 2048 ...] [--accuracy] [--variants DIR]
Writes DIR/bench_sm90a_fp8.json (after every configuration) and DIR/bench_sm90a_fp8.md; prints the tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import zyfa
import zyfa_kernels
from zyfa import numerics
from zyfa.backends import sm90a
from zyfa_tools.bench.contenders import model_kwargs
from zyfa_tools.bench.protocol import Clock, causal_flops, heads_for, watchdog
from zyfa_tools.inputs import activation_like, gaussian, quantize
from zyfa_tools.reference import attention_fp64, bf16_ulps
from zyfa_tools.reference import relative_rms_error as rel_rms

FP8_PEAK_TFLOPS = 1979.0  # H100/H200 dense FP8
HEAD_DIMS = tuple(sorted({(k.d_qk, k.d_v) for k in zyfa_kernels.manifest().of("sm90a")}))  # from the manifest
SEQLENS = (2048, 4096, 8192, 16384, 32768)
FIRST_CALL_LIMIT_S = 30.0
CLOCK = Clock(torch.device("cuda"))
# (batch, seqlen, heads, heads_k): lengths that are no multiple of the tiles, GQA, batch > 1
ACCURACY_SHAPES = ((1, 4096, 8, 8), (1, 4096, 8, 2), (2, 1000, 4, 2), (1, 777, 6, 3), (3, 130, 2, 1), (1, 1, 2, 2))
INPUT_KINDS = {"gaussian": {}, "activation_sink12": {"sink_binades": 12.0}, "activation_sink8": {"sink_binades": 8.0}}


def label(variant_name: str) -> str:
    """A variant's short name: what follows its shipped kernel's name."""
    return variant_name.rsplit("_independent_", 1)[-1]


def fp8_inputs(batch, seqlen, heads, heads_k, d_qk, d_v, kind="gaussian", seed=0):
    """(q, k, v) e4m3 in (batch, seqlen, heads, dim) on the GPU and their float32 (batch, heads_k) descales."""
    if kind == "gaussian":
        qf, kf, vf = gaussian(batch, seqlen, heads, heads_k, d_qk, d_v, seed=seed)
    else:
        qf, kf, vf = activation_like(batch, seqlen, heads, heads_k, d_qk, d_v, seed=seed, **INPUT_KINDS[kind])
    q, k, v, descales = quantize(qf, kf, vf, torch.float8_e4m3fn)
    q, k, v = (t.cuda() for t in (q, k, v))
    return q, k, v, {name: d.cuda() for name, d in descales.items()}


def fa3():
    try:
        import fa3_fwd_interface
    except ImportError:
        return None
    return fa3_fwd_interface


def fa3_call(mod, q, k, v, descales):
    out = mod.flash_attn_func(q, k, v, causal=True, **descales)
    return out[0] if isinstance(out, tuple) else out


def ours(kernel, q, k, v, descales, vt=None):
    d = (descales["q_descale"], descales["k_descale"], descales["v_descale"])
    return sm90a.run(kernel, q, k, v, q.shape[-1] ** -0.5, "bshd", descales=d, vt=vt)


def accuracy(kernels, variants, shapes, kinds) -> list[dict]:
    rows = []
    mod = fa3()
    for kernel in kernels:
        for shape in shapes:
            for kind in kinds:
                batch, seqlen, heads, heads_k = shape
                q, k, v, desc = fp8_inputs(*shape, kernel.d_qk, kernel.d_v, kind, seed=seqlen + heads)
                with watchdog(f"{kernel.name} on {shape}", FIRST_CALL_LIMIT_S):
                    out, lse = ours(kernel, q, k, v, desc)
                    torch.cuda.synchronize()
                model_out, model_lse = numerics.attention(q, k, v, **desc, **model_kwargs(kernel), return_lse=True)
                blocked = numerics.attention(q, k, v, **desc, **{**model_kwargs(kernel), "block_scale": True,
                                                                  "scale_block": 64})
                ref, ref_lse = attention_fp64(q, k, v, **desc, return_lse=True)
                ulps = bf16_ulps(out, model_out)
                row = {"kernel": kernel.name, "shape": list(shape), "inputs": kind,
                       "finite": bool(torch.isfinite(out).all() and torch.isfinite(lse).all()),
                       "max_ulps_vs_model": float(ulps.max()), "frac_differing": float((ulps > 0).double().mean()),
                       "rel_rms_vs_model": rel_rms(out, model_out),
                       "max_lse_diff_vs_model": float((lse - model_lse).abs().max()),
                       "max_lse_diff_vs_fp64": float((lse.double() - ref_lse).abs().max()),
                       "rel_rms_vs_fp64": rel_rms(out, ref), "model_vs_fp64": rel_rms(model_out, ref),
                       "model_block64_vs_fp64": rel_rms(blocked, ref)}
                again = [ours(kernel, q, k, v, desc) for _ in range(2)]
                row["deterministic"] = all(torch.equal(o, out) and torch.equal(lo, lse) for o, lo in again)
                if mod is not None and seqlen >= 128:
                    try:
                        row["fa3_vs_fp64"] = rel_rms(fa3_call(mod, q, k, v, desc), ref)
                    except RuntimeError as error:
                        row["fa3_error"] = str(error).splitlines()[0]
                for name, var in variants.items():
                    if var.d_qk == kernel.d_qk and var.d_v == kernel.d_v:
                        vo, vl = ours(var, q, k, v, desc)
                        vm = model_out if model_kwargs(var) == model_kwargs(kernel) else numerics.attention(
                            q, k, v, **desc, **model_kwargs(var))
                        row.setdefault("variants", {})[label(name)] = {
                            "equal": bool(torch.equal(vo, out) and torch.equal(vl, lse)),
                            "rel_rms_vs_fp64": rel_rms(vo, ref), "model_vs_fp64": rel_rms(vm, ref)}
                row["ok"] = (row["finite"] and row["deterministic"] and row["max_ulps_vs_model"] <= 2.0
                             and row["rel_rms_vs_model"] <= 0.1 * row["model_vs_fp64"]
                             and row["max_lse_diff_vs_model"] <= 1e-3)
                rows.append(row)
                print(f"{kernel.name} {shape} {kind}: ulps {row['max_ulps_vs_model']:.1f} "
                      f"vs-model {row['rel_rms_vs_model']:.2e} lse {row['max_lse_diff_vs_model']:.1e} | fp64: ours "
                      f"{row['rel_rms_vs_fp64']:.3e} model {row['model_vs_fp64']:.3e} block64 "
                      f"{row['model_block64_vs_fp64']:.3e} fa3 {row.get('fa3_vs_fp64', float('nan')):.3e} "
                      f"det {row['deterministic']:d} ok {row['ok']:d}", flush=True)
                for name, r in row.get("variants", {}).items():
                    print(f"    {name}: fp64 {r['rel_rms_vs_fp64']:.3e} (its model {r['model_vs_fp64']:.3e}) "
                          f"equal {r['equal']:d}", flush=True)
    return rows


def bench(seqlen, heads, heads_k, d_qk, d_v, args, variants) -> dict:
    kernel = sm90a.find_kernel(torch.float8_e4m3fn, d_qk, d_v, seqlen)
    q, k, v, desc = fp8_inputs(1, seqlen, heads, heads_k, d_qk, d_v)
    vt = sm90a.transposed_v(v, "bshd")
    runs = {"zyfa": lambda: ours(kernel, q, k, v, desc), "kernel": lambda: ours(kernel, q, k, v, desc, vt),
            "vt": lambda: sm90a.transposed_v(v, "bshd")}
    for name, var in variants.items():
        if var.d_qk == d_qk and var.d_v == d_v:
            runs[label(name)] = lambda var=var: ours(var, q, k, v, desc, vt)
    mod = fa3()
    if mod is not None:
        runs["fa3"] = lambda: fa3_call(mod, q, k, v, desc)
    names = list(runs)
    for name in list(names):
        with watchdog(f"{name} at S = {seqlen}", FIRST_CALL_LIMIT_S):
            try:
                runs[name]()
                torch.cuda.synchronize()
            except RuntimeError as error:
                print(f"  {name}: {str(error).splitlines()[0]}", file=sys.stderr)
                names.remove(name)
    calls = max(8, round(args.calls * min(1.0, (8192 / seqlen) ** 2)))
    graph = {n: [] for n in names}
    eager = {n: [] for n in names}
    for rnd in range(args.rounds):
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            graph[name].append(CLOCK.kernel_ms(runs[name], calls, calls)[0])
            eager[name].append(CLOCK.eager_ms(runs[name], calls))
    flops = causal_flops(1, heads, seqlen, d_qk, d_v)
    row = {"seqlen": seqlen, "heads": heads, "heads_k": heads_k, "d_qk": d_qk, "d_v": d_v, "kernel_name": kernel.name,
           "calls": calls, "ms_graph": {n: statistics.median(t) for n, t in graph.items()},
           "ms_eager": {n: statistics.median(t) for n, t in eager.items()}}
    row["tflops"] = {n: flops / ms / 1e9 for n, ms in row["ms_graph"].items() if n != "vt"}
    row["tflops_eager"] = {n: flops / ms / 1e9 for n, ms in row["ms_eager"].items() if n != "vt"}
    return row


def _ratio(a, b) -> str:
    return f"{a / b:.3f}" if a and b else "-"


def markdown(report) -> str:
    nan = float("nan")
    lines = [f"# sm90a FP8 forward, {report['device']}", "",
             f"torch {report['torch']}, CUDA {report['cuda']}, fa3-fwd {report.get('fa3', 'absent')}, "
             f"zyfa {report['zyfa']}; causal, batch 1, Gaussian std 0.1 quantized to e4m3, per-(batch, kv head) "
             f"descales. TFLOP/s = H S^2 (d_qk + d_v) / time; kernel-only time from CUDA graph replays (eager: "
             f"events around back-to-back calls). zyfa = V^T pre-pass + kernel; kernel = the kernel alone.", "",
             "| d | S | H/Hk | zyfa | kernel | FA3 FP8 | zyfa / FA3 | kernel / FA3 | zyfa % of FP8 peak | "
             "pre-pass us | zyfa eager | FA3 eager |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        t, te = r["tflops"], r["tflops_eager"]
        lines.append(
            f"| {r['d_qk']}/{r['d_v']} | {r['seqlen']} | {r['heads']}/{r['heads_k']} | {t.get('zyfa', nan):.0f} | "
            f"{t.get('kernel', nan):.0f} | {t.get('fa3', nan):.0f} | {_ratio(t.get('zyfa'), t.get('fa3'))} | "
            f"{_ratio(t.get('kernel'), t.get('fa3'))} | {100 * t.get('zyfa', nan) / FP8_PEAK_TFLOPS:.1f} | "
            f"{1000 * r['ms_graph'].get('vt', nan):.1f} | {te.get('zyfa', nan):.0f} | {te.get('fa3', nan):.0f} |")
    others = sorted({n for r in report["rows"] for n in r["tflops"]} - {"zyfa", "kernel", "fa3"})
    if others:
        lines += ["", "Variants (kernel alone, TFLOP/s): " + ", ".join(others), "",
                  "| d | S | H/Hk | kernel | " + " | ".join(others) + " |", "|---|---|---|---|" + "---|" * len(others)]
        for r in report["rows"]:
            t = r["tflops"]
            lines.append(f"| {r['d_qk']}/{r['d_v']} | {r['seqlen']} | {r['heads']}/{r['heads_k']} | "
                         f"{t.get('kernel', 0):.0f} | " + " | ".join(f"{t.get(n, 0):.0f}" for n in others) + " |")
    if report.get("accuracy"):
        lines += ["", "Accuracy: relative RMS error vs float64 on the same quantized inputs; the model is "
                  "zyfa.numerics configured from the kernel's manifest entry (block64: with per-64-key-block "
                  "scaling).", "",
                  "| kernel | shape | inputs | ours | model | model block64 | FA3 FP8 | ours / FA3 | ours / model | "
                  "max BF16 ulps vs model | lse vs model | lse vs fp64 | ok |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for a in report["accuracy"]:
            f3 = a.get("fa3_vs_fp64")
            lines.append(f"| {a['kernel']} | {a['shape']} | {a['inputs']} | {a['rel_rms_vs_fp64']:.3e} | "
                         f"{a['model_vs_fp64']:.3e} | {a['model_block64_vs_fp64']:.3e} | {f3 or nan:.3e} | "
                         f"{_ratio(a['rel_rms_vs_fp64'], f3)} | {_ratio(a['rel_rms_vs_fp64'], a['model_vs_fp64'])} | "
                         f"{a['max_ulps_vs_model']:.1f} | {a['max_lse_diff_vs_model']:.1e} | "
                         f"{a['max_lse_diff_vs_fp64']:.1e} | {a['ok']:d} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out")
    ap.add_argument("--seqlens", type=int, nargs="*", default=list(SEQLENS))
    ap.add_argument("--head-dims", default="128,192", help="d_qk values (d_v = 128)")
    ap.add_argument("--gqa", default="1,4", help="query heads per kv head to time")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--accuracy", action="store_true", help="the accuracy table first")
    ap.add_argument("--accuracy-shapes", type=int, default=len(ACCURACY_SHAPES), help="the first N shapes only")
    ap.add_argument("--variants", help="a folder from python -m asmgen.sm90a.experiments")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dims = [d for d in HEAD_DIMS if str(d[0]) in args.head_dims.split(",")]
    variants = {}  # full name -> kernel; labelled by what follows the shipped kernel's name
    if args.variants:
        manifest = zyfa_kernels.Manifest.from_file(Path(args.variants) / "manifest.json")
        variants = {var.name: var for var in manifest.kernels}
    mod = fa3()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "zyfa": zyfa.__version__, "fa3": getattr(mod, "__version__", "0.0.3") if mod else None,
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": []}
    shipped = [k for k in zyfa_kernels.manifest().kernels if k.target == "sm90a" and k.dtype == "fp8e4m3"
               and str(k.d_qk) in args.head_dims.split(",")]

    def save():
        (out / "bench_sm90a_fp8.json").write_text(json.dumps(report, indent=1))
        (out / "bench_sm90a_fp8.md").write_text(markdown(report))

    if args.accuracy:
        report["accuracy"] = accuracy(shipped, variants, ACCURACY_SHAPES[:args.accuracy_shapes], list(INPUT_KINDS))
        save()
    for d_qk, d_v in dims:
        for seqlen in args.seqlens:
            for group in (int(g) for g in args.gqa.split(",")):
                heads = heads_for(seqlen)
                row = bench(seqlen, heads, heads // group, d_qk, d_v, args, variants)
                report["rows"].append(row)
                save()
                t = row["tflops"]
                print(f"d {d_qk} S {seqlen} {heads}/{heads // group}: zyfa {t.get('zyfa', 0):.0f} kernel "
                      f"{t.get('kernel', 0):.0f} fa3 {t.get('fa3', 0):.0f} vt {1000 * row['ms_graph']['vt']:.1f} us "
                      + " ".join(f"{n} {v:.0f}" for n, v in t.items() if n not in ("zyfa", "kernel", "fa3")),
                      flush=True)
    save()
    print(markdown(report))
    return 0 if all(a["ok"] for a in report.get("accuracy", [])) else 1


if __name__ == "__main__":
    sys.exit(main())
