"""Summarise an Nsight Compute profile of the attention kernels (`ci/gpu.sh profile`) as one markdown page: per
kernel the headline metrics, the executed instruction mix, where warps stall (sampled, by reason and by opcode, and by
reason inside and outside the kernel's hottest loop: its key loop, so that what a query tile's other code costs shows
apart, instruction fetch included), and the mbarrier try-waits executed most (a warp that polls a barrier issues one,
and a branch, per attempt).

    python -m ci.profile_summary OUT/profile.txt OUT/profile_sass.csv [--top 12] > summary.md

profile.txt is `ncu -i REPORT` (the sections' tables), profile_sass.csv is `ncu -i REPORT --page source --csv
--print-source sass` (one block per kernel, each opened by a "Kernel Name" row). Both list the launches in the order
they were profiled; a kernel launched more than once (several shapes) is reported once per launch, "NAME [2]" for
its second.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys

from asmgen.sm90a import sass

HEADLINE = ("Duration", "SM Frequency", "Compute (SM) Throughput", "Issue Slots Busy", "Executed Ipc Active",
            "Eligible Warps Per Scheduler", "Warp Cycles Per Issued Instruction", "L2 Cache Throughput",
            "DRAM Throughput")
SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
TRY_WAITS = 4  # the most executed try-wait instructions listed per kernel
REASON_SHARE = 0.005  # stall reasons with fewer of the samples are summed into one row ("no_instruction", the
# instruction fetch's, is one to see even at 1%)


class Launches:
    """Names for the profiled launches in order: a kernel's name, then "NAME [2]", "NAME [3]", ... for its later
    launches."""

    def __init__(self):
        self.seen: collections.Counter = collections.Counter()

    def name(self, kernel: str) -> str:
        self.seen[kernel] += 1
        return kernel if self.seen[kernel] == 1 else f"{kernel} [{self.seen[kernel]}]"


def headline_metrics(text: str) -> dict[str, dict[str, str]]:
    """launch -> metric -> "value unit", from the section tables of `ncu -i`."""
    out: dict[str, dict[str, str]] = {}
    kernel, launches = None, Launches()
    for line in text.splitlines():
        # a launch's header: the (demangled) name, which may hold spaces, then grid x block
        head = re.match(r"\s{2}(\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
        if head:
            kernel = launches.name(head.group(1))
            out[kernel] = {}
            continue
        for name in HEADLINE:
            match = re.match(rf"\s+{re.escape(name)}\s+(\S*)\s+([\d.,]+)\s*$", line)
            if kernel and match:
                unit, value = match.groups()
                out[kernel].setdefault(name, f"{value} {unit}".strip())
    return out


def sass_rows(lines) -> dict[str, list[dict[str, str]]]:
    """launch -> rows of the source page (one per SASS instruction). A block that repeats the one before it (same
    kernel, same rows: ncu prints some kernels' page twice) is one launch."""
    blocks: list[tuple[str, list[dict[str, str]]]] = []
    header = None
    for row in csv.reader(lines):
        if len(row) >= 2 and row[0] == "Kernel Name":
            blocks.append((row[1], []))
            header = None
        elif row and row[0] == "Address":
            header = row
        elif blocks and header and len(row) == len(header):
            blocks[-1][1].append(dict(zip(header, row, strict=True)))
    launches = Launches()
    return {launches.name(kernel): rows
            for i, (kernel, rows) in enumerate(blocks) if i == 0 or blocks[i - 1] != (kernel, rows)}


def opcode(source: str) -> str:
    tokens = source.split()
    if not tokens:
        return "?"
    return tokens[1] if tokens[0].startswith("@") and len(tokens) > 1 else tokens[0]


def number(text: str) -> int:
    """A count as ncu prints it ("1,234"); blank or "-" count as 0."""
    digits = text.replace(",", "")
    return int(digits) if digits.isdigit() else 0


def hottest_loop(rows: list[dict[str, str]]) -> tuple[int, int] | None:
    """(first, last) address of the shortest backward branch's span that executed at least half the kernel's
    instructions: its key loop (the job and tile loops around it hold more, and the barrier polls less); None where
    no loop holds half."""
    executed = {int(row["Address"], 16): number(row.get(EXECUTED, "0")) for row in rows}
    half = sum(executed.values()) / 2
    spans = []
    for address, row in zip(executed, rows, strict=True):
        match = sass.BRANCH.search(row["Source"])
        start = int(match.group(1), 16) if match else address
        if start < address and sum(n for a, n in executed.items() if start <= a <= address) >= half:
            spans.append((address - start, start, address))
    return min(spans)[1:] if spans else None


def summarise(kernel: str, rows: list[dict[str, str]], metrics: dict[str, str], top: int) -> list[str]:
    executed = collections.Counter()
    samples = collections.Counter()
    reasons = collections.Counter()
    outside = collections.Counter()  # by reason, the samples outside the hottest loop
    loop = hottest_loop(rows)
    reason_names = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k] if rows else []
    for row in rows:
        op = opcode(row["Source"])
        executed[op] += number(row.get(EXECUTED, "0"))
        samples[op] += number(row.get(SAMPLES, "0"))
        out_of_loop = loop is not None and not loop[0] <= int(row["Address"], 16) <= loop[1]
        for reason in reason_names:
            reasons[reason.removeprefix("stall_")] += number(row[reason])
            if out_of_loop:
                outside[reason.removeprefix("stall_")] += number(row[reason])
    total_exec, total_samples = sum(executed.values()) or 1, sum(samples.values()) or 1
    waits = sorted(((number(r.get(EXECUTED, "0")), r["Source"].strip()) for r in rows if "TRYWAIT" in r["Source"]),
                   reverse=True)[:TRY_WAITS]

    lines = [f"## {kernel}", ""]
    if metrics:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {metrics[k]} |" for k in HEADLINE if k in metrics] + [""]
    lines += [f"Executed instructions (warp level): {total_exec:,}. Most executed:", "",
              "| opcode | executed | share |", "|---|---|---|"]
    lines += [f"| {op} | {n:,} | {100 * n / total_exec:.1f}% |" for op, n in executed.most_common(top)]
    lines += ["", f"Stall samples: {total_samples:,}. By reason:", "", "| reason | share |", "|---|---|"]
    shown = [(r, n) for r, n in reasons.most_common() if n >= REASON_SHARE * total_samples]
    rest = sum(reasons.values()) - sum(n for _, n in shown)
    lines += [f"| {r} | {100 * n / total_samples:.1f}% |" for r, n in shown]
    lines += [f"| (the other {len(reasons) - len(shown)}) | {100 * rest / total_samples:.1f}% |"] if rest else []
    if loop:
        lines += ["", f"Inside the hottest loop ({loop[0]:#x}-{loop[1]:#x}) and outside it (the rest of the consumers' "
                  "code, and the producer's), shares of all samples:", "", "| reason | inside | outside |",
                  "|---|---|---|"]
        lines += [f"| {r} | {100 * (n - outside[r]) / total_samples:.1f}% | {100 * outside[r] / total_samples:.1f}% |"
                  for r, n in shown]
    lines += ["", "By opcode of the stalled instruction:", "", "| opcode | share |", "|---|---|"]
    lines += [f"| {op} | {100 * n / total_samples:.1f}% |" for op, n in samples.most_common(top)]
    if waits:
        lines += ["", "Most executed try-waits (each attempt also issues a branch):", ""]
        lines += [f"- {n:,} ({100 * n / total_exec:.1f}% of the instructions): `{src}`" for n, src in waits]
    return lines + [""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("details", help="ncu -i REPORT output (profile.txt)")
    ap.add_argument("sass_csv", help="ncu -i REPORT --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=12, help="rows per table")
    args = ap.parse_args()
    with open(args.details) as f:
        metrics = headline_metrics(f.read())
    with open(args.sass_csv, newline="") as f:
        kernels = sass_rows(f)
    out = ["# Nsight Compute profile", ""]
    # the two pages list the same launches in the same order (their names may spell template arguments differently)
    by_order = len(metrics) == len(kernels)
    for (kernel, rows), launch in zip(kernels.items(), metrics if by_order else kernels, strict=True):
        out += summarise(kernel, rows, metrics.get(launch, {}), args.top)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
