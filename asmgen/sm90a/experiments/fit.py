"""A benchmark run's kernel times split into a key-tile step and per-tile work, per contender.

    python -m asmgen.sm90a.experiments.fit RUN.json [RUN.json ...]

RUN.json: a `python -m zyfa_tools.bench` result (bench.json) with several sequence lengths of one head dims and kind.
Causal attention over T = ceil(S / 128) query tiles of 128 rows and as many key tiles of 128 keys does T (T + 1) / 2
tile products a head; spread over the SMs, a kernel's time is close to

    time = step x (heads T (T + 1) / 2) / SMs + per_tile x (heads T) / SMs

where `step` is a key-tile step (both consumers' QK^T, softmax and P V of one 128 x 128 tile) and `per_tile` what a
query tile costs beyond its steps (its first and last steps' extra, the epilogue, the waits at its edges). A least-
squares fit of both over the run's lengths says which of the two a kernel loses on against another: a shorter step
wins at long S, a smaller per-tile cost at short S. The residuals show where the model stops holding (the last
round's idle SMs at short S, the clock under load). A markdown table on stdout, one row per run, configuration and
contender (kernel-only times; eager with --eager).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

TILE = 128  # rows of a query tile, keys of a key tile: the accounting unit, whatever a kernel's own tiles


def fit(rows: list[dict], multiprocessors: int, key: str = "kernel_ms") -> dict:
    """{"step_us", "per_tile_us", "residuals"} for one contender's rows of one configuration (several lengths):
    the least-squares step and per-tile work in microseconds, and each length's residual (measured over fitted - 1)."""
    terms, times = [], []
    for row in rows:
        tiles = -(-row["seqlen"] // TILE)
        terms.append([row["heads"] * tiles * (tiles + 1) / 2 / multiprocessors, row["heads"] * tiles / multiprocessors])
        times.append(row[key] * 1e3)
    terms, times = np.array(terms), np.array(times)
    (step, per_tile), *_ = np.linalg.lstsq(terms, times, rcond=None)
    return {"step_us": float(step), "per_tile_us": float(per_tile),
            "residuals": {row["seqlen"]: float(t / f - 1) for row, t, f in zip(rows, times, terms @ [step, per_tile],
                                                                                strict=True)}}


def table(runs: list[tuple[str, dict]], key: str = "kernel_ms") -> str:
    lines = ["| run | configuration | contender | key-tile step (us) | per-tile work (us) | residuals by S |",
             "|---|---|---|---|---|---|"]
    for name, run in runs:
        multiprocessors = run["machine"]["gpu"]["multiprocessors"]
        groups: dict[tuple, list[dict]] = {}
        for row in run["rows"]:
            groups.setdefault((row["dtype"], row["d_qk"], row["d_v"], row["kind"], row["contender"]), []).append(row)
        for (dtype, d_qk, d_v, kind, contender), rows in sorted(groups.items()):
            if len({row["seqlen"] for row in rows}) < 3:  # two lengths fit exactly: nothing to check the model by
                continue
            result = fit(sorted(rows, key=lambda row: row["seqlen"]), multiprocessors, key)
            residuals = " ".join(f"{s}: {r:+.1%}" for s, r in result["residuals"].items())
            lines.append(f"| {name} | {dtype} d {d_qk}/{d_v} {kind} | {contender} | {result['step_us']:.3f} | "
                         f"{result['per_tile_us']:.2f} | {residuals} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asmgen.sm90a.experiments.fit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="bench.json files")
    ap.add_argument("--eager", action="store_true", help="fit the eager times instead of the kernel-only ones")
    args = ap.parse_args(argv)
    runs = [(path.parent.name or path.name, json.loads(path.read_text())) for path in args.runs]
    print(table(runs, "eager_ms" if args.eager else "kernel_ms"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
