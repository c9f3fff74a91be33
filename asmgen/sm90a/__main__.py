"""sm90a kernel tools.

    python -m asmgen.sm90a report [CUBIN ...]    # the key-tile steps of cubins (default: the shipped ones)

See asmgen/sm90a/sass.py for what the report's columns mean.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .sass import OBJECTS, report


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m asmgen.sm90a", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="the key-tile steps of cubins (default: the shipped ones), see sass.py")
    rep.add_argument("cubins", nargs="*", type=Path)
    args = ap.parse_args()
    print(report(args.cubins or sorted(OBJECTS.glob("*.cubin"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
