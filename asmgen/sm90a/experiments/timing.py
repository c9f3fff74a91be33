"""Where a consumer's key-tile step spends its cycles, from the timed variants on an H100/H200.

    python -m asmgen.sm90a.experiments DIR --patch timing.patch --only timed timed_pingpong timed_fine
    python -m asmgen.sm90a.experiments.timing DIR [--seqlens 2048 8192 ...] > timing.md

timing.patch gives the main loops a stopwatch (`%clock` reads at the phase boundaries, no other change to the
loop): each consumer warp sums the cycles it spends waiting for K and V, issuing its GEMMs (the ping-pong turn
included), waiting for them, and in the rest of the step, plus the epilogue and the Q waits, and lane 0 writes the
sums where lse would go (the variant stores no lse). FP8 waits for both GEMMs at once: the rest is the softmax, the
O += acc and the row sums. BF16 waits for S (the GEMM wait column), runs the softmax under P V (the moved-maximum
test and packing, or the row maxima and exponentials), waits for P V and then rescales O, packs P (where it comes
after the wait) and advances the ring (the rest of the step); in the kernels whose softmax ptxas sinks past the P V
wait (ping-pong without the test) the softmax column holds that wait too and the P V wait column stays empty. This
script runs each timed kernel of DIR's manifest on Gaussian inputs and prints, per kernel, shape and consumer
warpgroup, the cycles per key-tile step of each phase (CTAs averaged, warp 0 of each consumer warpgroup) and the
shares of its whole time spent in the epilogues and the Q waits (once per query tile); the timed_fine variants (FP8)
also split the softmax phase into its parts. Columns a kernel does not time are empty (-). The timed_regions variants
(BF16) keep a query tile's regions apart: its first steps (the first step, or the first pair: key tiles 0 and 1, the
diagonal one where the tile is 0 or 1), the steady steps, the diagonal step, and the last P V with the epilogue and the
next tile's Q wait; for them a second table gives each region's phases in cycles per query tile (the steady steps also
per step) and the per-tile work: a query tile's cycles beyond its key tiles' count of steady steps. A last table
gives each kernel's time and its longest walk in cycles: their ratio is a lower bound on the SM clock the kernel ran
at (two variants of equal cycles but unequal times ran at unequal clocks); and the share of the SMs' time idle after
their CTA's walk, waiting for the longest (what the static job table loses to unequal work or speed, and a dynamic
one would win back). Progress to stderr.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

# The stopwatch's sums per consumer warp, in timing.patch's order (its enum Phase): the FP8 names, the last four
# only with kTimedFine. BF16 names two of those slots otherwise (kPvWait, kTail); its gemm_wait is the wait for S and
# its softmax the part under P V.
PHASES = ("kv_wait", "issue", "gemm_wait", "softmax", "epilogue", "q_wait", "steps", "total",
          "pre", "row_maxima", "exponentials", "packing")
SLOTS = {"fp8e4m3": PHASES, "bf16": (*PHASES[:8], "pv_wait", "tail", None, None)}
STEP_PHASES = (*PHASES[:4], *PHASES[8:], "pv_wait", "tail")  # the phases of a key-tile step, both element types
TILE_PHASES = ("epilogue", "q_wait")  # once per query tile: reported as shares of the consumer's total time
CONSUMER_WARPS = 8
# timed_regions: one group of slots per region, in timing.patch's order (its enum Region); each group's "steps" slot
# counts: all key tiles after the first (last: as without regions), query tiles (first), steps (steady, diagonal)
REGIONS = ("last", "first", "steady", "diagonal")
REGION_PHASES = ("kv_wait", "issue", "gemm_wait", "softmax", "pv_wait", "tail", "epilogue", "q_wait")
SPIN_CYCLES = 2_000_000  # kernel_us: the GPU's wait before each timed launch (about a millisecond)


def _table(sums, grid: int, dtype: str, groups: int = 1):
    """The uint32 sums (an int64 tensor or a list, row-major) as an int64 tensor (CTA, consumer warp, group, slot)."""
    import torch

    slots = SLOTS[dtype]
    size = grid * CONSUMER_WARPS * groups * len(slots)
    return torch.as_tensor(sums, dtype=torch.int64)[:size].reshape(grid, CONSUMER_WARPS, groups, len(slots))


def per_step(sums, grid: int, dtype: str = "fp8e4m3") -> list[dict]:
    """The cycles per key-tile step of each step phase for warp 0 of each consumer warpgroup, averaged over the
    grid's CTAs, from the uint32 sums (CTA, consumer warp, slot) in row-major order (an int64 tensor or a list) of a
    kernel of element type `dtype`; 0 for the phases it does not time."""
    slots = SLOTS[dtype]
    table = _table(sums, grid, dtype)[:, :, 0].double().mean(0)
    rows = []
    for consumer in (0, 1):
        warp = table[4 * consumer]
        steps = warp[slots.index("steps")].item()
        total = max(warp[slots.index("total")].item(), 1.0)
        rows.append({"consumer": consumer, "steps": steps,
                     **{phase: warp[slots.index(phase)].item() / max(steps, 1.0) if phase in slots else 0.0
                        for phase in STEP_PHASES},
                     **{f"{phase}_share": warp[slots.index(phase)].item() / total for phase in TILE_PHASES}})
    return rows


def per_region(sums, grid: int) -> list[dict]:
    """Per consumer (warp 0) and region of a timed_regions kernel: its phases in cycles per query tile, its count,
    and for the consumer the cycles per query tile in all, per steady step and beyond the steady steps (the per-tile
    work), from the uint32 sums (CTA, consumer warp, region, slot) in row-major order, averaged over the CTAs."""
    slots = SLOTS["bf16"]
    table = _table(sums, grid, "bf16", len(REGIONS)).double().mean(0)
    rows = []
    for consumer in (0, 1):
        warp = table[4 * consumer]
        count = {region: warp[i, slots.index("steps")].item() for i, region in enumerate(REGIONS)}
        tiles = max(count["first"], 1.0)
        total = warp[:, slots.index("total")].sum().item() / tiles
        steady = sum(warp[REGIONS.index("steady"), slots.index(phase)].item() for phase in REGION_PHASES)
        per_step = steady / max(count["steady"], 1.0)
        key_tiles = (count["last"] + count["first"]) / tiles  # a query tile's key tiles, on average
        for i, region in enumerate(REGIONS):
            rows.append({"consumer": consumer, "region": region, "count": count[region], "tiles": tiles,
                         **{phase: warp[i, slots.index(phase)].item() / tiles for phase in REGION_PHASES},
                         "per_step": per_step, "total": total, "per_tile_work": total - key_tiles * per_step})
    return rows


def walks(sums, grid: int, dtype: str = "fp8e4m3", groups: int = 1):
    """Each CTA's walk in cycles (warp 0 of the first consumer, its stopwatch's total over the `groups` of slots: 4
    for timed_regions), from the uint32 sums (CTA, consumer warp, group, slot), as an int64 tensor."""
    return _table(sums, grid, dtype, groups)[:, 0, :, SLOTS[dtype].index("total")].sum(1)


def walk_cycles(sums, grid: int, dtype: str = "fp8e4m3", groups: int = 1) -> float:
    """The cycles of the longest walk of the grid's CTAs (walks): divided by the kernel's time, a lower bound on the
    SM clock it ran at."""
    return walks(sums, grid, dtype, groups).max().item()


def idle_share(sums, grid: int, dtype: str = "fp8e4m3", groups: int = 1) -> float:
    """The share of the SMs' time spent after their CTA's walk, waiting for the longest one: 1 - mean / longest
    (walks). What a static job table loses where the CTAs' work or speed differ."""
    cycles = walks(sums, grid, dtype, groups).double()
    return 1.0 - (cycles.mean() / cycles.max()).item()


def kernel_us(launch, repeats: int = 5) -> tuple[float, object]:
    """The median time of `launch()`'s kernel in microseconds, between events that the GPU reaches only after a spin
    of about a millisecond, so that the host's work on the launch falls inside the spin, not inside the time; and
    what the last launch returned."""
    import torch

    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        result = launch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2], result


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m asmgen.sm90a.experiments.timing", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="a folder of timed variants (with their manifest.json)")
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 8192, 32768])
    args = ap.parse_args()

    import torch

    import zyfa
    import zyfa_kernels
    from zyfa.backends import sm90a

    kernels = [k for k in zyfa_kernels.Manifest.from_file(args.folder / "manifest.json").kernels
               if k.fields.get("timed")]
    if not kernels:
        ap.error(f"{args.folder}: no timed variants in its manifest (build them with --patch timing.patch)")
    grid = sm90a.multiprocessors(torch.cuda.current_device())
    print("| kernel | S | heads | consumer | cycles per step: K/V wait | GEMM issue | GEMM wait (BF16: S) | softmax "
          "(fine: the rest; BF16: under P V) | fine: probe, releases, O += acc | row maxima | exponentials | packing | "
          "BF16: P V wait | BF16: rescale, packing, ring | share of the time: epilogue | Q wait |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    torch.manual_seed(0)
    regions = []  # the timed_regions kernels' rows, printed as a second table
    clocks = []  # per kernel and shape: its time, the longest walk's cycles (a third table)
    for kernel in kernels:
        for seqlen in args.seqlens:
            for heads, heads_k in ((max(32, 262144 // seqlen),) * 2, (32, 8)):
                print(f"{kernel.name} S={seqlen} {heads}/{heads_k}", file=sys.stderr)
                groups = len(REGIONS) if kernel.fields.get("timed_regions") else 1
                if heads * seqlen < grid * CONSUMER_WARPS * len(SLOTS[kernel.dtype]) * groups:
                    print("  skipped: its lse buffer is too small for the sums", file=sys.stderr)
                    continue
                q, k, v = (torch.randn(1, seqlen, h, d, device="cuda") * 0.1 for h, d in
                           ((heads, kernel.d_qk), (heads_k, kernel.d_qk), (heads_k, kernel.d_v)))
                if kernel.dtype == "bf16":
                    inputs, descales = tuple(t.bfloat16() for t in (q, k, v)), (None, None, None)
                else:
                    (q8, qd), (k8, kd), (v8, vd) = (zyfa.fp8_quantize(t) for t in (q, k, v))
                    inputs = q8, k8, v8
                    descales = tuple(d.reshape(1, 1).expand(1, heads_k).contiguous() for d in (qd, kd, vd))
                launch = functools.partial(sm90a.run, kernel, *inputs, kernel.d_qk ** -0.5, "bshd", descales=descales)
                for _ in range(3):
                    launch()
                us, (_, lse) = kernel_us(launch)  # the last call's sums are read
                sums = lse.reshape(-1).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
                walk = (sums, grid, kernel.dtype, groups)
                clocks.append((kernel.name, seqlen, f"{heads}/{heads_k}", us, walk_cycles(*walk), idle_share(*walk)))
                if kernel.fields.get("timed_regions"):
                    regions += [(kernel.name, seqlen, f"{heads}/{heads_k}", row) for row in per_region(sums, grid)]
                    continue
                for row in per_step(sums, grid, kernel.dtype):
                    print(f"| {kernel.name} | {seqlen} | {heads}/{heads_k} | {row['consumer']} | "
                          + " | ".join(f"{row[phase]:.0f}" if row[phase] else "-" for phase in STEP_PHASES) + " | "
                          + " | ".join(f"{row[f'{phase}_share']:.1%}" for phase in TILE_PHASES) + " |", flush=True)
    if regions:
        print("\n| kernel | S | heads | consumer | region | count | cycles per query tile: " + " | ".join(REGION_PHASES)
              + " | region | a query tile in all | a steady step | per-tile work |")
        print("|---|---|---|---|---|---|" + "---|" * (len(REGION_PHASES) + 4))
        for name, seqlen, heads, row in regions:
            phases = [row[phase] for phase in REGION_PHASES]
            print(f"| {name} | {seqlen} | {heads} | {row['consumer']} | {row['region']} | {row['count']:.0f} | "
                  + " | ".join(f"{c:.0f}" for c in phases) + f" | {sum(phases):.0f} | {row['total']:.0f} | "
                  f"{row['per_step']:.0f} | {row['per_tile_work']:.0f} |")
    print("\n| kernel | S | heads | kernel time (us) | the longest walk (cycles) | cycles per us (at least the SM "
          "clock, MHz) | idle after the walk (1 - mean / longest) |")
    print("|---|---|---|---|---|---|---|")
    for name, seqlen, heads, us, cycles, idle in clocks:
        print(f"| {name} | {seqlen} | {heads} | {us:.1f} | {cycles:.0f} | {cycles / us:.0f} | {idle:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
