"""Attention on this machine: a short benchmark on a GPU, else the reference path on the CPU.

    python -m zyfa_tools.demo                                   # BF16 and FP8, activation-like inputs
    python -m zyfa_tools.demo --seqlen 8192 --heads 32 --heads-k 8 --inputs gaussian

Runs zyfa.flash_attn_func (causal) on BF16 and FP8 inputs and prints, per dtype, the time of one call, the
throughput by the benchmark protocol (batch * heads * seqlen^2 * (d_qk + d_v) / time) and the relative RMS error
against float64 attention on the same inputs. On a GPU the time is the mean over --iters calls after as many
warm-up calls (CUDA events); on the CPU it is one call of the reference backend.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import zyfa

from . import inputs
from .reference import attention_fp64, relative_rms_error

GENERATORS = {"gaussian": inputs.gaussian, "activation": inputs.activation_like}
DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
CPU_SEQLEN, GPU_SEQLEN = 1024, 8192


def _time_call(call, device: torch.device, iters: int) -> float:
    """Seconds per call."""
    if device.type == "cpu":
        start = time.perf_counter()
        call()
        return time.perf_counter() - start
    for _ in range(iters):
        call()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(iters):
        call()
    end.record()
    torch.cuda.synchronize(device)
    return begin.elapsed_time(end) / 1000 / iters


def run(dtype_name: str, args, device: torch.device) -> dict:
    """One dtype: time, throughput and error of flash_attn_func on `device`."""
    q, k, v = GENERATORS[args.inputs](1, args.seqlen, args.heads, args.heads_k, args.d_qk, 128, seed=args.seed)
    q, k, v, descales = inputs.quantize(q, k, v, DTYPES[dtype_name])
    q, k, v = (t.to(device) for t in (q, k, v))
    descales = {name: d.to(device) for name, d in descales.items()}

    def call():
        return zyfa.flash_attn_func(q, k, v, causal=True, **descales)

    out = call()
    seconds = _time_call(call, device, args.iters)
    error = relative_rms_error(out, attention_fp64(q, k, v, **descales))
    flops = args.heads * args.seqlen**2 * (args.d_qk + 128)
    return {"dtype": dtype_name, "ms": seconds * 1e3, "tflops": flops / seconds / 1e12, "error": error}


@torch.no_grad()
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zyfa_tools.demo", description=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlen", type=int, help=f"default {CPU_SEQLEN} on the CPU, {GPU_SEQLEN} on a GPU")
    parser.add_argument("--heads", type=int, default=8, help="query heads (batch is 1)")
    parser.add_argument("--heads-k", type=int, default=2, help="key/value heads")
    parser.add_argument("--d-qk", type=int, default=128, choices=(128, 192), help="query/key head dim (d_v is 128)")
    parser.add_argument("--inputs", default="activation", choices=list(GENERATORS), help="see zyfa_tools.inputs")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--iters", type=int, default=20, help="timed calls on a GPU (after as many warm-up calls)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.seqlen = args.seqlen or (CPU_SEQLEN if device.type == "cpu" else GPU_SEQLEN)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (reference backend)"
    print(f"zyfa {zyfa.__version__} on {where}: causal, S={args.seqlen}, heads {args.heads}/{args.heads_k}, "
          f"d={args.d_qk}/128, {args.inputs} inputs")
    for dtype_name in args.dtypes:
        r = run(dtype_name, args, device)
        print(f"  {r['dtype']:5s} {r['ms']:10.2f} ms  {r['tflops']:9.3g} TFLOP/s  error vs fp64 {r['error']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
