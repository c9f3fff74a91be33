"""python -m asmgen.sm90a.experiments DIR [--only NAME ...] [--dtype ...] [--patch NAME ...]: build the measurement
variants into DIR."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import NAMES, PATCHES, VARIANTS, build_patched, build_variants, patch_variants
from . import __doc__ as doc


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m asmgen.sm90a.experiments", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--only", nargs="+", metavar="NAME", help=f"variants to build (default: all): {', '.join(NAMES)}, "
                    "or with one --patch the variants it adds (default: all it adds)")
    ap.add_argument("--dtype", nargs="+", choices=list(VARIANTS), help="of the shipped kernels of these element "
                    "types only (default: all)")
    ap.add_argument("--patch", nargs="+", choices=PATCHES, metavar="PATCH", help="build in a copy of the generator "
                    "with this kept patch applied (the working tree stays as it is), the variants it adds; several "
                    f"patches each in turn, into one folder (choose from {', '.join(PATCHES)})")
    args = ap.parse_args()
    if args.patch:
        if args.only and len(args.patch) > 1:
            ap.error("--only goes with one --patch: with several, each builds the variants it adds")
        plan = {patch: args.only or patch_variants(patch) for patch in args.patch}
        unnamed = [patch for patch, names in plan.items() if not names]
        if unnamed:
            ap.error(f"--patch {' '.join(unnamed)}: name its variants with --only (the patch's text says which)")
        entries = [e for patch, names in plan.items() for e in build_patched(args.folder, patch, names, args.dtype)]
    else:
        unknown = sorted(set(args.only or ()) - set(NAMES))
        if unknown:
            ap.error(f"--only {' '.join(unknown)}: not a variant of the unpatched sources (choose from "
                     f"{', '.join(NAMES)}, or name the patch that adds it with --patch)")
        entries = build_variants(args.folder, args.only, args.dtype)
    print(f"{len(entries)} variants in {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
