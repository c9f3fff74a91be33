"""Job-table orders on the shipped sm90a BF16 kernels: each order's kernel-only time, and under Nsight Compute the
device-memory bytes it reads.

The balanced table (zyfa.jobs.balanced_jobs) deals the pairs of its last TAIL_ROUNDS rounds (and the fraction of a
round beyond them) as single tiles to the least-loaded CTAs: the CTAs' work evens out, but tiles of many heads are
then in flight at once, and K and V of a head are read from device memory more than once. The orders: `shipped`,
`tail0` / `tail1` / `tail4` (TAIL_ROUNDS 0, 1, 4) and `plain` (the pairs round-robin, no single tiles). Each order
gives bitwise the shipped order's output (checked on every configuration).

    python -m asmgen.sm90a.experiments.job_orders [--seqlens 2048 4096 8192] [--rounds 3] [--calls 40]
    ncu --clock-control none --metrics dram__bytes_read.sum -k regex:zyfa_sm90a_fwd \\
        python -m asmgen.sm90a.experiments.job_orders --once

Times: CUDA graphs of --calls calls, the median over --rounds rounds with the orders rotated. --once launches each
order once per configuration, in the order listed (for a profiler). Needs an H100/H200 with zyfa installed.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys

import torch

from zyfa import flash_attn_func, jobs
from zyfa.backends import sm90a
from zyfa_tools.bench.protocol import Clock


@contextlib.contextmanager
def tail_rounds(n: int):
    """balanced_jobs with TAIL_ROUNDS = n inside the block."""
    shipped, jobs.TAIL_ROUNDS = jobs.TAIL_ROUNDS, n
    try:
        yield
    finally:
        jobs.TAIL_ROUNDS = shipped


_SHIPPED = sm90a.host_job_table  # the backend's table, which time_orders swaps for each order's


def _tail(n: int):
    def build(batch: int, heads: int, num_tiles: int, grid: int, balanced: bool = True):
        with tail_rounds(n):
            return _SHIPPED(batch, heads, num_tiles, grid)
    return build


def _plain(batch: int, heads: int, num_tiles: int, grid: int, balanced: bool = True):
    return _SHIPPED(batch, heads, num_tiles, grid, balanced=False)


# name -> the backend's host_job_table(batch, heads, num_tiles, grid, balanced) in that order
ORDERS = {"shipped": _SHIPPED, "tail0": _tail(0), "tail1": _tail(1), "tail4": _tail(4), "plain": _plain}


def time_orders(seqlen: int, heads: int, heads_k: int, rounds: int, calls: int, once: bool) -> dict[str, float]:
    """us per call of each order (median over rounds; empty with once), the output checked bitwise against the
    first order's."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (0.1 * torch.randn(1, seqlen, h, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h in (heads, heads_k, heads_k))
    clock = Clock(torch.device("cuda"))
    reference = None
    times: dict[str, list[float]] = {name: [] for name in ORDERS}
    try:
        for r in range(1 if once else rounds):
            for name in list(ORDERS)[r % len(ORDERS):] + list(ORDERS)[:r % len(ORDERS)]:
                sm90a.host_job_table = ORDERS[name]
                sm90a._prepared.clear()  # the next call builds its launch with this order's table
                out = flash_attn_func(q, k, v, causal=True)
                reference = out.clone() if reference is None else reference
                if not torch.equal(out, reference):
                    raise AssertionError(f"order {name} changed the output")
                if not once:
                    ms, _ = clock.kernel_ms(lambda: flash_attn_func(q, k, v, causal=True), calls, calls // 2)
                    times[name].append(ms * 1e3)
    finally:
        sm90a.host_job_table = _SHIPPED
        sm90a._prepared.clear()
    return {name: statistics.median(t) for name, t in times.items() if t}


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m asmgen.sm90a.experiments.job_orders", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--gqa", type=int, nargs="+", default=[1, 4], help="query heads per KV head (1: MHA)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--once", action="store_true", help="one call per order and configuration (for a profiler)")
    args = ap.parse_args()
    print("| S | heads | " + " | ".join(ORDERS) + " |\n|---|---|" + "---|" * len(ORDERS))
    for seqlen in args.seqlens:
        heads = max(32, 262144 // seqlen)
        for group in args.gqa:
            print(f"S = {seqlen}, {heads}/{heads // group} heads", file=sys.stderr, flush=True)
            us = time_orders(seqlen, heads, heads // group, args.rounds, args.calls, args.once)
            if us:
                cells = [f"{us[n]:.1f} us ({us['shipped'] / us[n] - 1:+.1%})" for n in ORDERS]
                print(f"| {seqlen} | {heads}/{heads // group} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
