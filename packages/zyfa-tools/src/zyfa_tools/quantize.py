"""FP8 inputs for ZYFA: rotate q and k, smooth k, quantize q, k, v with power-of-two scales, call ZYFA.

One pass per tensor: `rotate_quantize` reads x (BF16, any strides), rotates it, subtracts the key mean, scales,
saturates to e4m3's range and writes FP8, with the scales either given (static, no reduction at run time) or
taken from the rotated tensor's amax per (batch, kv head) (per call). On a GPU the pass runs under torch.compile
so that these steps fuse; `python -m zyfa_tools.quantize` times it against the attention call it feeds.

Scales are powers of two (as zyfa.fp8_quantize), so scaling is exact and e4m3 rounding is the only error; one
scale per (batch, kv head) and tensor, shared by a GQA group's query heads (the descale shape ZYFA takes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from functools import cache, partial

import torch

from zyfa import flash_attn_func
from zyfa.quant import E4M3_MAX, E4M3_MAX_EXPONENT, E4M3_MAX_MANTISSA, SCALE_EXPONENT_LIMIT

from .rotation import rotation_matrix

FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class Recipe:
    """How q, k and v become FP8: rotation of q and k (seeded), K smoothing, scales per call or static."""

    rotation: bool = True
    smoothing: bool = True
    seed: int = 0

    def describe(self) -> str:
        parts = [name for name, on in (("rotation", self.rotation), ("smoothing", self.smoothing)) if on]
        return " + ".join(parts) or "plain"


DEFAULT_RECIPE = Recipe()


def pow2_scales(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, descale) = (2^s, 2^-s), s the largest integer with amax * 2^s <= 448 (as zyfa.fp8_quantize)."""
    mantissa, exponent = torch.frexp(amax.float())
    s = E4M3_MAX_EXPONENT - exponent - (mantissa > E4M3_MAX_MANTISSA).to(exponent.dtype)
    s = s.clamp(-SCALE_EXPONENT_LIMIT, SCALE_EXPONENT_LIMIT).float()
    return torch.exp2(s), torch.exp2(-s)


def _grouped(x: torch.Tensor, heads_k: int) -> torch.Tensor:
    """(batch, seqlen, heads, d) as a (batch, seqlen, heads_k, group, d) view."""
    b, s, h, d = x.shape
    if h % heads_k:
        raise ValueError(f"x has {h} heads: not a multiple of heads_k={heads_k}")
    return x.view(b, s, heads_k, h // heads_k, d)  # splitting one dimension: a view for any strides


def _rotate_quantize(x, rotation, smooth, mean, scale):
    """x (batch, seqlen, heads_k, group, d); rotation (d, d) or None; smooth: subtract `mean` ((..., heads_k, 1,
    d)) or, if None, the mean over the sequence; scale float32 (batch, heads_k) or None (per call: from the
    amax). Returns (x8 contiguous (batch, seqlen, heads, d), descale float32 (batch, heads_k))."""
    y = x.float()
    if rotation is not None:
        y = y @ rotation
    if smooth:
        y = y - (y.mean(dim=1, keepdim=True) if mean is None else mean)
    if scale is None:
        scale, descale = pow2_scales(y.abs().amax(dim=(1, 3, 4)))
    else:
        descale = 1.0 / scale
    x8 = (y * scale[:, None, :, None, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return x8.flatten(2, 3).contiguous(), descale  # written in ZYFA's layout even from transposed views


_compiled = None


def rotate_quantize(x: torch.Tensor, heads_k: int, *, rotation=None, smooth=False, mean=None, scale=None,
                    compile=None):
    """FP8 of x (batch, seqlen, heads, d) after rotation and mean subtraction, in one pass over x.

    rotation: (d, d) float32 or None. smooth=True subtracts `mean` (float32 (heads_k, d) or (batch, 1, heads_k,
    d): the key mean in the rotated space, fixed in advance) or, if mean is None, the mean over this x's
    sequence per (batch, kv head) (zyfa_tools.smoothing.smooth_keys after the rotation). scale: float32
    (batch, heads_k) powers of two (static) or None (from this x's amax). Values beyond e4m3's range saturate
    at +-448. Returns (x8 (batch, seqlen, heads, d), descale float32 (batch, heads_k)). compile=None compiles
    on CUDA devices only (on the CPU, compiling costs more than it saves at the sizes the CPU runs).
    """
    global _compiled
    g = _grouped(x, heads_k)
    if mean is not None:  # (heads_k, d) or (batch, 1, heads_k, d) -> broadcastable to the grouped x
        mean = mean.float().reshape(-1, 1, heads_k, 1, x.shape[-1]) if mean.dim() == 4 else mean.float()[:, None]
    use_compile = x.is_cuda if compile is None else compile
    fn = _rotate_quantize
    if use_compile:
        if _compiled is None:
            _compiled = torch.compile(_rotate_quantize)  # dynamic after the first new shape: one graph per kind
        fn = _compiled
    return fn(g, rotation, smooth, mean, scale)


@cache
def _rotation(d: int, device: str, seed: int) -> torch.Tensor:
    return rotation_matrix(d, device, seed)


def rotation_for(d: int, device, seed: int) -> torch.Tensor:
    """The rotation of head dim d on `device` (made once per process)."""
    return _rotation(d, str(torch.device(device)), seed)


def prepare(q, k, v, recipe: Recipe = DEFAULT_RECIPE, layer_scales=None, compile=None):
    """FP8 q, k, v (batch, seqlen, heads, d) and their descales for ZYFA, following `recipe`.

    layer_scales: a calibration.LayerScales (static scales and key mean, calibrated with the same recipe) or
    None (scales and key mean from these tensors). Returns (q8, k8, v8, descales dict for flash_attn_func).
    """
    heads_k = k.shape[2]
    rotation = rotation_for(q.shape[-1], q.device, recipe.seed) if recipe.rotation else None
    static = layer_scales is not None
    if static:
        layer_scales.check(recipe, heads_k, q.shape[-1], v.shape[-1])
        s = {name: pow2_scales(amax.to(q.device))[0].expand(q.shape[0], heads_k)
             for name, amax in (("q", layer_scales.q_amax), ("k", layer_scales.k_amax), ("v", layer_scales.v_amax))}
    mean = layer_scales.k_mean.to(k.device) if static and recipe.smoothing else None
    q8, qd = rotate_quantize(q, heads_k, rotation=rotation, scale=s["q"] if static else None, compile=compile)
    k8, kd = rotate_quantize(k, heads_k, rotation=rotation, smooth=recipe.smoothing, mean=mean,
                             scale=s["k"] if static else None, compile=compile)
    v8, vd = rotate_quantize(v, heads_k, scale=s["v"] if static else None, compile=compile)
    return q8, k8, v8, {"q_descale": qd.contiguous(), "k_descale": kd.contiguous(), "v_descale": vd.contiguous()}


def fp8_attention(q, k, v, recipe: Recipe = DEFAULT_RECIPE, *, softmax_scale=None, layer_scales=None, compile=None):
    """Causal ZYFA FP8 attention of BF16 (or float) q, k, v (batch, seqlen, heads, d) prepared by `prepare`.

    Returns the BF16 output (batch, seqlen, heads, d_v) of q's rotated, k's rotated and smoothed, v's plain FP8.
    """
    q8, k8, v8, descales = prepare(q, k, v, recipe, layer_scales, compile)
    return flash_attn_func(q8, k8, v8, softmax_scale=softmax_scale, causal=True, **descales)


def _median_ms(fn, repeat: int, device: str) -> float:
    for _ in range(3):
        fn()
    if device == "cpu":  # for checking the script: CPU times of the reference path mean nothing for a GPU
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return sorted(times)[repeat // 2]
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))[repeat // 2]


def _attention_calls(q, k, v, q8, k8, v8, descales) -> dict:
    """The attention calls the pass is compared with: ZYFA BF16 and FP8, and FA3's FP8 forward where the
    fa3_fwd package is installed (an FP8 call of the same shape on a GPU where ZYFA has no FP8 kernel yet)."""
    calls = {"zyfa_bf16": lambda: flash_attn_func(q, k, v, causal=True),
             "zyfa_fp8": lambda: flash_attn_func(q8, k8, v8, causal=True, **descales)}
    try:
        import fa3_fwd_interface
    except ImportError:
        return calls
    calls["fa3_fp8"] = lambda: fa3_fwd_interface.flash_attn_func(q8, k8, v8, causal=True, **descales)
    return calls


def time_preparation(seqlen: int, *, batch=1, heads=32, heads_k=8, d_qk=128, d_v=None, repeat=50,
                     mode: str | None = None, device: str = "cuda") -> dict:
    """Median times (ms) of preparing FP8 q, k, v from BF16 (per call and static scales, compiled with
    torch.compile `mode` and eager) and of the attention calls they feed; the compiled pass's bytes are compared
    with the eager pass's. An attention call that fails (no kernel for it on this GPU) is reported as an error."""
    global _compiled
    from .calibration import Calibrator

    d_v = d_qk if d_v is None else d_v
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, seqlen, heads, d_qk, device=device, generator=gen).bfloat16()
    k = torch.randn(batch, seqlen, heads_k, d_qk, device=device, generator=gen).bfloat16() + 2.0
    v = torch.randn(batch, seqlen, heads_k, d_v, device=device, generator=gen).bfloat16()
    calibrator = Calibrator(DEFAULT_RECIPE)
    calibrator.observe(0, q, k, v)
    static = calibrator.scales()[0]
    torch._dynamo.reset()
    _compiled = torch.compile(_rotate_quantize, dynamic=False, mode=mode)
    result = {"seqlen": seqlen, "batch": batch, "heads": heads, "heads_k": heads_k, "d_qk": d_qk, "d_v": d_v,
              "compile_mode": mode or "default"}
    timed = partial(_median_ms, repeat=repeat, device=device)
    for name, layer_scales in (("per_call", None), ("static", static)):
        for compiled in (True, False):
            key = f"prepare_{name}_{'compiled' if compiled else 'eager'}_ms"
            result[key] = timed(partial(prepare, q, k, v, layer_scales=layer_scales, compile=compiled))
        a = prepare(q, k, v, layer_scales=layer_scales, compile=True)
        b = prepare(q, k, v, layer_scales=layer_scales, compile=False)
        result[f"prepare_{name}_mismatch_fraction"] = max(
            (x.view(torch.uint8) != y.view(torch.uint8)).double().mean().item()
            for x, y in zip(a[:3], b[:3], strict=True))
        result[f"prepare_{name}_descales_equal"] = all(torch.equal(a[3][n], b[3][n]) for n in a[3])
    moved = (q.numel() + k.numel() + v.numel()) * 3  # BF16 read, FP8 written
    for name in ("per_call", "static"):
        result[f"prepare_{name}_gbps"] = moved / result[f"prepare_{name}_compiled_ms"] / 1e6
    q8, k8, v8, descales = prepare(q, k, v, compile=True)
    for call, fn in _attention_calls(q, k, v, q8, k8, v8, descales).items():
        try:
            ms = timed(fn)
        except Exception as error:  # reported, not hidden: e.g. no FP8 kernel for this GPU in this version
            result[f"{call}_error"] = f"{type(error).__name__}: {error}"
            continue
        result[f"{call}_ms"] = ms
        for name in ("per_call", "static"):
            result[f"prepare_{name}_vs_{call}"] = result[f"prepare_{name}_compiled_ms"] / ms
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zyfa_tools.quantize",
        description="Time the fused rotate-and-quantize pass (q, k rotated, k smoothed, q, k, v to FP8) against "
                    "the attention calls it feeds (ZYFA BF16 and FP8, FA3 FP8 where fa3_fwd is installed) on a CUDA "
                    "GPU.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Per call: scales from each tensor's amax (a reduction, then the quantizing pass). Static: scales "
               "from a calibration (one pass).\nReported: median ms over --repeat CUDA-event timings, the pass "
               "relative to each attention call, its bandwidth\n(BF16 read + FP8 written), and whether the "
               "compiled pass gives the eager pass's bytes. JSON lines go to stdout.",
    )
    parser.add_argument("--seqlen", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--heads-k", type=int, default=8)
    parser.add_argument("--d-qk", type=int, default=128, choices=(128, 192))
    parser.add_argument("--d-v", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--mode", nargs="+", default=["default", "max-autotune-no-cudagraphs"],
                        help="torch.compile modes to time (default: both of these)")
    parser.add_argument("--json", metavar="PATH", help="also write all results to PATH")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu only checks the script on small shapes: its times say nothing about a GPU")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: the timing needs one (--device cpu only checks the script)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {name}", file=sys.stderr)
    results = []
    for mode in args.mode:
        for seqlen in args.seqlen:
            r = time_preparation(seqlen, batch=args.batch, heads=args.heads, heads_k=args.heads_k, d_qk=args.d_qk,
                                 d_v=args.d_v, repeat=args.repeat, mode=None if mode == "default" else mode,
                                 device=args.device)
            results.append(r)
            print(json.dumps(r), flush=True)
            if args.json:  # after every measurement: a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump({"torch": torch.__version__, "device": name, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
