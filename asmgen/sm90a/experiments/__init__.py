"""Measurement variants of the sm90a kernels: built on request, never shipped.

    python -m asmgen.sm90a.experiments DIR [--only NAME ...]

Each variant is a shipped kernel with one choice changed (a manifest field, or a build keyword: for BF16 a
config_header keyword); DIR gets the cubins and a manifest that the benchmarks (benchmarks/sm90a_bf16.py,
sm90a_fp8.py --variants DIR) time and check against the model like the shipped kernels. A BF16 variant equal to its
shipped kernel is left out, and so is one that does not fit the registers (ptxas spills, which fails the build:
reported) or shared memory.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from .. import (
    FP8_STAGES,
    KERNELS,
    MAX_SHARED,
    RESERVED_SHARED,
    STAGES,
    build,
    config_header,
    dynamic_shared_bytes,
    fp8_dynamic_shared_bytes,
    inspect,
)

# name -> (manifest changes, build keywords): variants of each shipped BF16 kernel
BF16_VARIANTS = {
    "unpinned": ({}, {"pin_softmax": False, "desc_add": False}),  # the softmax left to ptxas (independent kernels)
    "pin_desc": ({}, {"pin_softmax": True, "desc_add": True}),  # pinned, descriptors by one add (ping-pong kernels)
    # the warp vote on the row maxima: bitwise the same results, which the GPU check then requires
    "vote": ({"same_results_as_shipped": True}, {"vote_max": True}),
    "no_vote": ({"same_results_as_shipped": True}, {"vote_max": False}),
    "stages3": ({"stages": STAGES + 1}, {}),  # a third K/V ring slot (fits at d = 128 only)
}
# name -> (manifest changes, build keywords): variants of each shipped FP8 kernel
FP8_VARIANTS = {
    "overlap": ({}, {"overlap": True}),  # the softmax under the consumer's own P V (pinned ahead of its wait)
    "ones": ({"rowsum_method": "ones", "rowsum": "rounded"}, {}),  # l from the ones columns of P V (N = 136)
    "fp32sum": ({"rowsum_method": "fp32", "rowsum": "fp32"}, {}),  # l of the unrounded p (FA3's way)
    "overlap_ones": ({"rowsum_method": "ones", "rowsum": "rounded"}, {"overlap": True}),
    "stages3": ({"stages": FP8_STAGES + 1}, {}),  # a third K/V^T ring slot
    "double_p": ({}, {"overlap": True, "double_p": True}),  # P packed under the running P V (spills)
    "pingpong": ({"schedule": "pingpong"}, {}),  # ping-pong consumers (spills)
}


VARIANTS = {"bf16": BF16_VARIANTS, "fp8e4m3": FP8_VARIANTS}
NAMES = sorted({name for variants in VARIANTS.values() for name in variants})


def _same_as_shipped(entry: dict, kernel: dict, flags: dict) -> bool:
    return kernel["dtype"] == "bf16" and config_header({**entry, "name": kernel["name"]}, **flags) == \
        config_header(kernel)


def build_variants(folder: Path, names=None) -> list[dict]:
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for kernel in KERNELS:
        for suffix, (changes, flags) in VARIANTS[kernel["dtype"]].items():
            if names and suffix not in names:
                continue
            entry = {**kernel, **changes, "name": f"{kernel['name']}_{suffix}",
                     "file": f"{kernel['name']}_{suffix}.cubin"}
            if kernel["dtype"] == "fp8e4m3":
                entry["shared_bytes"] = fp8_dynamic_shared_bytes(entry["d_qk"], entry["d_v"], entry["stages"],
                                                                 entry["rowsum_method"] == "ones") + RESERVED_SHARED
            else:
                entry["shared_bytes"] = dynamic_shared_bytes(entry["d_qk"], entry["d_v"], entry["stages"]) + \
                    RESERVED_SHARED
            if entry["shared_bytes"] > MAX_SHARED or _same_as_shipped(entry, kernel, flags):
                continue
            path = folder / entry["file"]
            try:
                build(entry, path, **flags)
            except RuntimeError as error:
                print(f"{entry['name']}: not built ({str(error).strip().splitlines()[-1][:160]})", file=sys.stderr)
                continue
            entries.append({**entry, "target": "sm90a", "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                            "resources": inspect(entry, path)["resources"]})
    from asmgen.build import VERSION

    (folder / "manifest.json").write_text(json.dumps({"version": VERSION, "kernels": entries}, indent=1))
    return entries
