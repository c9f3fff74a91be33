"""Validate the gfx950 kernels on an MI355X through the public path (flash_attn_func with FP8 inputs and every
accepted descale form -> torch.ops.zyfa.fwd -> zyfa.backends.gfx950 -> zyfa_kernels' HIP launch): agreement with the
numerics model at the kernel's own configuration (p_mode, tile_n, scale_block, tau from the manifest; tight) and
with float64 attention on the decoded inputs, every output element written (poisoned allocations), bitwise
determinism, HIP graph capture and replay after a first call, torch.compile(fullgraph=True), and tensors over 4 GiB.
The accuracy cases also run the kernels a call reaches besides the FP8 defaults (p_mode="exact" at d = 128, and the
BF16 kernels on BF16 inputs). The cases and tolerances are in ci/gfx950_validation.py.

    python -m ci.gpu_check_gfx950 [--out DIR] [--small]
    ZYFA_BACKEND=reference python -m ci.gpu_check_gfx950 --expect-backend reference --out DIR
        (a rehearsal on another GPU: the same script through the reference backend, whose key tile is its own)
Writes DIR/gpu_check_gfx950.json (gpu_check_gfx950_small.json) and exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

import zyfa
import zyfa_kernels
from zyfa import backends, numerics
from zyfa.backends import reference as reference_backend
from zyfa_tools import inputs
from zyfa_tools.reference import attention_fp64, bf16_ulps
from zyfa_tools.reference import relative_rms_error as rel_rms

from . import gfx950_validation as cfg
from .gpu_common import poison_allocator, print_items

FP8 = torch.float8_e4m3fn
TARGET = "gfx950"
DEVICE = "cuda"  # torch's name for the HIP device on ROCm (the CPU tests set "cpu": the reference backend)


def on_gpu() -> bool:
    return torch.device(DEVICE).type == "cuda"


def sync() -> None:
    if on_gpu():
        torch.cuda.synchronize()


def poison(nbytes: int) -> None:
    if on_gpu():
        poison_allocator(nbytes)


@contextlib.contextmanager
def poisoned_outputs():
    """Within the block, floating-point tensors from torch.empty / torch.empty_like (how the backends allocate their
    uninitialised out and lse) come filled with NaN, so an element the kernel does not write shows (the fill runs
    on the current stream, before the launch). The allocator poisoning above also covers other allocations."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def nan_filled(t):
        if t.is_floating_point():
            t.fill_(math.nan)
        return t

    torch.empty = lambda *a, **kw: nan_filled(real_empty(*a, **kw))
    torch.empty_like = lambda *a, **kw: nan_filled(real_empty_like(*a, **kw))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = real_empty, real_empty_like


def gfx950_kernels() -> dict[tuple[int, int], object]:
    """The manifest's default gfx950 FP8 kernel (p_mode_default) by (d_qk, d_v): what a call without p_mode runs."""
    return {(k.d_qk, k.d_v): k for k in zyfa_kernels.manifest().kernels
            if k.target == TARGET and k.dtype == "fp8e4m3" and k.p_mode_default}


def other_kernels() -> list:
    """The gfx950 kernels at 32-bit offsets that a call reaches besides the FP8 defaults: FP8 kernels of another
    p_mode (exact P at d = 128) and the BF16 kernels."""
    return [k for k in zyfa_kernels.manifest().kernels if k.target == TARGET and k.fields["offset_bits"] == 32
            and not (k.dtype == "fp8e4m3" and k.p_mode_default)]


def model_settings(kernel, backend: str) -> dict:
    """The numerics model's configuration of what runs: the kernel's manifest fields, or (the reference backend) the
    model's own defaults at the reference key tile."""
    if backend == "reference":
        return {"p_mode": kernel.p_mode, "key_tile": reference_backend.KEY_TILE}
    return {"p_mode": kernel.p_mode, "p_shift": kernel.p_shift, "rowsum": kernel.rowsum, "key_tile": kernel.tile_n,
            "block_scale": kernel.scale_block is not None, "scale_block": kernel.scale_block or kernel.tile_n,
            "rescale_threshold": kernel.rescale_threshold}


def backend_in_use() -> str:
    device = torch.device(DEVICE, torch.cuda.current_device()) if on_gpu() else torch.device(DEVICE)
    return backends.backend_name(backends.describe(device), os.environ.get(backends.BACKEND_ENV, ""))


def to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A (batch, seqlen, heads, dim) tensor in `layout`, contiguous."""
    return t.contiguous() if layout == "bshd" else t.transpose(1, 2).contiguous()


def as_bshd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t if layout == "bshd" else t.transpose(1, 2)


def float_inputs(case: cfg.Case, d_qk: int, d_v: int, seed: int):
    """float32 (batch, seqlen, heads, dim) q, k, v on the CPU, from zyfa_tools.inputs."""
    shape = (case.batch, case.seqlen, case.heads, case.heads_k, d_qk, d_v)
    if case.inputs == "activation":
        return inputs.activation_like(*shape, seed=seed)
    return inputs.gaussian(*shape, std=cfg.INPUT_STD[case.inputs], seed=seed)


def fp8_inputs(case: cfg.Case, d_qk: int, d_v: int, seed: int):
    """(q8, k8, v8) (batch, seqlen, heads, dim) on the GPU and the descales in the case's form (the same values go
    to the API and to the references)."""
    q, k, v = float_inputs(case, d_qk, d_v, seed)
    if case.descale == "per_kv_head":  # float32 (batch, heads_k), amax / 448 per (batch, kv head)
        q8, k8, v8, d = inputs.quantize(q, k, v, FP8)
        descales = tuple(d[f"{n}_descale"].to(DEVICE) for n in "qkv")
    else:  # one power-of-two scale per tensor
        quantized = [zyfa.fp8_quantize(t) for t in (q, k, v)]
        q8, k8, v8 = (x8 for x8, _ in quantized)
        one = [dsc.to(DEVICE) for _, dsc in quantized]  # one-element float32 tensors
        if case.descale == "one_element":
            descales = tuple(one)
        elif case.descale == "float":
            descales = tuple(float(dsc) for dsc in one)
        else:  # "expanded": a stride-0 view of shape (batch, heads_k)
            descales = tuple(dsc.reshape(1, 1).expand(case.batch, case.heads_k) for dsc in one)
    return (q8.to(DEVICE), k8.to(DEVICE), v8.to(DEVICE)), descales


def kernel_inputs(case: cfg.Case, kernel, seed: int):
    """The case's inputs for the kernel: FP8 with descales, or BF16 (descales None)."""
    if kernel.dtype == "bf16":
        return tuple(t.to(torch.bfloat16).to(DEVICE) for t in float_inputs(case, kernel.d_qk, kernel.d_v, seed)), \
            (None, None, None)
    return fp8_inputs(case, kernel.d_qk, kernel.d_v, seed)


def attn(q, k, v, descales, layout, p_mode=None):
    qd, kd, vd = descales
    return zyfa.flash_attn_func(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd, layout=layout,
                                return_lse=True, p_mode=p_mode)


def padded_bytes(case: cfg.Case, d_qk: int, d_v: int) -> int:
    """Bytes one call allocates at most: padded FP8 copies of q, k, v, the BF16 output and the float32 lse."""
    s = -(-case.seqlen // 256) * 256
    b, h, hk = case.batch, case.heads, case.heads_k
    return b * s * (h * d_qk + hk * (d_qk + d_v)) + 2 * b * s * h * d_v + 4 * b * h * s


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (so -0 differs from +0 and equal NaNs compare equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))


def check_case(case: cfg.Case, kernel, backend: str, expected: str, seed: int) -> dict:
    """Accuracy, full coverage and determinism of the public call on one configuration."""
    d_qk, d_v = kernel.d_qk, kernel.d_v
    (q8, k8, v8), descales = kernel_inputs(case, kernel, seed)
    q, k, v = (to_layout(t, case.layout) for t in (q8, k8, v8))
    p_mode = None if kernel.dtype == "bf16" else kernel.p_mode  # a BF16 call takes no p_mode
    poison(2 * q8.element_size() * padded_bytes(case, d_qk, d_v))
    with poisoned_outputs():
        out, lse = attn(q, k, v, descales, case.layout, p_mode)
    sync()
    repeats = []
    for _ in range(3):
        poison(2 * q8.element_size() * padded_bytes(case, d_qk, d_v))
        with poisoned_outputs():
            repeats.append(attn(q, k, v, descales, case.layout, p_mode))

    qd, kd, vd = (1.0 if d is None else d for d in descales)
    model_out, model_lse = numerics.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True,
                                              **model_settings(kernel, backend))
    ref_out, ref_lse = attention_fp64(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True)
    out_b = as_bshd(out, case.layout)
    finite = bool(torch.isfinite(out).all() and torch.isfinite(lse).all())
    result = {
        "case": case.label, **dataclasses.asdict(case), "d_qk": d_qk, "d_v": d_v, "kernel": kernel.name,
        "p_mode": kernel.p_mode, "model": model_settings(kernel, backend), "backend": backend,
        "backend_ok": backend == expected,
        "out_shape": list(out.shape), "lse_shape": list(lse.shape),
        "finite": finite,
        "max_ulps_vs_model": float(bf16_ulps(out_b, model_out).max()),
        "frac_differing_vs_model": float((out_b.float() != model_out.float()).double().mean()),
        "rel_rms_vs_model": rel_rms(out_b, model_out),
        "lse_vs_model": float(((lse - model_lse).abs() / (1 + model_lse.abs())).max()),
        "max_lse_diff_vs_model": float((lse - model_lse).abs().max()),
        "rel_rms_vs_fp64": rel_rms(out_b, ref_out),
        "model_rel_rms_vs_fp64": rel_rms(model_out, ref_out),
        "max_lse_diff_vs_fp64": float((lse.double() - ref_lse).abs().max()),
        "deterministic": all(bitwise_equal(o, out) and bitwise_equal(l_, lse) for o, l_ in repeats),
    }
    expected_shape = (case.batch, case.seqlen, case.heads, d_v)
    if tuple(out_b.shape) != expected_shape or tuple(lse.shape) != (case.batch, case.heads, case.seqlen):
        result["finite"] = False  # a wrong shape cannot be compared: fail it with the coverage check
    result["failed"] = cfg.verdict(result)
    result["ok"] = not result["failed"]
    return result


GRAPH_CASE = cfg.Case(2, 1024, 8, 2, "bshd", "gaussian", "per_kv_head")
COMPILE_CASE = cfg.Case(1, 1000, 4, 2, "bshd", "gaussian", "per_kv_head")


def check_graph(kernel, descale_form: str) -> dict:
    """A call captured in a graph after a first eager call replays correctly with new inputs and new descale
    values written into the captured tensors (descales are read on the device, never baked in)."""
    case = dataclasses.replace(GRAPH_CASE, descale=descale_form)
    (q, k, v), descales = fp8_inputs(case, kernel.d_qk, kernel.d_v, seed=1)
    first_out, _ = attn(q, k, v, descales, "bshd")  # first call of the shape: uploads the job table
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_out, captured_lse = attn(q, k, v, descales, "bshd")
    (q2, k2, v2), descales2 = fp8_inputs(case, kernel.d_qk, kernel.d_v, seed=2)
    for dst, src in zip((q, k, v, *descales), (q2, k2, v2, *descales2), strict=True):
        dst.copy_(src)
    graph.replay()
    eager_out, eager_lse = attn(q, k, v, descales, "bshd")
    torch.cuda.synchronize()
    replayed = bitwise_equal(captured_out, eager_out) and bitwise_equal(captured_lse, eager_lse)
    changed = not bitwise_equal(captured_out, first_out)
    return {"d_qk": kernel.d_qk, "descale": descale_form, "replay_equals_eager": replayed,
            "new_inputs_used": changed, "ok": bool(replayed and changed)}


def check_compile(kernel, descale_form: str) -> dict:
    """torch.compile(fullgraph=True) of the public call (padding inside the graph) equals the eager call."""
    case = dataclasses.replace(COMPILE_CASE, descale=descale_form)
    (q, k, v), descales = fp8_inputs(case, kernel.d_qk, kernel.d_v, seed=3)

    def fn(q, k, v, qd, kd, vd):
        return zyfa.flash_attn_func(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    c_out, c_lse = compiled(q, k, v, *descales)
    e_out, e_lse = fn(q, k, v, *descales)
    return {"d_qk": kernel.d_qk, "descale": descale_form,
            "ok": bool(bitwise_equal(c_out, e_out) and bitwise_equal(c_lse, e_lse))}


def check_large(kernel) -> dict:
    """q and out over 4 GiB (each (batch, head) slice stays under the kernels' 32-bit offsets; the per-job base
    addresses are 64-bit): the rows of the last batch's last two GQA groups equal a run on a small copy of them."""
    batch, seqlen, heads, heads_k = 8, 16384, 288, 8
    g = torch.Generator(device=DEVICE).manual_seed(4)

    def make(h, d):
        t = torch.empty(batch, seqlen, h, d, dtype=FP8, device=DEVICE)
        for b in range(batch):  # one batch at a time keeps the float32 temporary small
            t[b] = torch.randn(seqlen, h, d, generator=g, device=DEVICE).to(FP8)
        return t

    q, k, v = make(heads, kernel.d_qk), make(heads_k, kernel.d_qk), make(heads_k, kernel.d_v)
    descales = tuple(torch.full((batch, heads_k), 0.25, device=DEVICE) for _ in range(3))
    out, _ = attn(q, k, v, descales, "bshd")
    b, group = batch - 1, heads // heads_k
    h = slice(heads - 2 * group, heads)
    small_descales = tuple(d[b:, -2:].contiguous() for d in descales)
    small, _ = attn(q[b:, :, h].contiguous(), k[b:, :, -2:].contiguous(), v[b:, :, -2:].contiguous(),
                    small_descales, "bshd")
    result = {"d_qk": kernel.d_qk, "q_bytes": q.numel() * q.element_size(),
              "out_bytes": out.numel() * out.element_size(),
              "ok": bool(torch.isfinite(out[b:, :, h]).all() and bitwise_equal(out[b:, :, h].contiguous(), small))}
    del q, k, v, out
    torch.cuda.empty_cache()
    return result


def device_report(backend: str) -> dict:
    report = {"device": "cpu", "arch": None, "torch": torch.__version__, "hip": getattr(torch.version, "hip", None),
              "zyfa": zyfa.__version__}
    if on_gpu():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        report.update(device=props.name, arch=getattr(props, "gcnArchName", None))
    if backend == TARGET:
        try:
            report["device_info"] = zyfa_kernels.device_info(TARGET, torch.cuda.current_device())
        except Exception as error:  # reported, not fatal: the checks below say whether the kernels run
            report["device_info_error"] = f"{type(error).__name__}: {error}"
    return report


def guarded(fn, *args, **info) -> dict:
    """fn(*args), or a failed result naming the exception (one broken check does not hide the others)."""
    try:
        return fn(*args)
    except Exception as error:
        text = str(error).strip()
        message = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
        sync_error = None
        try:
            sync()
        except Exception as later:  # an asynchronous device error surfaces here
            sync_error = f"{type(later).__name__}: {later}"
        return {**info, "ok": False, "error": message, "failed": [message], "sync_error": sync_error}


def print_results(report: dict) -> int:
    failures = 0
    print(f"{'d':>7} {'kernel':<14} {'case':<44} {'diff%':>7} {'rms/model':>9} {'lse/model':>9} {'vs fp64':>8} "
          f"{'model':>8} {'lse64':>7} det ok")
    for r in report["accuracy"]:
        failures += not r["ok"]
        if "error" in r:
            print(f"{r['d_qk']:>3}/{r['d_v']:<3} {r.get('kernel', ''):<14} {r['case']:<44} ERROR {r['error']}")
            continue
        print(f"{r['d_qk']:>3}/{r['d_v']:<3} {r['kernel']:<14} {r['case']:<44} "
              f"{100 * r['frac_differing_vs_model']:>7.4f} "
              f"{r['rel_rms_vs_model']:>9.2e} {r['lse_vs_model']:>9.1e} {r['rel_rms_vs_fp64']:>8.2e} "
              f"{r['model_rel_rms_vs_fp64']:>8.2e} {r['max_lse_diff_vs_fp64']:>7.4f} {r['deterministic']:d}   "
              f"{r['ok']:d}{'  ' + '; '.join(r['failed']) if r['failed'] else ''}")
    failures += print_items(report)
    for key in ("graph", "compile", "large"):
        if key in report.get("skipped", {}):
            print(f"{key}: skipped ({report['skipped'][key]})")
    print(f"gpu_check_gfx950 ({report['backend']} backend on {report['device']}): {failures} failure(s) in "
          f"{report['seconds']:.0f} s")
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out")
    ap.add_argument("--small", action="store_true", help="one small configuration per kernel")
    ap.add_argument("--expect-backend", default=TARGET, choices=(TARGET, "reference"),
                    help="the backend the public call must use (reference: a rehearsal with ZYFA_BACKEND=reference)")
    args = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    started = time.time()
    backend = backend_in_use()
    report = {**device_report(backend), "backend": backend, "expected_backend": args.expect_backend}
    kernels = gfx950_kernels()
    report["kernels"] = {f"{dq}/{dv}": {"name": k.name, "p_mode": k.p_mode, "tile_m": k.tile_m, "tile_n": k.tile_n,
                                        "scale_block": k.scale_block, "tau": k.rescale_threshold}
                         for (dq, dv), k in kernels.items()}
    missing = [dims for dims in cfg.HEAD_DIMS if dims not in kernels]
    if missing:
        print(f"gpu_check_gfx950: the manifest has no gfx950 FP8 kernel for {missing}", file=sys.stderr)
        return 1
    report["accuracy"] = [
        guarded(check_case, case, kernels[dims], backend, args.expect_backend, i, case=case.label, d_qk=dims[0],
                d_v=dims[1])
        for i, (case, dims) in enumerate(cfg.check_configurations(args.small))]
    report["accuracy"] += [
        guarded(check_case, case, kernel, backend, args.expect_backend, i, case=case.label, d_qk=dims[0], d_v=dims[1])
        for kernel in other_kernels()
        for i, (case, dims) in enumerate(cfg.check_configurations(args.small)) if dims == (kernel.d_qk, kernel.d_v)]
    report["skipped"] = {}
    if not args.small:
        report["graph"] = [guarded(check_graph, kernels[dims], form, d_qk=dims[0], descale=form)
                           for dims in cfg.HEAD_DIMS for form in ("per_kv_head", "one_element")]
        report["compile"] = [guarded(check_compile, kernels[dims], form, d_qk=dims[0], descale=form)
                             for dims in cfg.HEAD_DIMS for form in ("per_kv_head", "float")]
        if backend == TARGET:
            report["large"] = [guarded(check_large, kernels[dims], d_qk=dims[0]) for dims in cfg.HEAD_DIMS]
        else:
            report["skipped"]["large"] = "the reference backend is far too slow for tensors over 4 GiB"
    report["seconds"] = time.time() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = cfg.CHECK_JSON.replace(".json", "_small.json") if args.small else cfg.CHECK_JSON
    (out / name).write_text(json.dumps(report, indent=1))
    return 1 if print_results(report) else 0


if __name__ == "__main__":
    sys.exit(main())
