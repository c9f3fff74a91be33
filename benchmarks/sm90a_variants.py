"""Build sm90a kernel variants that leave one stage of the schedule out, with a manifest the benchmark can load.

    python benchmarks/sm90a_variants.py DIR

Variants of each ping-pong kernel: no intra-warpgroup overlap (QK^T of the next tile waits for P V of the current
one), neither overlap nor ping-pong, x - m with the model's two roundings instead of one
FMA, and
a ring one stage deeper where shared memory allows. They are for measurement only and never shipped.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from asmgen import sm90a  # noqa: E402
from asmgen.build import VERSION  # noqa: E402

# Variants of the ping-pong kernels (the other shipped schedule, "independent", is ping-pong left out).
VARIANTS = {
    "no_overlap": {"overlap": False},
    "serial": {"overlap": False, "pingpong": False},
    "model_scale": {"fma_scale": False},
}


def main(folder: str) -> int:
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for kernel in (k for k in sm90a.KERNELS if k["schedule"] == "pingpong"):
        variants = [(suffix, kernel, flags) for suffix, flags in VARIANTS.items()]
        deeper = {**kernel, "stages": sm90a.STAGES + 1}
        deeper["shared_bytes"] = sm90a.dynamic_shared_bytes(kernel["d_qk"], kernel["d_v"], deeper["stages"]) \
            + sm90a.RESERVED_SHARED
        if deeper["shared_bytes"] <= sm90a.MAX_SHARED:
            variants.append((f"stages{deeper['stages']}", deeper, {}))
        for suffix, base, flags in variants:
            entry = {**base, "name": f"{kernel['name']}_{suffix}", "file": f"{kernel['name']}_{suffix}.cubin"}
            path = root / entry["file"]
            sm90a.build(entry, path, **flags)
            entries.append({**entry, "target": "sm90a", "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                            "resources": sm90a.inspect(entry, path)["resources"]})
    (root / "manifest.json").write_text(json.dumps({"version": VERSION, "kernels": entries}, indent=1))
    print(f"{len(entries)} variants in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
