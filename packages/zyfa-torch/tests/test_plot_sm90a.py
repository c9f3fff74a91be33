"""benchmarks/plot_sm90a.py: the ratios it plots come from each run's own rows, and it writes the chart."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "plot_sm90a.py"
spec = importlib.util.spec_from_file_location("plot_sm90a", SCRIPT)
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)


def row(seqlen, heads, heads_k, d_qk, zyfa, cudnn):
    return {"seqlen": seqlen, "heads": heads, "heads_k": heads_k, "d_qk": d_qk, "d_v": 128,
            "tflops": {"zyfa": zyfa, "cudnn": cudnn}}


REPORT = {"device": "NVIDIA H200", "rows": [
    row(8192, 32, 32, 128, 550.0, 500.0), row(2048, 128, 128, 128, 440.0, 400.0),
    row(2048, 128, 32, 128, 420.0, 400.0), row(2048, 128, 128, 192, 500.0, 400.0)]}


def test_ratios_select_the_configuration_and_sort_by_length():
    assert plot.ratios(REPORT, 128, 128, gqa=False) == [(2048, 1.1), (8192, 1.1)]
    assert plot.ratios(REPORT, 128, 128, gqa=True) == [(2048, 1.05)]
    assert plot.ratios(REPORT, 192, 128, gqa=False) == [(2048, 1.25)]


def test_writes_the_chart(tmp_path):
    run = tmp_path / "bench_sm90a.json"
    run.write_text(json.dumps(REPORT))
    out = tmp_path / "ratios.png"
    subprocess.run([sys.executable, str(SCRIPT), str(run), "--out", str(out)], check=True, capture_output=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
