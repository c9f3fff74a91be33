"""Each kernel variant of a benchmark run against the shipped kernel it was built from, measured in the same run.

    python -m asmgen.sm90a.experiments.compare RUN.json [RUN.json ...] [--against VARIANT]

RUN.json: a `python -m zyfa_tools.bench ... --variants DIR` result (bench.json). A variant is timed under its own
name, `<shipped kernel>_<variant>`; its shipped kernel is timed as "zyfa" or "zyfa-<kernel>" (the row whose note
names it). Per variant and configuration: the speed-up over the shipped kernel from the medians over rounds, the
same from each round's pair (both timed in that round: the spread shows what the comparison is worth), and both
kernels' ratio to FA3 where it ran. With --against VARIANT each variant is held against that variant of the same
kernel instead (a variant's control: timed_no_tile_edges against timed). A markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import KERNELS

SHIPPED = sorted((k["name"] for k in KERNELS), key=len, reverse=True)  # the longest name that prefixes a variant's


def shipped_of(variant: str) -> str | None:
    """The shipped kernel a variant's name extends, or None for a name that extends none."""
    return next((name for name in SHIPPED if variant.startswith(name + "_")), None)


def _gain(base_ms: float, ms: float) -> str:
    return f"{100 * (base_ms / ms - 1):+.1f}%"


def rows(run: dict, against: str | None = None) -> list[list[str]]:
    """The table's rows for one run: variant, what it is held against (its shipped kernel, or that kernel's variant
    `against`), configuration, gain (medians), gains per round, FA3 ratios."""
    by_config: dict[tuple, dict[str, dict]] = {}
    for row in run["rows"]:
        key = (row["dtype"], row["d_qk"], row["kind"], row["seqlen"])
        by_config.setdefault(key, {})[row["contender"]] = row
    out = []
    for (dtype, d_qk, kind, seqlen), contenders in sorted(by_config.items()):
        notes = {row["note"]: row for row in contenders.values()}
        fa3 = contenders.get("fa3")
        for name, row in sorted(contenders.items()):
            shipped = shipped_of(name)
            base_name = f"{shipped}_{against}" if shipped and against else shipped
            base = (contenders if against else notes).get(base_name) if base_name else None
            if base is None or base is row:
                continue
            rounds = [_gain(b, v) for b, v in zip(base["kernel_ms_runs"], row["kernel_ms_runs"], strict=True)]
            over_fa3 = (f"{fa3['kernel_ms'] / row['kernel_ms']:.3f} / {fa3['kernel_ms'] / base['kernel_ms']:.3f}"
                        if fa3 else "-")
            out.append([name.removeprefix(shipped + "_"), base_name, f"{dtype} d {d_qk} {kind}", str(seqlen),
                        _gain(base["kernel_ms"], row["kernel_ms"]), " ".join(rounds), over_fa3])
    return out


def table(runs: list[dict], against: str | None = None) -> str:
    lines = ["| variant | against | configuration | S | gain (medians) | per round | over FA3 (variant / against) |",
             "|---|---|---|---|---|---|---|"]
    for run in runs:
        lines += ["| " + " | ".join(r) + " |" for r in rows(run, against)]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asmgen.sm90a.experiments.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="bench.json files of runs with --variants")
    ap.add_argument("--against", metavar="VARIANT", help="hold each variant against this variant of its kernel "
                    "(e.g. timed) rather than against the shipped kernel")
    args = ap.parse_args(argv)
    runs = []
    for path in args.runs:
        try:
            runs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as bad:
            ap.error(f"{path}: not a benchmark result ({bad})")
        if "rows" not in runs[-1]:
            ap.error(f"{path}: no \"rows\": not a zyfa_tools.bench result")
    print(table(runs, args.against))
    return 0


if __name__ == "__main__":
    sys.exit(main())
