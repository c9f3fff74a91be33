"""The benchmark protocol: configurations, inputs every contender shares, and the timing of one contender.

Causal MHA and GQA 4:1, batch 1, S from 2K to 32K with max(32, 262144/S) query heads, Gaussian q, k, v with std 0.1
(or activation-like ones); throughput = B H S^2 (d_qk + d_v) / time. A measurement is the mean of `calls` calls after
`warmup` calls: kernel-only device time from a CUDA graph of the calls (torch.profiler's kernel times where a call
cannot be captured) and the eager time per call from events around back-to-back calls. Before a configuration's
first round its contenders run back to back for SETTLE_S (Clock.settle): the first tens of milliseconds after any
pause run at a higher clock than the rest, and they went to whichever contender came first. The sustained-clock mode
times back-to-back calls after an idle period and a warm-up instead (Sustained).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

import zyfa

from .. import inputs

SEQLENS = (2048, 4096, 8192, 16384, 32768)
HEAD_DIMS = ((128, 128), (192, 128))
DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
GQA_GROUP = 4
CALLS, WARMUP, ROUNDS = 100, 500, 3
SETTLE_S = 1.0  # seconds of the contenders' calls before a configuration's first round
IDLE_BEFORE_LONG_S, LONG_SEQLEN = 5.0, 16384


def causal_flops(batch: int, heads: int, seqlen: int, d_qk: int, d_v: int) -> float:
    """The protocol's FLOP count of one causal forward: B H S^2 (d_qk + d_v), half of the full matrix products'
    2 B H S^2 (d_qk + d_v)."""
    return batch * heads * seqlen * seqlen * (d_qk + d_v)


def heads_for(seqlen: int) -> int:
    """The protocol's query heads: max(32, 262144 / S), so every S does about the same work per causal row."""
    return max(32, 262144 // seqlen)


@dataclass(frozen=True)
class Config:
    """One benchmark configuration (batch 1, causal)."""

    dtype: str  # a key of DTYPES
    d_qk: int
    d_v: int
    seqlen: int
    heads: int
    heads_k: int

    @property
    def kind(self) -> str:
        return "MHA" if self.heads == self.heads_k else f"GQA {self.heads // self.heads_k}:1"

    @property
    def flops(self) -> float:
        return causal_flops(1, self.heads, self.seqlen, self.d_qk, self.d_v)

    @property
    def series(self) -> str:
        """What a plot line is drawn over S for: everything but S and the heads."""
        return f"{self.dtype} d{self.d_qk}/{self.d_v} {self.kind}"

    @property
    def label(self) -> str:
        return f"{self.series} S={self.seqlen} heads {self.heads}/{self.heads_k}"

    def fields(self) -> dict:
        return {**asdict(self), "kind": self.kind}


def configurations(dtypes=tuple(DTYPES), head_dims=HEAD_DIMS, seqlens=SEQLENS, heads=None, kinds=("MHA", "GQA")):
    """Every configuration, dtype-major (heads=None: the protocol's max(32, 262144/S))."""
    out = []
    for dtype in dtypes:
        for d_qk, d_v in head_dims:
            for seqlen in seqlens:
                h = heads or heads_for(seqlen)
                for kind in kinds:
                    heads_k = h if kind == "MHA" else h // GQA_GROUP
                    if heads_k >= 1 and h % heads_k == 0:
                        out.append(Config(dtype, d_qk, d_v, seqlen, h, heads_k))
    return out


@dataclass
class Inputs:
    """q, k, v in (batch, seqlen, heads, dim) on the device in the configuration's dtype; FP8 tensors come with one
    float32 descale per tensor (zyfa.fp8_quantize: a power of two), which every contender receives."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    descales: dict  # {"q_descale": (1,) tensor, ...} for FP8, {} for BF16

    def descale(self, name: str) -> float:
        return float(self.descales[f"{name}_descale"]) if self.descales else 1.0


def make_inputs(config: Config, device: torch.device, kind: str = "gaussian", seed: int = 0) -> Inputs:
    """The configuration's inputs: Gaussian with the protocol's std (drawn on the device), or activation-like
    (zyfa_tools.inputs.activation_like, drawn on the CPU)."""
    shape = (1, config.seqlen)
    if kind == "gaussian":
        gen = torch.Generator(device=device).manual_seed(seed)
        dims = ((config.heads, config.d_qk), (config.heads_k, config.d_qk), (config.heads_k, config.d_v))
        q, k, v = (torch.randn(*shape, h, d, generator=gen, device=device) * inputs.GAUSSIAN_STD for h, d in dims)
    elif kind == "activation":
        q, k, v = (t.to(device) for t in inputs.activation_like(1, config.seqlen, config.heads, config.heads_k,
                                                                  config.d_qk, config.d_v, seed=seed))
    else:
        raise ValueError(f"inputs must be 'gaussian' or 'activation', got {kind!r}")
    if config.dtype == "bf16":
        return Inputs(q.bfloat16(), k.bfloat16(), v.bfloat16(), {})
    (q8, qd), (k8, kd), (v8, vd) = (zyfa.fp8_quantize(t) for t in (q, k, v))
    return Inputs(q8, k8, v8, {"q_descale": qd, "k_descale": kd, "v_descale": vd})


@dataclass(frozen=True)
class Sustained:
    """The sustained-clock mode: per repetition `idle_s` idle, `warm_s` of back-to-back calls, then calls until at
    least `timed_s`; the median of `repeats` repetitions is reported."""

    idle_s: float = 2.0
    warm_s: float = 1.0
    timed_s: float = 3.0
    repeats: int = 3

    def shortened(self, factor: float) -> Sustained:
        return Sustained(self.idle_s / factor, self.warm_s / factor, self.timed_s / factor, 1)


class Clock:
    """Times calls on one device: CUDA (graphs, profiler, events) or the CPU (wall clock)."""

    def __init__(self, device: torch.device, sleep: Callable[[float], None] = time.sleep):
        self.device = device
        self.cuda = device.type == "cuda"
        self.sleep = sleep

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def eager_ms(self, fn, calls: int) -> float:
        """Mean time of one of `calls` back-to-back calls, launches and Python included."""
        self.sync()
        if not self.cuda:
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            return (time.perf_counter() - start) * 1e3 / calls
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / calls

    def kernel_ms(self, fn, calls: int, warmup: int) -> tuple[float, str]:
        """(mean kernel-only time of one call after `warmup` calls, how it was measured): "graph" (replay of a CUDA
        graph of `calls` calls), "profiler" (the sum of the calls' GPU kernel times, for calls a graph cannot
        capture) or "wall" (on the CPU, where there is no kernel time apart from the call)."""
        for _ in range(warmup):
            fn()
        if not self.cuda:
            return self.eager_ms(fn, calls), "wall"
        self.sync()
        try:
            return self._graph_ms(fn, calls), "graph"
        except Exception:  # peers raise their own types when a call cannot be captured
            self.sync()
            return self._profiler_ms(fn, calls), "profiler"

    def _graph_ms(self, fn, calls: int) -> float:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()  # the first replay uploads the graph
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.sync()
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / calls

    def _profiler_ms(self, fn, calls: int) -> float:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            self.sync()
        total_us = sum(getattr(e, "self_device_time_total", 0.0) for e in prof.key_averages())
        return total_us / 1e3 / calls

    def settle(self, fns, seconds: float) -> None:
        """Calls `fns` in turn, back to back, for `seconds` (untimed): the clock the rounds then run at is the one
        the GPU holds under this load. A call that raises is left out (the timed rounds report its failure)."""
        fns = list(fns)
        end = time.perf_counter() + seconds
        while fns and time.perf_counter() < end:
            for fn in list(fns):
                try:
                    fn()
                except Exception:  # a peer's own error types
                    fns.remove(fn)
            self.sync()

    def sustained_ms(self, fn, mode: Sustained) -> list[float]:
        """Mean time of one call in each repetition of the sustained-clock mode."""
        results = []
        for _ in range(mode.repeats):
            self.sync()
            self.sleep(mode.idle_s)
            end = time.perf_counter() + mode.warm_s
            while time.perf_counter() < end:
                fn()
                self.sync()
            total_ms, count, batch = 0.0, 0, 1
            while total_ms < 1e3 * mode.timed_s:
                total_ms += self.eager_ms(fn, batch) * batch
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
