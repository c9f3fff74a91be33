"""Build sm90a kernel variants that leave one stage of the schedule out or change one choice, with a manifest the
benchmark (python -m zyfa_tools.bench --variants DIR) and the GPU check (python -m ci.gpu_check --variants DIR)
can load.

    python -m benchmarks.sm90a_variants DIR [--only NAME ...] [--d-qk 128] [--schedules pingpong independent]

Variants of each kernel: no intra-warpgroup overlap (QK^T of the next tile waits for P V of the current one),
neither overlap nor ping-pong, x - m with the model's two roundings instead of one FMA, a ring one stage deeper
where shared memory allows, 2, 4 or 6 of the 16 groups of four scores per thread and tile with their exponentials
on the FMA pipe (polyN), the softmax left unpinned (unpinned: the independent kernels as shipped before) or pinned
ahead of the P V wait (pin, pin_desc with wgmma descriptors advanced by one add, pin_p2_desc with double-buffered P
fragments on top: d_qk = 128 only, it spills at 192; docs/sm90a.md, "Pinning the softmax"), mbarrier waits that
sleep instead of polling (sleep: the producer's, sleep_all: every wait), a query tile's last P V issued with
the next tile's first QK^T (cross_tile), and a second Q buffer (q2, q2_cross_tile: d = 128 only), so that the next
query tile's Q loads while this one's last key tiles run, and the row maxima's quad reductions behind a warp vote
(vote), or the exponentials started before the maxima are known, S recomputed where one moves (speculate); both
give bitwise the same results. Two leave a stage out for timing only (their results are
wrong): no_exp (p = m + tau - c s instead of 2^(c s - m): MUFU idle) and no_softmax (P = bf16(S)). By default only
the ping-pong kernels get variants. They are for measurement only and never shipped.

ci/gpu.sh runs this module with the folder alone; env SM90A_VARIANT_ARGS supplies further arguments there (and
makes its bench stage time them), e.g. SM90A_VARIANT_ARGS="--only unpinned --schedules independent".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
from pathlib import Path

from asmgen import sm90a
from asmgen.build import VERSION

DEEPER = f"stages{sm90a.STAGES + 1}"  # a third K/V ring slot
POLY_EXP2_GROUPS = (2, 4, 6)  # of 16: 1/8, 1/4 and 3/8 of the exponentials off the MUFU pipe
VARIANTS = {
    "no_overlap": {"overlap": False},
    "serial": {"overlap": False, "pingpong": False},
    "model_scale": {"fma_scale": False},
    **{f"poly{n}": {"poly_exp2_groups": n} for n in POLY_EXP2_GROUPS},
    "unpinned": {"pin_softmax": False, "desc_add": False},
    "sleep": {"wait_hint": 1},
    "sleep_all": {"wait_hint": 2},
    "pin": {"pin_softmax": True, "desc_add": False},
    "pin_desc": {"pin_softmax": True, "desc_add": True},
    "pin_p2_desc": {"pin_softmax": True, "desc_add": True, "double_p": True},
    "cross_tile": {"cross_tile": True},
    DEEPER: {"stages": sm90a.STAGES + 1},
    "q2": {"q_stages": 2},
    "q2_cross_tile": {"q_stages": 2, "cross_tile": True},
    "vote": {"vote_max": True},
    "no_vote": {"vote_max": False},
    "speculate": {"speculate": True, "pin_softmax": True, "desc_add": True},  # needs the pinned softmax
    # for timing only, results are wrong (ci/gpu_check.py --variants fails them): what the exponentials, and the
    # whole softmax, cost
    "no_exp": {"leave_out": 1},
    "no_softmax": {"leave_out": 2},
}
# Variants whose outputs must equal the shipped kernels' bit for bit: their manifest entries say so, and
# python -m ci.gpu_check --variants then compares them with every shipped kernel of their head dims.
SAME_RESULTS = ("vote", "no_vote", "speculate")
# Keys of a variant that change the kernel's shared-memory layout (manifest fields) rather than a build keyword;
# such variants exist only where the layout fits (a third K/V slot or a second Q buffer: d = 128 only).
LAYOUT_KEYS = ("stages", "q_stages")
# Variants that fit the 240 consumer registers only at this d_qk (the others spill, which fails the build).
ONLY_AT_D_QK = {"pin_p2_desc": 128}


def variants_of(kernel: dict, names) -> list[tuple[str, dict, dict]]:
    """(suffix, manifest entry to build from, build keywords) for the wanted variants of one shipped kernel."""
    out = []
    for suffix, flags in VARIANTS.items():
        if suffix not in names or ONLY_AT_D_QK.get(suffix, kernel["d_qk"]) != kernel["d_qk"]:
            continue
        entry = {**kernel, **{key: flags[key] for key in LAYOUT_KEYS if key in flags}}
        entry["shared_bytes"] = sm90a.dynamic_shared_bytes(
            entry["d_qk"], entry["d_v"], entry["stages"], entry["q_stages"]) + sm90a.RESERVED_SHARED
        build = {key: value for key, value in flags.items() if key not in LAYOUT_KEYS}
        if sm90a.defines(entry, **build) == sm90a.defines(kernel):
            continue  # the shipped kernel itself (e.g. vote where the kernel already votes)
        if entry["shared_bytes"] <= sm90a.MAX_SHARED:
            out.append((suffix, entry, build))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--only", nargs="+", choices=list(VARIANTS), help="variants to build (default: all)")
    ap.add_argument("--d-qk", type=int, nargs="+", help="head dims to build variants of (default: all)")
    ap.add_argument("--schedules", nargs="+", choices=sm90a.SCHEDULES, default=["pingpong"])
    # after the command line: its folder must come before the options that take several values
    args = ap.parse_args(sys.argv[1:] + shlex.split(os.environ.get("SM90A_VARIANT_ARGS", "")))
    names = set(args.only or VARIANTS)
    root = Path(args.folder)
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for kernel in sm90a.BF16_KERNELS:  # the FP8 kernels' variants: python -m asmgen.sm90a.experiments
        if kernel["schedule"] not in args.schedules or (args.d_qk and kernel["d_qk"] not in args.d_qk):
            continue
        for suffix, base, flags in variants_of(kernel, names):
            entry = {**base, "name": f"{kernel['name']}_{suffix}", "file": f"{kernel['name']}_{suffix}.cubin",
                     "same_results_as_shipped": suffix in SAME_RESULTS}
            path = root / entry["file"]
            sm90a.build(entry, path, **flags)
            entries.append({**entry, "target": "sm90a", "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                            "resources": sm90a.inspect(entry, path)["resources"]})
    (root / "manifest.json").write_text(json.dumps({"version": VERSION, "kernels": entries}, indent=1))
    print(f"{len(entries)} variants in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
