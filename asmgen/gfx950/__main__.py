"""gfx950 kernel tools.

    python -m asmgen.gfx950 report            # resources (VGPR, AGPR, SGPR, LDS, occupancy) and the loop schedule
    python -m asmgen.gfx950 asm fp8_d128      # print a kernel's assembly
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from . import VARIANTS, assemble, generate, schedule, toolchain


def report() -> str:
    rows = ["| kernel | P | VGPR | AGPR | SGPR | LDS bytes | waves/SIMD | workgroups/CU | matrix busy: e = 0 "
            "| some e != 0 | e != 0 and rescale |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, variant in VARIANTS.items():
            text = generate(name)
            path = Path(tmp) / f"{name}.co"
            path.write_bytes(assemble(text))
            res = toolchain.inspect(path)["resources"]
            cases = [schedule.analyse(text), schedule.analyse(text, scaled_pv=True),
                     schedule.analyse(text, with_rescale=True, scaled_pv=True)]
            busy = " | ".join(f"{100 * c.matrix_busy:.1f}%" for c in cases)
            rows.append(f"| {name} | {variant.p_mode} | {res['vgpr']} | {res['agpr']} | {res['sgpr']} | {res['lds']} "
                        f"| {res['waves_per_simd']} | {res['workgroups_per_cu']} | {busy} |")
            notes += [f"{name}, e = 0: {cases[0].summary()}", f"{name}, some e != 0: {cases[1].summary()}"]
    return "\n".join(rows + [""] + notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asmgen.gfx950", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("report", help="resources and steady-state matrix-pipe occupancy of every kernel")
    asm = sub.add_parser("asm", help="print the generated assembly of a kernel")
    asm.add_argument("kernel", choices=sorted(VARIANTS))
    args = ap.parse_args(argv)
    if args.command == "report":
        print(report())
    else:
        sys.stdout.write(generate(args.kernel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
