"""What the GPU checks of both targets (ci/gpu_check.py, ci/gpu_check_gfx950.py) share beyond zyfa_tools: unwritten
outputs made visible, and the whole-call items' report."""

from __future__ import annotations

import math

import torch


def print_items(report: dict, keys=("graph", "compile", "large")) -> int:
    """Print the GPU checks' whole-call items (CUDA/HIP graphs, torch.compile, large tensors); their failures."""
    failures = 0
    for key in keys:
        for r in report.get(key, []):
            failures += not r["ok"]
            print(f"{key}: {r}")
    return failures


def poison_allocator(nbytes: int) -> None:
    """Fill `nbytes` of memory that the caching allocator hands out next with NaN (freed at once, kept cached), so
    outputs a kernel leaves unwritten show as non-finite values."""
    block = torch.full((nbytes // 4 + 1,), math.nan, device="cuda")
    del block
