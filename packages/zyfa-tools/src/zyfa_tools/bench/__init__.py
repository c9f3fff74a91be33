"""The benchmark of ZYFA against its peers, by the protocol of docs/design.md ("Benchmark protocol").

    python -m zyfa_tools.bench --help

Modules: protocol (configurations, inputs, timing), contenders (ZYFA from the manifest and the peers that are
installed), machine (versions, GPU, clocks, power limit), report (table, CSV, JSON, plots), runner (the loop).
"""

from __future__ import annotations

from .protocol import Config, configurations, heads_for
from .runner import run

__all__ = ["Config", "configurations", "heads_for", "run"]
