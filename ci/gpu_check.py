"""Validate the sm90a kernels on an H100/H200 through the public path (flash_attn_func -> op -> backend ->
zyfa_kernels): agreement with the numerics model (tight) and with float64, every output element written, bitwise
determinism, CUDA graph capture and replay, torch.compile, and a tensor over 4 GiB; the same for the FP8 kernels
(model configured from their manifest entries, activation-like and Gaussian inputs, the descale forms), and every
kernel that masks its last tiles on lengths that are no multiple of them, unpadded.

    python -m ci.gpu_check [--out DIR] [--small]     (--small: one tiny configuration, for compute-sanitizer)
    python -m ci.gpu_check --variants DIR            (the accuracy checks and determinism of each kernel
                                                      variant of DIR/manifest.json, from
                                                      python -m asmgen.sm90a.experiments, BF16 and FP8;
                                                      bitwise against the shipped kernel where declared)
Writes DIR/gpu_check.json (gpu_check_variants.json) and exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

import zyfa
import zyfa_kernels
from zyfa import numerics
from zyfa.backends import sm90a
from zyfa_tools.bench.contenders import model_kwargs
from zyfa_tools.bench.protocol import watchdog
from zyfa_tools.reference import attention_fp64, bf16_ulps
from zyfa_tools.reference import relative_rms_error as rel_rms

from .gpu_common import poison_allocator, print_items

HEAD_DIMS = tuple(sorted({(k.d_qk, k.d_v) for k in zyfa_kernels.manifest().of("sm90a")}))  # from the manifest
TAU = {128: 0.5, 192: 8.0}  # the kernels' rescale thresholds (manifest rescale_threshold)
KEY_TILE = 128
# (batch, seqlen, heads, heads_k, layout): odd lengths exercise the padding, then GQA, MQA, bhsd, batch > 1
SHAPES = (
    (1, 256, 2, 2, "bshd"),
    (1, 1000, 4, 4, "bshd"),
    (2, 777, 8, 2, "bhsd"),
    (1, 1536, 8, 1, "bshd"),
    (3, 300, 6, 3, "bshd"),
    (1, 4096, 4, 1, "bhsd"),
    (2, 4096, 16, 4, "bshd"),  # 512 pairs: whole rounds of pairs, then single tiles and empty jobs
)
SMALL_SHAPES = ((1, 384, 2, 1, "bshd"),)
WIDE_SHAPE = (1, 2048, 4, 2, "bshd")  # with inputs 20x wider, so the lazy rescaling fires on many tiles
STD = 0.1  # the benchmark protocol's Gaussian inputs
# Kernel vs model: only exp2's last bits, FP32 summation order and O * (1/l) differ, so outputs agree to a BF16
# unit (at the output's RMS scale) and the kernel's distance from the model is a small fraction of its error.
# One call takes milliseconds (seconds under compute-sanitizer, which --small serves: no limit there).
CALL_LIMIT_S = 120.0
MAX_MODEL_ULPS = 2.0
MAX_MODEL_DISTANCE = 0.1  # rel. RMS distance kernel - model, as a fraction of the model's rel. RMS error vs fp64
MAX_FP64_ERROR = 1e-2  # relative RMS error of a BF16 attention against float64 (typically ~2e-3)
MAX_LSE_DIFF = 1e-4  # absolute, natural-log units, kernel vs model


def inputs(batch, seqlen, heads, heads_k, d_qk, d_v, layout, *, std=STD, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def make(h, d):
        shape = (batch, seqlen, h, d) if layout == "bshd" else (batch, h, seqlen, d)
        return (torch.randn(shape, generator=g, device="cuda") * std).to(torch.bfloat16)

    return make(heads, d_qk), make(heads_k, d_qk), make(heads_k, d_v)


def as_bshd(t, layout):
    return t if layout == "bshd" else t.transpose(1, 2)


def attn(q, k, v, layout):
    return zyfa.flash_attn_func(q, k, v, causal=True, layout=layout, return_lse=True)


def run_kernel(kernel, q, k, v, layout, balanced=True):
    """One sm90a kernel's (out, lse), inputs zero-padded as the API pads them."""
    seq_dim = 1 if layout == "bshd" else 2
    seqlen = q.shape[seq_dim]
    pad = -seqlen % 256
    padded = [torch.nn.functional.pad(t, [0, 0] * (3 - seq_dim) + [0, pad]) for t in (q, k, v)]
    out, lse = sm90a.run(kernel, *padded, q.shape[-1] ** -0.5, layout, balanced=balanced)
    return out.narrow(seq_dim, 0, seqlen), lse.narrow(2, 0, seqlen)


def every_kernel(q, k, v, layout):
    """Outputs of every shipped sm90a BF16 kernel for these head dims (whatever length it serves), on the balanced
    job table and the plain pairs."""
    return {f"{kernel.name}{'' if balanced else ' paired'}": run_kernel(kernel, q, k, v, layout, balanced)
            for kernel in zyfa_kernels.manifest().kernels
            if kernel.target == "sm90a" and kernel.dtype == "bf16" and kernel.d_qk == q.shape[-1]
            and kernel.d_v == v.shape[-1]
            for balanced in (True, False)}


@functools.cache
def references(shape, d_qk, d_v, scale_inputs):
    """The numerics model's (out, lse) and float64's for one configuration (cached: every variant compares to them)."""
    batch, seqlen, heads, heads_k, layout = shape
    q, k, v = inputs(batch, seqlen, heads, heads_k, d_qk, d_v, layout, std=STD * scale_inputs, seed=seqlen + heads)
    qb, kb, vb = (as_bshd(t, layout) for t in (q, k, v))
    model = numerics.attention(qb, kb, vb, p_mode="bf16", rescale_threshold=TAU[d_qk], key_tile=KEY_TILE,
                               return_lse=True)
    return (*model, *attention_fp64(qb, kb, vb, return_lse=True))


def check_shape(shape, d_qk, d_v, *, scale_inputs=1.0, kernel=None, limit_s=CALL_LIMIT_S):
    """Accuracy and determinism of the public call on one configuration, or of `kernel` (a variant) alone."""
    batch, seqlen, heads, heads_k, layout = shape
    q, k, v = inputs(batch, seqlen, heads, heads_k, d_qk, d_v, layout, std=STD * scale_inputs, seed=seqlen + heads)
    poison_allocator(4 * q.numel() + 8 * batch * heads * seqlen)
    run = attn if kernel is None else lambda q, k, v, layout: run_kernel(kernel, q, k, v, layout)

    def call(q, k, v, layout):  # a kernel that never finishes ends the check, named, instead of hanging it
        with watchdog(f"{kernel.name if kernel else 'flash_attn_func'} on {shape}", limit_s):
            result = run(q, k, v, layout)
            torch.cuda.synchronize()
        return result

    out, lse = call(q, k, v, layout)
    model_out, model_lse, ref_out, ref_lse = references(shape, d_qk, d_v, scale_inputs)
    out_b = as_bshd(out, layout)
    ulps = bf16_ulps(out_b, model_out)
    result = {
        "shape": list(shape), "d_qk": d_qk, "d_v": d_v, "input_std": STD * scale_inputs,
        "finite": bool(torch.isfinite(out).all() and torch.isfinite(lse).all()),
        "max_ulps_vs_model": float(ulps.max()),
        "frac_differing_vs_model": float((ulps > 0).double().mean()),
        "rel_rms_vs_model": rel_rms(out_b, model_out),
        "max_lse_diff_vs_model": float((lse - model_lse).abs().max()),
        "rel_rms_vs_fp64": rel_rms(out_b, ref_out),
        "model_rel_rms_vs_fp64": rel_rms(model_out, ref_out),
        "max_lse_diff_vs_fp64": float((lse.double() - ref_lse).abs().max()),
    }
    repeats = [call(q, k, v, layout) for _ in range(3)]
    result["deterministic"] = all(torch.equal(o, out) and torch.equal(l_, lse) for o, l_ in repeats)
    # The kernels differ only in the order the warpgroups issue their GEMMs and in when they look for the row maxima,
    # and the job tables only in which CTA computes a tile: the results are bitwise equal; so are those of variants
    # that declare it.
    same = kernel is None or kernel.fields.get("same_results_as_shipped", False)
    schedules = every_kernel(q, k, v, layout) if same else {}
    result["schedules"] = sorted(schedules)
    result["schedules_agree"] = all(torch.equal(o, out) and torch.equal(l_, lse) for o, l_ in schedules.values())
    if kernel is not None:
        result["kernel"] = kernel.name
    result["ok"] = (result["finite"] and result["deterministic"] and result["schedules_agree"]
                    and result["max_ulps_vs_model"] <= MAX_MODEL_ULPS
                    and result["rel_rms_vs_model"] <= MAX_MODEL_DISTANCE * result["model_rel_rms_vs_fp64"]
                    and result["max_lse_diff_vs_model"] <= MAX_LSE_DIFF and result["rel_rms_vs_fp64"] <= MAX_FP64_ERROR)
    return result


def check_graph(d_qk, d_v):
    """A call captured in a CUDA graph after a first eager call replays correctly on new inputs."""
    shape = (2, 1024, 8, 2, "bshd")
    q, k, v = inputs(*shape[:4], d_qk, d_v, shape[4], seed=1)
    attn(q, k, v, "bshd")  # first call of the shape: uploads the job table
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_out, captured_lse = attn(q, k, v, "bshd")
    q2, k2, v2 = inputs(*shape[:4], d_qk, d_v, shape[4], seed=2)
    q.copy_(q2), k.copy_(k2), v.copy_(v2)
    graph.replay()
    eager_out, eager_lse = attn(q, k, v, "bshd")
    return {"d_qk": d_qk, "ok": bool(torch.equal(captured_out, eager_out) and torch.equal(captured_lse, eager_lse))}


def check_compile(d_qk, d_v):
    shape = (1, 1000, 4, 2, "bshd")
    q, k, v = inputs(*shape[:4], d_qk, d_v, shape[4], seed=3)
    compiled = torch.compile(lambda q, k, v: zyfa.flash_attn_func(q, k, v, causal=True), fullgraph=True)
    return {"d_qk": d_qk, "ok": bool(torch.equal(compiled(q, k, v), zyfa.flash_attn_func(q, k, v, causal=True)))}


def check_large():
    """q and out over 4 GiB (64-bit addressing): the rows at the far end equal a run on a small copy of them."""
    batch, seqlen, heads, heads_k, d = 4, 16384, 288, 8, 128
    q, k, v = inputs(batch, seqlen, heads, heads_k, d, d, "bshd", seed=4)
    out = zyfa.flash_attn_func(q, k, v, causal=True)
    b, h = batch - 1, slice(heads - 2 * (heads // heads_k), heads)  # the last two GQA groups of the last batch
    small = zyfa.flash_attn_func(q[b:, :, h].contiguous(), k[b:, :, -2:].contiguous(), v[b:, :, -2:].contiguous(),
                                 causal=True)
    return {"q_bytes": q.numel() * q.element_size(), "ok": bool(torch.equal(out[b:, :, h], small))}


# ---- FP8 ---------------------------------------------------------------------------------------------------------

FP8_SHAPES = ((1, 4096, 8, 2, "bshd"), (2, 1000, 4, 2, "bhsd"), (1, 777, 6, 3, "bshd"), (3, 130, 2, 1, "bshd"))
FP8_SMALL_SHAPES = ((1, 300, 2, 1, "bshd"),)
FP8_INPUTS = {"gaussian": {}, "activation_sink12": {"sink_binades": 12.0}, "activation_sink8": {"sink_binades": 8.0}}
# The FP8 kernels differ from the model by Hopper's FP8 accumulators too (about 13 mantissa bits, truncated): the
# scores of Q K^T, and so an occasional e4m3 code of P one step off, and each tile's P V; and their row sums add the
# rounded P in f16 before FP32. Measured on the H200 (docs/sm90a.md, "FP8"): their distance from the model stays
# below the model's own error against float64 (0.04x on Gaussian inputs, up to 0.89x on activation-like ones, where
# the deviations are one-code flips of P that do not add to the error) and their error is within 5% of the model's
# (up to 1.047x); their lse is within
# 3.2e-3 of the model's on Gaussian inputs and 1.8e-2 on activation-like ones with a sink 12 binades above the tail
# (f16 drops the tail's probabilities next to the sink's in the sink's key tile): the documented bound is 2.5e-2.
FP8_MAX_MODEL_DISTANCE = 1.0
FP8_MAX_ERROR_VS_MODEL = 1.05
FP8_MAX_LSE_DIFF = 2.5e-2


def fp8_inputs(shape, d_qk, d_v, kind, seed):
    """e4m3 (q, k, v) in `layout` and the float32 (batch, heads_k) descales, from zyfa_tools.inputs."""
    from zyfa_tools.inputs import activation_like, gaussian, quantize

    batch, seqlen, heads, heads_k, layout = shape
    make = gaussian if kind == "gaussian" else functools.partial(activation_like, **FP8_INPUTS[kind])
    q, k, v, descales = quantize(*make(batch, seqlen, heads, heads_k, d_qk, d_v, seed=seed), torch.float8_e4m3fn)
    q, k, v = (t.cuda() if layout == "bshd" else t.cuda().transpose(1, 2).contiguous() for t in (q, k, v))
    return q, k, v, {name: d.cuda() for name, d in descales.items()}


def fp8_kernels():
    return [k for k in zyfa_kernels.manifest().kernels if k.target == "sm90a" and k.dtype == "fp8e4m3"]


def p_mode_of(kernel) -> dict:
    """The public call's p_mode that reaches `kernel`: none for the default entry, its own otherwise."""
    return {} if kernel.p_mode_default else {"p_mode": kernel.p_mode}


def check_fp8(kernel, shape, kind, *, limit_s=CALL_LIMIT_S, variant=False):
    """The public call on FP8 inputs (descales as (batch, heads_k) tensors) against the model configured from the
    kernel's manifest entry and float64; the kernel itself unpadded; determinism. variant: `kernel` is a variant
    (--variants), launched alone and compared with the public call bitwise where its entry declares the shipped
    kernel's results (same_results_as_shipped)."""
    batch, seqlen, heads, heads_k, layout = shape
    q, k, v, desc = fp8_inputs(shape, kernel.d_qk, kernel.d_v, kind, seed=seqlen + heads)
    poison_allocator(2 * q.numel() * kernel.d_v // kernel.d_qk + 8 * batch * heads * seqlen)
    d = (desc["q_descale"], desc["k_descale"], desc["v_descale"])

    def public():
        return zyfa.flash_attn_func(q, k, v, causal=True, layout=layout, return_lse=True, **desc, **p_mode_of(kernel))

    def call():
        with watchdog(f"{kernel.name if variant else 'flash_attn_func'} FP8 on {shape}", limit_s):
            result = sm90a.run(kernel, q, k, v, q.shape[-1] ** -0.5, layout, descales=d) if variant else public()
            torch.cuda.synchronize()
        return result

    out, lse = call()
    qb, kb, vb = (as_bshd(t, layout) for t in (q, k, v))
    model_out, model_lse = numerics.attention(qb, kb, vb, **desc, **model_kwargs(kernel), return_lse=True)
    ref_out, ref_lse = attention_fp64(qb, kb, vb, **desc, return_lse=True)
    out_b = as_bshd(out, layout)
    lse_bound = FP8_MAX_LSE_DIFF
    # bitwise twins: the public call and the kernel itself, unpadded; a variant and the shipped kernel (the public
    # call), where the variant declares the shipped kernel's results; other variants have none
    if not variant:
        twin, twin_run = "unpadded_equal", lambda: sm90a.run(kernel, q, k, v, q.shape[-1] ** -0.5, layout, descales=d)
    elif kernel.fields.get("same_results_as_shipped", False):
        twin, twin_run = "shipped_equal", public
    else:
        twin, twin_run = None, None
    result = {
        "kernel": kernel.name, "shape": list(shape), "d_qk": kernel.d_qk, "d_v": kernel.d_v, "inputs": kind,
        "finite": bool(torch.isfinite(out).all() and torch.isfinite(lse).all()),
        "max_ulps_vs_model": float(bf16_ulps(out_b, model_out).max()),
        "rel_rms_vs_model": rel_rms(out_b, model_out),
        "max_lse_diff_vs_model": float((lse - model_lse).abs().max()),
        "max_lse_diff_vs_fp64": float((lse.double() - ref_lse).abs().max()), "lse_bound": lse_bound,
        "rel_rms_vs_fp64": rel_rms(out_b, ref_out), "model_rel_rms_vs_fp64": rel_rms(model_out, ref_out),
    }
    if twin:
        raw_out, raw_lse = twin_run()
        result[twin] = bool(torch.equal(raw_out, out) and torch.equal(raw_lse, lse))
    repeats = [call() for _ in range(2)]
    result["deterministic"] = all(torch.equal(o, out) and torch.equal(l_, lse) for o, l_ in repeats)
    result["ok"] = (result["finite"] and result["deterministic"] and (twin is None or result[twin])
                    and result["rel_rms_vs_model"] <= FP8_MAX_MODEL_DISTANCE * result["model_rel_rms_vs_fp64"]
                    and result["rel_rms_vs_fp64"] <= FP8_MAX_ERROR_VS_MODEL * result["model_rel_rms_vs_fp64"]
                    and result["max_lse_diff_vs_model"] <= lse_bound)
    return result


def check_fp8_descales(kernel):
    """The descale forms (a float, a one-element tensor, (batch, heads_k), an expanded one-element view) give the
    same result when they hold the same values, and per-(batch, kv head) values, also read through a transposed
    view's strides, are applied to their own heads."""
    shape = (2, 512, 4, 2, "bshd")
    q, k, v, desc = fp8_inputs(shape, kernel.d_qk, kernel.d_v, "gaussian", seed=5)
    mode = p_mode_of(kernel)
    full = {n: torch.full_like(t, 0.01) for n, t in desc.items()}
    one = {n: torch.tensor([0.01], device="cuda") for n in desc}
    plain = {n: 0.01 for n in desc}
    expanded = {n: torch.tensor([[0.01]], device="cuda").expand(t.shape) for n, t in desc.items()}
    runs = [zyfa.flash_attn_func(q, k, v, causal=True, **f, **mode) for f in (full, one, plain, expanded)]
    same = all(torch.equal(r, runs[0]) for r in runs)
    out = zyfa.flash_attn_func(q, k, v, causal=True, **desc, **mode)
    strided = {n: t.t().contiguous().t() for n, t in desc.items()}  # the same values, strides (1, batch)
    strided_equal = bool(torch.equal(zyfa.flash_attn_func(q, k, v, causal=True, **strided, **mode), out))
    model = numerics.attention(q, k, v, **desc, **model_kwargs(kernel))
    return {"kernel": kernel.name, "d_qk": kernel.d_qk, "forms_agree": same, "strided_equal": strided_equal,
            "per_head_vs_model": rel_rms(out, model),
            "ok": bool(same and strided_equal and rel_rms(out, model) < 0.05)}


def check_fp8_graph(kernel):
    """An FP8 call (the V^T pre-pass, descales read on the device) captured in a CUDA graph replays correctly on new
    inputs and new descale values."""
    shape = (2, 1024, 8, 2, "bshd")
    q, k, v, desc = fp8_inputs(shape, kernel.d_qk, kernel.d_v, "gaussian", seed=1)
    zyfa.flash_attn_func(q, k, v, causal=True, **desc)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = zyfa.flash_attn_func(q, k, v, causal=True, **desc)
    q2, k2, v2, desc2 = fp8_inputs(shape, kernel.d_qk, kernel.d_v, "activation_sink12", seed=2)
    for t, t2 in ((q, q2), (k, k2), (v, v2)):
        t.copy_(t2)
    for name in desc:
        desc[name].copy_(desc2[name])
    graph.replay()
    eager = zyfa.flash_attn_func(q, k, v, causal=True, **desc)
    return {"d_qk": kernel.d_qk, "ok": bool(torch.equal(captured, eager))}


def check_fp8_compile(kernel):
    shape = (1, 1000, 4, 2, "bshd")
    q, k, v, desc = fp8_inputs(shape, kernel.d_qk, kernel.d_v, "gaussian", seed=3)
    compiled = torch.compile(lambda q, k, v, a, b, c: zyfa.flash_attn_func(q, k, v, causal=True, q_descale=a,
                                                                           k_descale=b, v_descale=c), fullgraph=True)
    args = (desc["q_descale"], desc["k_descale"], desc["v_descale"])
    return {"d_qk": kernel.d_qk, "ok": bool(torch.equal(compiled(q, k, v, *args),
                                                        zyfa.flash_attn_func(q, k, v, causal=True, **desc)))}


def check_fp8_large():
    """FP8 q over 4 GiB: the rows at the far end equal a run on a small copy of them."""
    batch, seqlen, heads, heads_k, d = 4, 16384, 576, 8, 128
    g = torch.Generator(device="cuda").manual_seed(4)
    q = (torch.randn(batch, seqlen, heads, d, generator=g, device="cuda") * 4).to(torch.float8_e4m3fn)
    k, v = ((torch.randn(batch, seqlen, heads_k, d, generator=g, device="cuda") * 4).to(torch.float8_e4m3fn)
            for _ in range(2))
    desc = {n: torch.full((batch, heads_k), 0.025, device="cuda") for n in ("q_descale", "k_descale", "v_descale")}
    out = zyfa.flash_attn_func(q, k, v, causal=True, **desc)
    b, h = batch - 1, slice(heads - 2 * (heads // heads_k), heads)
    small = zyfa.flash_attn_func(q[b:, :, h].contiguous(), k[b:, :, -2:].contiguous(), v[b:, :, -2:].contiguous(),
                                 causal=True, **{n: t[b:, -2:].contiguous() for n, t in desc.items()})
    ok = bool(torch.equal(out[b:, :, h], small))
    del q, k, v, out
    return {"q_bytes": batch * seqlen * heads * d, "dtype": "fp8e4m3", "ok": ok}


def check_bf16_tails():
    """BF16 kernels that mask their last tiles, unpadded, equal their padded run (the rows past seqlen are cut)."""
    results = []
    for kernel in zyfa_kernels.manifest().kernels:
        if kernel.target != "sm90a" or kernel.dtype != "bf16" or not kernel.fields.get("masks_tail"):
            continue
        for batch, seqlen, heads, heads_k, layout in ((1, 1000, 4, 2, "bshd"), (2, 777, 4, 4, "bhsd")):
            q, k, v = inputs(batch, seqlen, heads, heads_k, kernel.d_qk, kernel.d_v, layout, seed=7)
            raw = sm90a.run(kernel, q, k, v, q.shape[-1] ** -0.5, layout)
            padded = run_kernel(kernel, q, k, v, layout)
            results.append({"kernel": kernel.name, "seqlen": seqlen,
                            "ok": bool(torch.equal(raw[0], padded[0]) and torch.equal(raw[1], padded[1]))})
    return results


def print_fp8(report) -> int:
    failures = 0
    for r in report.get("fp8", []):
        failures += not r["ok"]
        print(f"fp8 {r['kernel']} {r['shape']} {r['inputs']}: vs fp64 {r['rel_rms_vs_fp64']:.3e} (model "
              f"{r['model_rel_rms_vs_fp64']:.3e}), vs model {r['rel_rms_vs_model']:.2e}, ulps "
              f"{r['max_ulps_vs_model']:.0f}, lse vs model {r['max_lse_diff_vs_model']:.1e} "
              f"(bound {r['lse_bound']:.1e}), "
              f"det {r['deterministic']:d} unpadded {r.get('unpadded_equal', '-')} shipped "
              f"{r.get('shipped_equal', '-')} ok {r['ok']:d}")
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out")
    ap.add_argument("--small", action="store_true", help="one small configuration (for compute-sanitizer)")
    ap.add_argument("--variants", help="check the kernels of DIR/manifest.json instead of the public path")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "zyfa": zyfa.__version__}
    started = time.time()
    shapes = SMALL_SHAPES if args.small else SHAPES
    if args.variants:
        variants = zyfa_kernels.Manifest.from_file(Path(args.variants) / "manifest.json").kernels
        cases = [(s, 1.0) for s in shapes] + [(WIDE_SHAPE, 20.0)]
        report["accuracy"] = [check_shape(s, kern.d_qk, kern.d_v, kernel=kern, scale_inputs=wide)
                              for kern in variants if kern.dtype == "bf16" for s, wide in cases]
        report["fp8"] = [check_fp8(kern, s, kind, variant=True) for kern in variants if kern.dtype == "fp8e4m3"
                         for s in FP8_SHAPES for kind in FP8_INPUTS]
    else:
        limit = None if args.small else CALL_LIMIT_S
        report["accuracy"] = [check_shape(s, dq, dv, limit_s=limit) for dq, dv in HEAD_DIMS for s in shapes]
    if not args.variants:
        fp8_shapes = FP8_SMALL_SHAPES if args.small else FP8_SHAPES
        limit = None if args.small else CALL_LIMIT_S
        report["fp8"] = [check_fp8(kern, s, kind, limit_s=limit) for kern in fp8_kernels() for s in fp8_shapes
                         for kind in (FP8_INPUTS if not args.small else ("gaussian",))]
    if not args.small and not args.variants:
        report["fp8_items"] = ([check_fp8_descales(kern) for kern in fp8_kernels()]
                               + [check_fp8_graph(kern) for kern in fp8_kernels() if kern.p_mode_default]
                               + [check_fp8_compile(kern) for kern in fp8_kernels() if kern.p_mode_default]
                               + [check_fp8_large()])
        report["tails"] = check_bf16_tails()
        # Wider scores make the lazy rescaling fire on many tiles.
        report["accuracy"] += [check_shape(WIDE_SHAPE, dq, dv, scale_inputs=20.0) for dq, dv in HEAD_DIMS]
        report["graph"] = [check_graph(dq, dv) for dq, dv in HEAD_DIMS]
        report["compile"] = [check_compile(dq, dv) for dq, dv in HEAD_DIMS]
        report["large"] = [check_large()]
    report["seconds"] = time.time() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "gpu_check_variants" if args.variants else "gpu_check_small" if args.small else "gpu_check"
    (out / f"{name}.json").write_text(json.dumps(report, indent=1))

    failures = 0
    print(f"{'d':>7} {'shape':<28} {'ulps':>5} {'diff%':>6} {'lse':>8} {'vs fp64':>8} {'model':>8} det sch ok")
    for r in report["accuracy"]:
        failures += not r["ok"]
        print(f"{r['d_qk']:>3}/{r['d_v']:<3} {str(r['shape']):<28} {r['max_ulps_vs_model']:>5.1f} "
              f"{100 * r['frac_differing_vs_model']:>6.3f} {r['max_lse_diff_vs_model']:>8.1e} "
              f"{r['rel_rms_vs_fp64']:>8.2e} {r['model_rel_rms_vs_fp64']:>8.2e} {r['deterministic']:d}   "
              f"{r['schedules_agree']:d}   {r['ok']:d} {r.get('kernel', '')} rms-vs-model {r['rel_rms_vs_model']:.1e}")
    failures += print_items(report, ("graph", "compile", "large", "fp8_items", "tails"))
    failures += print_fp8(report)
    print(f"gpu_check: {failures} failure(s) in {report['seconds']:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
