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
also split the softmax phase into its parts. Columns a kernel does not time are empty (-). Progress to stderr.
"""

from __future__ import annotations

import argparse
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


def per_step(sums, grid: int, dtype: str = "fp8e4m3") -> list[dict]:
    """The cycles per key-tile step of each step phase for warp 0 of each consumer warpgroup, averaged over the
    grid's CTAs, from the uint32 sums (CTA, consumer warp, slot) in row-major order (an int64 tensor or a list) of a
    kernel of element type `dtype`; 0 for the phases it does not time."""
    import torch

    slots = SLOTS[dtype]
    table = torch.as_tensor(sums, dtype=torch.int64)[: grid * CONSUMER_WARPS * len(slots)]
    table = table.reshape(grid, CONSUMER_WARPS, len(slots)).double().mean(0)
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
    for kernel in kernels:
        for seqlen in args.seqlens:
            for heads, heads_k in ((max(32, 262144 // seqlen),) * 2, (32, 8)):
                print(f"{kernel.name} S={seqlen} {heads}/{heads_k}", file=sys.stderr)
                q, k, v = (torch.randn(1, seqlen, h, d, device="cuda") * 0.1 for h, d in
                           ((heads, kernel.d_qk), (heads_k, kernel.d_qk), (heads_k, kernel.d_v)))
                if kernel.dtype == "bf16":
                    inputs, descales = tuple(t.bfloat16() for t in (q, k, v)), (None, None, None)
                else:
                    (q8, qd), (k8, kd), (v8, vd) = (zyfa.fp8_quantize(t) for t in (q, k, v))
                    inputs = q8, k8, v8
                    descales = tuple(d.reshape(1, 1).expand(1, heads_k).contiguous() for d in (qd, kd, vd))
                for _ in range(3):  # the last call's sums are read
                    _, lse = sm90a.run(kernel, *inputs, kernel.d_qk ** -0.5, "bshd", descales=descales)
                torch.cuda.synchronize()
                sums = lse.reshape(-1).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
                for row in per_step(sums, grid, kernel.dtype):
                    print(f"| {kernel.name} | {seqlen} | {heads}/{heads_k} | {row['consumer']} | "
                          + " | ".join(f"{row[phase]:.0f}" if row[phase] else "-" for phase in STEP_PHASES) + " | "
                          + " | ".join(f"{row[f'{phase}_share']:.1%}" for phase in TILE_PHASES) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
