"""Helpers shared by the GPU validation (ci/gpu_check.py) and the sm90a benchmark (benchmarks/sm90a_bf16.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import threading
import time

import torch

from zyfa_tools.reference import relative_rms_error

# The float64 reference and the error measure are zyfa_tools.reference's, the ones every accuracy figure uses.
rel_rms = relative_rms_error

IDLE_BEFORE_LONG_S = 5.0  # protocol: idle before S >= 16K so clocks start from the same state
PROTOCOL_SEQLENS = (2048, 4096, 8192, 16384, 32768)


def add_protocol_arguments(ap, seqlens=PROTOCOL_SEQLENS) -> None:
    """The benchmark protocol's options (docs/design.md), shared by every target's benchmark."""
    ap.add_argument("--out", default="out")
    ap.add_argument("--seqlens", type=int, nargs="+", default=list(seqlens))
    ap.add_argument("--head-dims", default="128,192", help="d_qk values to run (d_v = 128)")
    ap.add_argument("--calls", type=int, default=100, help="timed calls per measurement")
    ap.add_argument("--warmup", type=int, default=500, help="warm-up calls before them")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the order of the contenders rotated")
    ap.add_argument("--idle", type=float, default=IDLE_BEFORE_LONG_S, help="seconds idle before S >= 16K")
    ap.add_argument("--error-heads", type=int, default=4, help="query heads of the fp64 error measurement")
    ap.add_argument("--error-max-seqlen", type=int, default=8192, help="longest S whose error is measured")


def model_kwargs(kernel) -> dict:
    """zyfa.numerics.attention's keywords for the numerics a kernel's manifest entry declares (config_from_kernel)."""
    from zyfa import numerics
    return dataclasses.asdict(numerics.config_from_kernel(kernel.fields))


def print_items(report: dict, keys=("graph", "compile", "large")) -> int:
    """Print the GPU checks' whole-call items (CUDA/HIP graphs, torch.compile, large tensors); their failures."""
    failures = 0
    for key in keys:
        for r in report.get(key, []):
            failures += not r["ok"]
            print(f"{key}: {r}")
    return failures


def bf16_ulps(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|x - ref| in units of the BF16 spacing at max(|x|, |ref|, rms(ref)): the RMS floor keeps outputs that are
    near zero by cancellation from counting a tiny absolute difference as many units."""
    floor = float(ref.float().pow(2).mean().sqrt().clamp_min(torch.finfo(torch.bfloat16).tiny))
    magnitude = torch.maximum(x.float().abs(), ref.float().abs()).clamp_min(floor)
    spacing = torch.exp2(torch.floor(torch.log2(magnitude)) - 7)
    return (x.float() - ref.float()).abs() / spacing


def device_time_ms(fn, calls: int, warmup: int) -> float:
    """Mean device time of one call of `fn`, from a CUDA graph of `calls` calls (launch gaps out of the figure)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()  # first replay uploads the graph
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    graph.replay()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / calls


def causal_flops(batch: int, heads: int, seqlen: int, d_qk: int, d_v: int) -> float:
    """The protocol's FLOP count of one causal forward: B H S^2 (d_qk + d_v) (half of 2 B H S^2 (d_qk + d_v))."""
    return batch * heads * seqlen * seqlen * (d_qk + d_v)


def poison_allocator(nbytes: int) -> None:
    """Fill `nbytes` of memory that the caching allocator hands out next with NaN (freed at once, kept cached), so
    outputs a kernel leaves unwritten show as non-finite values."""
    block = torch.full((nbytes // 4 + 1,), math.nan, device="cuda")
    del block


def event_time_ms(fn, calls: int, warmup: int) -> float:
    """Mean device time of one call of `fn` from events around `calls` back-to-back eager calls (for contenders that
    cannot be captured in a graph; launch gaps count when the calls are shorter than their launch)."""
    for _ in range(warmup):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / calls


def timed_ms(fn, calls: int, warmup: int) -> tuple[float, str]:
    """(mean device time of one call, "graph" or "events"): graph replays where the calls can be captured."""
    try:
        return device_time_ms(fn, calls, warmup), "graph"
    except RuntimeError:
        torch.cuda.synchronize()
        return event_time_ms(fn, calls, warmup), "events"


def sustained_time_ms(fn, *, idle_s: float, warm_s: float, timed_s: float, repeats: int, sleep=None) -> list[float]:
    """Sustained-clock timing: per repetition `idle_s` idle, `warm_s` of back-to-back calls, then batches of calls
    until at least `timed_s` of device time; returns the mean time of one call of each repetition."""
    sleep = time.sleep if sleep is None else sleep
    results = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        sleep(idle_s)
        end = time.perf_counter() + warm_s
        while time.perf_counter() < end:
            fn()
            torch.cuda.synchronize()
        total_ms, count, batch = 0.0, 0, 1
        while total_ms < 1000 * timed_s:
            total_ms += event_time_ms(fn, batch, 0) * batch
            count += batch
            batch *= 2
        results.append(total_ms / count)
    return results


@contextlib.contextmanager
def watchdog(label: str, seconds: float | None):
    """Ends the process (exit 3, naming `label`) if the body has not finished after `seconds` (None: no limit): a
    kernel that never completes, e.g. a broken variant waiting on a barrier nobody arrives at, cannot be interrupted
    from Python, and would otherwise hang the run until the machine's time limit with nothing reported."""
    if seconds is None:
        yield
        return

    def expire():
        print(f"watchdog: {label} did not finish within {seconds:.0f} s; stopping", file=sys.stderr, flush=True)
        os._exit(3)

    timer = threading.Timer(seconds, expire)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
