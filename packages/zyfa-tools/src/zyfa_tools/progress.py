"""Progress bars on stderr: tqdm when it is installed (it comes with the [hf] extra), else one line per step."""

from __future__ import annotations

import sys


def progress(iterable, desc: str, total: int | None = None):
    try:
        from tqdm import tqdm
    except ImportError:
        return _lines(iterable, desc, total)
    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, leave=False)


def _lines(iterable, desc, total):
    for i, item in enumerate(iterable, 1):
        print(f"{desc}: {i}/{total if total is not None else '?'}", file=sys.stderr, flush=True)
        yield item
