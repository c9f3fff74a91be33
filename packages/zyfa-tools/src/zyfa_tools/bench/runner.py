"""The benchmark loop: every configuration, every contender, rounds in rotated order, results saved as they come."""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..reference import attention_fp64, relative_rms_error
from . import machine, report
from .contenders import Skip, prepare_all
from .protocol import LONG_SEQLEN, Clock, Config, Inputs, Sustained, make_inputs


@dataclass
class Options:
    configs: list[Config]
    device: torch.device
    out: Path
    calls: int
    warmup: int
    rounds: int
    idle_s: float
    settle_s: float = 0.0  # the contenders' calls back to back before the first round (Clock.settle)
    inputs: str = "gaussian"
    sustained: Sustained | None = None  # the sustained-clock mode instead of graph timing
    error_heads: int = 4
    error_max_seqlen: int = 8192
    only: list[str] = field(default_factory=list)  # contender names to run (empty: all)
    plots: bool = True
    seed: int = 0
    variants: list = field(default_factory=list)  # kernel variants (manifest entries) timed as contenders


class Progress:
    """A progress bar on stderr (one line per step where stderr is not a terminal)."""

    def __init__(self, total: int, stream=None, width: int = 30):
        self.total, self.done, self.stream, self.width = total, 0, stream or sys.stderr, width
        self.tty = self.stream.isatty()

    def step(self, label: str) -> None:
        self.done += 1
        filled = round(self.width * self.done / self.total)
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {label}"
        self.stream.write(f"\r{line[:160]:160s}" if self.tty else line + "\n")
        if self.tty and self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def error_function(config: Config, x: Inputs, heads: int):
    """error(output) against float64 attention on the first `heads` query heads (and the kv heads they read)."""
    heads = min(heads, config.heads)
    heads_k = math.ceil(heads / (config.heads // config.heads_k))
    ref = attention_fp64(x.q[:, :, :heads], x.k[:, :, :heads_k], x.v[:, :, :heads_k], q_descale=x.descale("q"),
                         k_descale=x.descale("k"), v_descale=x.descale("v"))
    return lambda out: relative_rms_error(out[:, :, :heads], ref)


def measure(config: Config, opts: Options, clock: Clock) -> tuple[list[dict], list[Skip]]:
    """Rows (one per contender) and skips of one configuration."""
    x = make_inputs(config, opts.device, opts.inputs, opts.seed)
    error = error_function(config, x, opts.error_heads) if config.seqlen <= opts.error_max_seqlen else None
    ready, skipped = prepare_all(config, x, opts.device, error, opts.only, opts.variants)
    kernel = {c.name: [] for c in ready}
    eager = {c.name: [] for c in ready}
    methods = {}
    rounds = 1 if opts.sustained else opts.rounds
    if not opts.sustained and opts.settle_s:
        clock.settle([c.call for c in ready], opts.settle_s)
    for rnd in range(rounds):
        order = ready[rnd % len(ready):] + ready[:rnd % len(ready)] if ready else []
        for contender in order:
            if contender.name not in kernel:
                continue  # failed in an earlier round
            try:
                if opts.sustained:
                    kernel[contender.name] = clock.sustained_ms(contender.call, opts.sustained)
                    methods[contender.name] = "sustained"
                    continue
                ms, methods[contender.name] = clock.kernel_ms(contender.call, opts.calls, opts.warmup)
                kernel[contender.name].append(ms)
                eager[contender.name].append(clock.eager_ms(contender.call, opts.calls))
            except Exception as failure:  # a peer's own error types: reported, the run goes on
                skipped.append(Skip(contender.name, f"failed while timed: {str(failure).splitlines()[0][:200]}"))
                del kernel[contender.name], eager[contender.name]
    rows = []
    for contender in ready:
        if contender.name not in kernel:
            continue
        k_ms = statistics.median(kernel[contender.name])
        e_ms = statistics.median(eager[contender.name]) if eager[contender.name] else None
        rows.append({
            **config.fields(), "contender": contender.name, "note": contender.note, "inputs": opts.inputs,
            "kernel_ms": k_ms, "kernel_method": methods[contender.name], "kernel_ms_runs": kernel[contender.name],
            "eager_ms": e_ms, "eager_ms_runs": eager[contender.name],
            "tflops": config.flops / k_ms / 1e9, "eager_tflops": config.flops / e_ms / 1e9 if e_ms else None,
            "error_vs_fp64": contender.error,
        })
    return rows, skipped


def run(opts: Options, clock: Clock | None = None) -> dict:
    """Measure every configuration of `opts`; writes the results under opts.out after each one and returns them."""
    clock = clock or Clock(opts.device)
    opts.out.mkdir(parents=True, exist_ok=True)
    results = {
        "machine": machine.describe(opts.device),
        "protocol": {"calls": opts.calls, "warmup": opts.warmup, "rounds": opts.rounds, "idle_s": opts.idle_s,
                     "settle_s": opts.settle_s,
                     "idle_from_seqlen": LONG_SEQLEN, "inputs": opts.inputs,
                     "sustained": asdict(opts.sustained) if opts.sustained else None,
                     "error_heads": opts.error_heads, "error_max_seqlen": opts.error_max_seqlen,
                     "timing": "median over rounds of the mean of `calls` calls; kernel-only time from a CUDA graph "
                               "of the calls (or torch.profiler's kernel times), eager time from events around "
                               "back-to-back calls"},
        "rows": [],
        "skips": [],
    }
    progress = Progress(len(opts.configs))
    for config in opts.configs:
        if config.seqlen >= LONG_SEQLEN and opts.idle_s:
            clock.sleep(opts.idle_s)
        rows, skipped = measure(config, opts, clock)
        results["rows"] += rows
        results["skips"] += [{**config.fields(), "contender": s.name, "reason": s.reason} for s in skipped]
        report.save(results, opts.out, plots=False)  # a run cut short keeps what it measured
        progress.step(config.label)
        if opts.device.type == "cuda":
            torch.cuda.empty_cache()
    report.save(results, opts.out, plots=opts.plots)
    return results
