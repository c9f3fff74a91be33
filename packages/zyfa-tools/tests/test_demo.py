"""The demo runs end to end on the CPU reference path."""

from __future__ import annotations

import re

from zyfa_tools import demo


def test_demo_reports_time_and_error_per_dtype(capsys):
    assert demo.main(["--seqlen", "100", "--heads", "2", "--heads-k", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("zyfa 0.1.0 on CPU (reference backend): causal, S=100, heads 2/1")
    errors = {m[1]: float(m[2]) for m in (re.search(r"(\w+) .* error vs fp64 (\S+)", line) for line in lines[1:])}
    assert set(errors) == {"bf16", "fp8"}
    assert errors["bf16"] < 3e-3 and errors["fp8"] < 1e-1
