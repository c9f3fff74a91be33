"""The support matrix: which target, dtype, head dims and P mode ZYFA has kernels for, read from the manifest.

    python -m zyfa_tools.support            # the markdown table of the README

One row per (target, dtype, d_qk, d_v, p_mode) of zyfa_kernels.manifest(): the kernels serving it (with their
sequence-length ranges where the manifest gives them, and the wider offsets where a row has two), whether the
p_mode is what a call without p_mode gets, and how the target's kernels are verified. On the CPU every
configuration runs on the reference path (the numerics model), which the table does not list.
"""

from __future__ import annotations

import sys

# How each target's kernels are verified: on an H200 lent to the project, or (no MI355X is available) by running the
# real code objects in the ISA simulator of asmgen/sim against the numerics model.
VERIFICATION = {"sm90a": "measured on hardware", "gfx950": "simulated"}
DTYPE_NAMES = {"bf16": "BF16", "fp8e4m3": "FP8 e4m3"}


def _described(kernel, offsets: set) -> str:
    """The kernel's name with its sequence-length range, and its offset width where its group has two."""
    fields = kernel.fields
    notes = []
    low, high = fields.get("seqlen_min"), fields.get("seqlen_max")
    if low is not None or high is not None:
        notes.append(f"S >= {low}" if high is None else f"S < {high}" if low is None else f"{low} <= S < {high}")
    if len(offsets) > 1 and fields.get("offset_bits") == max(offsets):
        notes.append(f"{max(offsets)}-bit offsets")
    return f"{kernel.name} ({', '.join(notes)})" if notes else kernel.name


def matrix(manifest=None) -> list[dict]:
    """Rows sorted by target, dtype, head dims, p_mode."""
    import zyfa_kernels

    manifest = manifest or zyfa_kernels.manifest()
    groups: dict[tuple, list] = {}
    for kernel in manifest.kernels:
        groups.setdefault((kernel.target, kernel.dtype, kernel.d_qk, kernel.d_v, kernel.p_mode), []).append(kernel)
    modes: dict[tuple, set] = {}
    for target, dtype, d_qk, d_v, p_mode in groups:
        modes.setdefault((target, dtype, d_qk, d_v), set()).add(p_mode)
    rows = []
    for (target, dtype, d_qk, d_v, p_mode), kernels in sorted(groups.items()):
        flags = [k.fields.get("p_mode_default") for k in kernels]
        offsets = {k.fields.get("offset_bits") for k in kernels} - {None}
        default = any(flags) if any(f is not None for f in flags) else len(modes[target, dtype, d_qk, d_v]) == 1
        rows.append({"target": target, "dtype": dtype, "d_qk": d_qk, "d_v": d_v, "p_mode": p_mode,
                     "default": default, "kernels": [_described(k, offsets) for k in kernels],
                     "verified": VERIFICATION.get(target, "not verified")})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| target | dtype | d_qk/d_v | P mode | kernels | verified |", "|---|---|---|---|---|---|"]
    for r in rows:
        mode = f"{r['p_mode']} (default)" if r["default"] and r["dtype"] != "bf16" else r["p_mode"]
        lines.append(f"| {r['target']} | {DTYPE_NAMES.get(r['dtype'], r['dtype'])} | {r['d_qk']}/{r['d_v']} | {mode} | "
                     f"{', '.join(r['kernels'])} | {r['verified']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m zyfa_tools.support", description=__doc__.split("\n\n", 2)[2])
    parser.parse_args(argv)
    print(markdown(matrix()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
