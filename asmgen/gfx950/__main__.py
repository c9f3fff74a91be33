"""gfx950 kernel tools.

    python -m asmgen.gfx950 report            # resources (VGPR, AGPR, SGPR, LDS, occupancy) and the loop schedules
                                              # (the assembly kernels' and, from a simulated run, the HIP ones')
    python -m asmgen.gfx950 asm fp8_d128      # print a kernel's assembly
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ..hip.__main__ import report as hip_resources
from . import VARIANTS, assemble, generate, hip_schedule, schedule, toolchain

CASES = (  # (column title, analyse() keywords)
    ("e = 0", {}),
    ("some e > 0, none < 0", {"scaled_pv": True}),
    ("some e = -1", {"scaled_pv": True, "negative_e": True}),
    ("some e = -1 and rescale", {"scaled_pv": True, "negative_e": True, "with_rescale": True}),
)


def report() -> str:
    rows = ["| kernel | P | VGPR | AGPR | SGPR | LDS bytes | waves/SIMD | workgroups/CU | "
            + " | ".join(f"matrix busy: {title}" for title, _ in CASES) + " |", "|---" * (8 + len(CASES)) + "|"]
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, variant in VARIANTS.items():
            text = generate(name)
            path = Path(tmp) / f"{name}.co"
            path.write_bytes(assemble(text))
            res = toolchain.inspect(path)["resources"]
            cases = [schedule.analyse(text, **kw) for _, kw in CASES]
            busy = " | ".join(f"{100 * c.matrix_busy:.1f}%" for c in cases)
            rows.append(f"| {name} | {variant.p_mode} | {res['vgpr']} | {res['agpr']} | {res['sgpr']} | {res['lds']} "
                        f"| {res['waves_per_simd']} | {res['workgroups_per_cu']} | {busy} |")
            notes += [f"{name}, {title}: {c.summary()}" for (title, _), c in zip(CASES, cases, strict=True)]
    return "\n".join(rows + [""] + notes + ["", hip_resources(), "", hip_report()])


def hip_report() -> str:
    """The HIP kernels' key loops (asmgen.gfx950.hip_schedule: the loop from clang's assembly, its path from a
    simulated run)."""
    from zyfa_kernels import manifest
    rows = ["| kernel | schedule | VGPR | matrix busy (no rescale) | SIMD cycles per tile | a rescale adds |",
            "|---" * 6 + "|"]
    notes = []
    for kernel in (k for k in manifest().kernels if k.target == "gfx950" and k.fields.get("dtype") == "bf16"):
        result = hip_schedule.analyse(kernel.name)
        steady = result.cases["no rescale"]
        extra = ", ".join(f"{c} {n}" for c, n in sorted(result.rescale.items()))
        rows.append(f"| {kernel.name} | {kernel.schedule} | {kernel.fields['resources']['vgpr']} | "
                    f"{100 * steady.matrix_busy:.1f}% | {steady.interval_cycles:g} | {result.rescale_cycles} "
                    f"cycles ({extra}) |")
        notes += [f"{kernel.name}, {case}: {c.summary()}" for case, c in result.cases.items()]
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
