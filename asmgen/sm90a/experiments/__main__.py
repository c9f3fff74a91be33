"""python -m asmgen.sm90a.experiments DIR [--only NAME ...] [--dtype ...]: build the measurement variants into DIR."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import NAMES, VARIANTS, build_variants
from . import __doc__ as doc


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m asmgen.sm90a.experiments", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--only", nargs="+", choices=NAMES, help="variants to build (default: all)")
    ap.add_argument("--dtype", nargs="+", choices=list(VARIANTS), help="of the shipped kernels of these element "
                    "types only (default: all)")
    args = ap.parse_args()
    entries = build_variants(args.folder, args.only, args.dtype)
    print(f"{len(entries)} variants in {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
