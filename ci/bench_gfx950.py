"""Benchmark of the gfx950 FP8 kernels (and the BF16 ones, contender zyfa_bf16) against the peers available on ROCm,
in the same run (the protocol of
docs/design.md, with fewer repetitions when asked: see --calls, --warmup, --rounds): torch SDPA in BF16 (flash or
memory-efficient backend; the math fallback is not a peer) and AITER's FP8 attention when the `aiter` package is
importable (otherwise skipped, with the reason in the results).

Causal, batch 1, S in --seqlens, max(32, 262144/S) query heads, MHA and GQA 4:1, Gaussian q/k/v with std 0.1,
throughput = B H S^2 (d_qk + d_v) / time, kernel-only device time (zyfa_tools.bench.protocol.Clock: graph replays
of `calls` calls after `warmup` calls; torch.profiler's kernel times for a contender that cannot be captured),
contenders in rotated order over `rounds` rounds, the median round reported; 5 s idle before S >= 16K.
Sustained-clock mode on activation-like inputs at --sustained-seqlens: per repetition 2 s idle, 1 s of
back-to-back calls, >= 3 s timed; median of 3. Also the relative RMS error against float64 of each contender on
its own inputs (--error-heads heads, S <= --error-max-seqlen).

    python -m ci.bench_gfx950 --out DIR [--seqlens 2048 8192 ...] [--head-dims 128,192] [--sustained-seqlens]
Writes DIR/bench_gfx950.json and DIR/bench_gfx950.md and prints the table last.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import zyfa
from zyfa import backends
from zyfa_tools import inputs
from zyfa_tools.bench import protocol
from zyfa_tools.bench.protocol import Clock, Sustained, causal_flops
from zyfa_tools.reference import attention_fp64
from zyfa_tools.reference import relative_rms_error as rel_rms

from . import gfx950_validation as cfg

FP8 = torch.float8_e4m3fn
DEVICE = "cuda"
STD = 0.1
CLOCK = Clock(torch.device(DEVICE))


def add_protocol_arguments(ap, seqlens) -> None:
    """The benchmark protocol's options (docs/design.md; the defaults are zyfa_tools.bench.protocol's)."""
    ap.add_argument("--out", default="out")
    ap.add_argument("--seqlens", type=int, nargs="+", default=list(seqlens))
    ap.add_argument("--head-dims", default="128,192", help="d_qk values to run (d_v = 128)")
    ap.add_argument("--calls", type=int, default=protocol.CALLS, help="timed calls per measurement")
    ap.add_argument("--warmup", type=int, default=protocol.WARMUP, help="warm-up calls before them")
    ap.add_argument("--rounds", type=int, default=protocol.ROUNDS, help="rounds, the order of the contenders rotated")
    ap.add_argument("--idle", type=float, default=protocol.IDLE_BEFORE_LONG_S,
                    help=f"seconds idle before S >= {protocol.LONG_SEQLEN}")
    ap.add_argument("--error-heads", type=int, default=4, help="query heads of the fp64 error measurement")
    ap.add_argument("--error-max-seqlen", type=int, default=8192, help="longest S whose error is measured")


def sync() -> None:
    if torch.device(DEVICE).type == "cuda":
        torch.cuda.synchronize()


def find_aiter():
    """(AITER's per-tensor FP8 attention function, version) or (None, why not)."""
    try:
        import aiter
    except Exception as error:  # not installed, or fails to load on this machine
        return None, f"aiter is not importable ({first_line(error)})"
    fn = getattr(aiter, "flash_attn_fp8_pertensor_func", None)
    if fn is None:
        return None, "aiter has no flash_attn_fp8_pertensor_func"
    return fn, getattr(aiter, "__version__", "(version unknown)")


class Problem:
    """One configuration's inputs for every contender: BF16 (batch, heads, seqlen, dim) for SDPA; the same values in
    FP8 with one power-of-two descale per tensor, (batch, heads, seqlen, dim) for ZYFA (layout="bhsd", descales as a
    contiguous (batch, heads_k) tensor, so a call launches the kernel alone) and (batch, seqlen, heads, dim) for
    AITER (its layout; one-element descales)."""

    def __init__(self, q, k, v):  # float32 (batch, seqlen, heads, dim) on the GPU
        batch, heads_k = k.shape[0], k.shape[2]
        self.bf16 = tuple(t.to(torch.bfloat16).transpose(1, 2).contiguous() for t in (q, k, v))
        quantized = [zyfa.fp8_quantize(t) for t in (q, k, v)]
        self.fp8_bshd = tuple(x8 for x8, _ in quantized)
        self.fp8_bhsd = tuple(x8.transpose(1, 2).contiguous() for x8 in self.fp8_bshd)
        self.descale_one = tuple(d for _, d in quantized)
        self.descale_kv = tuple(d.reshape(1, 1).expand(batch, heads_k).contiguous() for d in self.descale_one)
        self.d_qk = q.shape[-1]

    def first_heads(self, heads: int) -> Problem:
        """The same problem on the first `heads` query heads and their KV heads."""
        kv = -(-heads // (self.bf16[0].shape[1] // self.bf16[1].shape[1]))
        counts = (heads, kv, kv)
        sub = copy.copy(self)
        sub.bf16 = tuple(t[:, :n].contiguous() for t, n in zip(self.bf16, counts, strict=True))
        sub.fp8_bhsd = tuple(t[:, :n].contiguous() for t, n in zip(self.fp8_bhsd, counts, strict=True))
        sub.fp8_bshd = tuple(t[:, :, :n].contiguous() for t, n in zip(self.fp8_bshd, counts, strict=True))
        sub.descale_kv = tuple(d[:, :kv].contiguous() for d in self.descale_kv)
        return sub

    def zyfa(self):
        q, k, v = self.fp8_bhsd
        qd, kd, vd = self.descale_kv
        return zyfa.flash_attn_func(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd, layout="bhsd")

    def zyfa_bf16(self):  # the BF16 kernels on the peers' BF16 inputs
        q, k, v = self.bf16
        return zyfa.flash_attn_func(q, k, v, causal=True, layout="bhsd")

    def sdpa(self):
        q, k, v = self.bf16
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])

    def aiter(self, fn):
        q, k, v = self.fp8_bshd
        return fn(q, k, v, *self.descale_one, causal=True, softmax_scale=self.d_qk ** -0.5)


def gaussian_problem(seqlen, heads, heads_k, d_qk, d_v, seed=0) -> Problem:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(1, seqlen, heads, d_qk, generator=g, device=DEVICE) * STD
    k = torch.randn(1, seqlen, heads_k, d_qk, generator=g, device=DEVICE) * STD
    v = torch.randn(1, seqlen, heads_k, d_v, generator=g, device=DEVICE) * STD
    return Problem(q, k, v)


def activation_problem(seqlen, heads, heads_k, d_qk, d_v, seed=0) -> Problem:
    q, k, v = inputs.activation_like(1, seqlen, heads, heads_k, d_qk, d_v, seed=seed)
    return Problem(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE))


def contenders(p: Problem, aiter_fn) -> dict:
    runs = {"zyfa": p.zyfa, "zyfa_bf16": p.zyfa_bf16, "sdpa": p.sdpa}
    if aiter_fn is not None:
        runs["aiter"] = lambda: p.aiter(aiter_fn)
    return runs


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def probe(runs: dict, declined: dict) -> list[str]:
    """Contenders that run on this configuration (one call each); the others go to `declined` with the reason."""
    names = []
    for name, fn in runs.items():
        try:
            fn()
            sync()
            names.append(name)
        except Exception as error:  # a peer that declines the shape (or fails): reported, not fatal
            declined[name] = first_line(error)
            print(f"  {name}: {declined[name]}", file=sys.stderr)
    return names


def errors(p: Problem, names: list[str], heads: int, aiter_fn) -> dict:
    """Relative RMS error against float64 on each contender's own inputs, first `heads` query heads."""
    sub = p.first_heads(heads)
    fp8_ref = attention_fp64(*sub.fp8_bshd, q_descale=p.descale_one[0], k_descale=p.descale_one[1],
                             v_descale=p.descale_one[2])
    bf16_ref = attention_fp64(*(t.transpose(1, 2) for t in sub.bf16))
    outputs = {"zyfa": (lambda: sub.zyfa().transpose(1, 2), fp8_ref),
               "zyfa_bf16": (lambda: sub.zyfa_bf16().transpose(1, 2), bf16_ref),
               "sdpa": (lambda: sub.sdpa().transpose(1, 2), bf16_ref),
               "aiter": (lambda: sub.aiter(aiter_fn), fp8_ref)}
    result = {}
    for name in names:
        run, ref = outputs[name]
        try:
            result[name] = rel_rms(run(), ref)
        except Exception as error:  # measured where it runs; the timing already says whether it declines
            print(f"  error of {name}: {first_line(error)}", file=sys.stderr)
    return result


def bench_config(c: dict, args, aiter_fn) -> dict:
    p = gaussian_problem(c["seqlen"], c["heads"], c["heads_k"], c["d_qk"], c["d_v"])
    row = {**c, "inputs": "gaussian", "calls": cfg.calls_for(c["seqlen"], args.calls),
           "warmup": cfg.calls_for(c["seqlen"], args.warmup), "ms": {}, "tflops": {}, "timing": {}, "declined": {}}
    runs = contenders(p, aiter_fn)
    names = probe(runs, row["declined"])
    times = {name: [] for name in names}
    for rnd in range(args.rounds):
        for name in cfg.rotated([n for n in names if n not in row["declined"]], rnd):
            try:
                ms, how = CLOCK.kernel_ms(runs[name], row["calls"], row["warmup"])
            except Exception as error:
                row["declined"][name] = first_line(error)
                continue
            times[name].append(ms)
            row["timing"][name] = how
    flops = causal_flops(c["batch"], c["heads"], c["seqlen"], c["d_qk"], c["d_v"])
    for name, ts in times.items():
        if ts and name not in row["declined"]:
            row["ms"][name] = statistics.median(ts)
            row["tflops"][name] = cfg.tflops(flops, row["ms"][name])
    if c["seqlen"] <= args.error_max_seqlen:
        row["rel_rms_vs_fp64"] = errors(p, [n for n in names if n not in row["declined"]], args.error_heads,
                                        aiter_fn)
    return row


def sustained_config(c: dict, aiter_fn, protocol: Sustained) -> dict:
    p = activation_problem(c["seqlen"], c["heads"], c["heads_k"], c["d_qk"], c["d_v"])
    row = {**c, "inputs": "activation", "ms": {}, "tflops": {}, "declined": {}}
    runs = contenders(p, aiter_fn)
    flops = causal_flops(c["batch"], c["heads"], c["seqlen"], c["d_qk"], c["d_v"])
    for name in probe(runs, row["declined"]):
        try:
            ms = statistics.median(CLOCK.sustained_ms(runs[name], protocol))
        except Exception as error:
            row["declined"][name] = first_line(error)
            continue
        row["ms"][name] = ms
        row["tflops"][name] = cfg.tflops(flops, ms)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_protocol_arguments(ap, cfg.SEQLENS)
    ap.add_argument("--sustained-seqlens", type=int, nargs="*", default=list(cfg.SUSTAINED_SEQLENS),
                    help="S of the sustained-clock runs on activation-like inputs (none: skip them)")
    ap.add_argument("--heads", type=int, help="query heads instead of the protocol's (for a quick rehearsal)")
    ap.add_argument("--quick-sustained", action="store_true",
                    help="a tenth of the sustained-clock durations, one repetition (a rehearsal, not the protocol)")
    args = ap.parse_args(argv)
    sustained_protocol = Sustained().shortened(10) if args.quick_sustained else Sustained()

    wanted = {int(d) for d in args.head_dims.split(",")}
    dims = [d for d in cfg.HEAD_DIMS if d[0] in wanted]
    aiter_fn, aiter_info = find_aiter()
    if aiter_fn is None:
        print(f"AITER skipped: {aiter_info}", file=sys.stderr)

    def configs(seqlens):
        out = cfg.bench_configurations(seqlens, dims)
        if args.heads:
            for c in out:
                c["heads_k"] = args.heads if c["heads_k"] == c["heads"] else max(1, args.heads // cfg.GQA_GROUP)
                c["heads"] = args.heads
        return out

    on_gpu = torch.device(DEVICE).type == "cuda"
    device = torch.device(DEVICE, torch.cuda.current_device()) if on_gpu else torch.device(DEVICE)
    backend = backends.backend_name(backends.describe(device), os.environ.get(backends.BACKEND_ENV, ""))
    rows = []
    for c in configs(args.seqlens):
        if c["seqlen"] >= cfg.LONG_SEQLEN:
            time.sleep(args.idle)
        rows.append(bench_config(c, args, aiter_fn))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    sustained = []
    for c in configs(args.sustained_seqlens):
        sustained.append(sustained_config(c, aiter_fn, sustained_protocol))
        print(json.dumps(sustained[-1]), file=sys.stderr, flush=True)

    report = {
        "device": torch.cuda.get_device_name() if on_gpu else str(device), "torch": torch.__version__,
        "hip": getattr(torch.version, "hip", None), "zyfa": zyfa.__version__, "backend": backend,
        "aiter": aiter_info if aiter_fn is not None else None,
        "protocol": {"calls": args.calls, "warmup": args.warmup, "rounds": args.rounds, "idle_s": args.idle,
                     "error_heads": args.error_heads, "error_max_seqlen": args.error_max_seqlen},
        "sustained_protocol": dataclasses.asdict(sustained_protocol), "rows": rows, "sustained": sustained,
    }
    if aiter_fn is None:
        report["aiter_note"] = aiter_info
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / cfg.BENCH_JSON).write_text(json.dumps(report, indent=1))
    (out / cfg.BENCH_MD).write_text(cfg.markdown(report))
    print(f"gfx950 benchmark ({backend} backend on {report['device']}); AITER: "
          f"{report['aiter'] or 'skipped, ' + aiter_info}")
    print("\n".join(cfg.bench_table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
