"""The ratio chart (python -m benchmarks.plot_sm90a) on CPU, from synthetic runs in both formats it reads:
zyfa_tools.bench's bench.json (a row per contender) and the earlier bench_sm90a.json (a row per configuration)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import plot_sm90a as plot

ROOT = Path(__file__).resolve().parents[2]


def row(seqlen, heads, heads_k, d_qk, zyfa, cudnn):
    return {"seqlen": seqlen, "heads": heads, "heads_k": heads_k, "d_qk": d_qk, "d_v": 128,
            "tflops": {"zyfa": zyfa, "cudnn": cudnn}}


REPORT = {"device": "NVIDIA H200", "rows": [
    row(8192, 32, 32, 128, 550.0, 500.0), row(2048, 128, 128, 128, 440.0, 400.0),
    row(2048, 128, 32, 128, 420.0, 400.0), row(2048, 128, 128, 192, 500.0, 400.0)]}


def bench_rows(r: dict, dtype: str = "bf16") -> list[dict]:
    """The rows zyfa_tools.bench writes for one configuration of REPORT."""
    common = {k: r[k] for k in ("seqlen", "heads", "heads_k", "d_qk", "d_v")}
    return [{**common, "dtype": dtype, "contender": "zyfa", "tflops": r["tflops"]["zyfa"]},
            {**common, "dtype": dtype, "contender": "sdpa-cudnn", "tflops": r["tflops"]["cudnn"]},
            {**common, "dtype": dtype, "contender": "sdpa-flash", "tflops": 1.0}]


BENCH = {"machine": {"device": "cuda", "gpu": {"name": "NVIDIA H200"}},
         "rows": [x for r in REPORT["rows"] for x in bench_rows(r)] + bench_rows(REPORT["rows"][0], "fp8")}


def test_ratios_select_the_configuration_and_sort_by_length():
    for report in (REPORT, BENCH):
        assert plot.ratios(report, 128, 128, gqa=False) == [(2048, 1.1), (8192, 1.1)]
        assert plot.ratios(report, 128, 128, gqa=True) == [(2048, 1.05)]
        assert plot.ratios(report, 192, 128, gqa=False) == [(2048, 1.25)]
    assert plot.device_name(BENCH) == plot.device_name(REPORT) == "NVIDIA H200"


def test_ratios_against_another_peer_and_dtype():
    rows = [{**r, "contender": "fa3", "tflops": r["tflops"] * 2} for r in BENCH["rows"] if r["contender"] == "zyfa"]
    report = {**BENCH, "rows": BENCH["rows"] + rows}
    assert plot.ratios(report, 128, 128, gqa=False, peer="fa3") == [(2048, 0.5), (8192, 0.5)]
    assert plot.ratios(report, 128, 128, gqa=False, dtype="fp8", peer="fa3") == [(8192, 0.5)]
    assert plot.ratios(report, 128, 128, gqa=False, dtype="fp8") == [(8192, 1.1)]
    with pytest.raises(ValueError, match="BF16 against cuDNN only"):
        plot.ratios(REPORT, 128, 128, gqa=False, peer="fa3")


def test_writes_the_chart(tmp_path):
    runs = []
    for name, report in (("bench_sm90a.json", REPORT), ("bench.json", BENCH)):
        runs.append(tmp_path / name)
        runs[-1].write_text(json.dumps(report))
    out = tmp_path / "ratios.png"
    subprocess.run([sys.executable, "-m", "benchmarks.plot_sm90a", *map(str, runs), "--out", str(out)], cwd=ROOT,
                   check=True, capture_output=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
