"""Measurement variants of the sm90a FP8 kernels: built on request, never shipped.

    python -m asmgen.sm90a.experiments DIR [--only NAME ...]

Each variant is a shipped FP8 kernel with one choice changed; DIR gets the cubins and a manifest that the FP8
benchmark (benchmarks/sm90a_fp8.py --variants DIR) times and checks against the model like the shipped kernels.
A variant that does not fit the registers (ptxas spills, which fails the build) is reported and left out.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from .. import KERNELS, MAX_SHARED, RESERVED_SHARED, build, fp8_dynamic_shared_bytes, inspect

# name -> (manifest changes, build keywords, the p_modes of the shipped kernels it is built from)
VARIANTS = {
    "ones": ({"rowsum_method": "ones", "rowsum": "rounded"}, {}, ("exact", "lean")),  # l from P V's ones columns
    "fp32sum": ({"rowsum_method": "fp32", "rowsum": "fp32"}, {}, ("exact",)),  # l of the unrounded p (FA3's way)
    "stages2": ({"stages": 2}, {}, ("exact",)),  # the K/V^T ring one slot shallower than shipped
    "stages3": ({"stages": 3}, {}, ("lean",)),  # one slot deeper
    "pingpong": ({"schedule": "pingpong"}, {}, ("exact", "lean")),  # ping-pong consumers (spills)
}


def build_variants(folder: Path, names=None) -> list[dict]:
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for kernel in (k for k in KERNELS if k["dtype"] == "fp8e4m3"):
        for suffix, (changes, flags, p_modes) in VARIANTS.items():
            if (names and suffix not in names) or kernel["p_mode"] not in p_modes:
                continue
            entry = {**kernel, **changes, "name": f"{kernel['name']}_{suffix}",
                     "file": f"{kernel['name']}_{suffix}.cubin"}
            entry["symbol"] = kernel["symbol"]
            entry["shared_bytes"] = fp8_dynamic_shared_bytes(entry["d_qk"], entry["d_v"], entry["stages"],
                                                             entry["rowsum_method"] == "ones") + RESERVED_SHARED
            if entry["shared_bytes"] > MAX_SHARED:
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
