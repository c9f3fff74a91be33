"""gfx950 HIP kernel tools.

    python -m asmgen.hip report              # resources of every HIP kernel (also those not in the manifest yet)
    python -m asmgen.hip asm bf16_d128       # clang's assembly of a kernel
    python -m asmgen.hip flags bf16_d128     # the clang-22 command line that builds it
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from . import CLANG, KERNELS, build, compile_flags, generate, inspect, kernel_entry
from .kernels import SOURCE_DIR, SOURCES


def report() -> str:
    rows = ["| kernel | in manifest | schedule | offset bits | VGPR | AGPR | SGPR | LDS bytes | waves/SIMD | "
            "workgroups/CU |", "|---" * 10 + "|"]
    with tempfile.TemporaryDirectory() as tmp:
        for entry in KERNELS:
            path = Path(tmp) / entry["file"]
            build(entry, path)
            r = inspect(entry, path)["resources"]
            rows.append(f"| {entry['name']} | {'yes' if entry in KERNELS else 'no'} | {entry['schedule']} | "
                        f"{entry['offset_bits']} | {r['vgpr']} | {r['agpr']} | {r['sgpr']} | {r['lds']} | "
                        f"{r['waves_per_simd']} | {r['workgroups_per_cu']} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asmgen.hip", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("report", help="resources (VGPR, AGPR, SGPR, LDS, occupancy) of every HIP kernel")
    names = sorted(e["name"] for e in KERNELS)
    for command, text in (("asm", "print clang's assembly of a kernel"), ("flags", "print its compile command")):
        sub.add_parser(command, help=text).add_argument("kernel", choices=names)
    args = ap.parse_args(argv)
    if args.command == "report":
        print(report())
    elif args.command == "asm":
        sys.stdout.write(generate(args.kernel))
    else:
        entry = kernel_entry(args.kernel)
        print(" ".join([CLANG, *compile_flags(entry), "-c", str(SOURCE_DIR / SOURCES[entry["dtype"]]), "-o",
                        entry["file"]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
