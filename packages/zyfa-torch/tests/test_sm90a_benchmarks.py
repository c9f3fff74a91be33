"""The sm90a benchmark's report (benchmarks/sm90a_bf16.py) and chart (benchmarks/plot_sm90a.py) on CPU, from
synthetic runs: the tables carry the protocol's sections, the chart's ratios come from each run's own rows."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
SCRIPT = BENCHMARKS / "plot_sm90a.py"


def load(name):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plot = load("plot_sm90a")


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


def test_report_has_the_main_table_and_the_sustained_clock_section():
    bench = load("sm90a_bf16")
    report = {"device": "NVIDIA H200", "torch": "2.11", "cudnn": 91900, "zyfa": "0.1.0",
              "protocol": {"calls": 100, "warmup": 500, "rounds": 3, "idle_s": 5.0, "sustained": bench.SUSTAINED},
              "rows": [{**row(8192, 32, 32, 128, 550.0, 500.0), "rel_rms_vs_fp64": {"zyfa": 1.9e-3, "cudnn": 1.9e-3}}],
              "sustained": [{**row(8192, 32, 32, 128, 520.0, 480.0), "inputs": "activation"}]}
    text = bench.markdown(report)
    assert "| 128/128 | 8192 | 32/32 | 550 | 500 | n/a | 1.100 | 55.6 |  | 1.90e-03 | 1.90e-03 |" in text
    assert "Sustained clocks, activation-like inputs, MHA (2.0 s idle, 1.0 s of back-to-back calls" in text
    assert "| 128/128 | 8192 | 32 | 520 | 480 | 1.083 |" in text


def watched(seconds_asleep: float, limit: float | None = 1.0) -> subprocess.CompletedProcess:
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from gpu_common import watchdog\n"
            f"with watchdog('the body', {limit}):\n    time.sleep({seconds_asleep})\nprint('done')")
    return subprocess.run([sys.executable, "-c", code, str(BENCHMARKS.parent / "ci")], capture_output=True,
                          text=True, timeout=60)


def test_watchdog_ends_a_run_that_hangs_and_names_it():
    hung = watched(30.0)
    assert hung.returncode == 3 and "the body did not finish within 1 s" in hung.stderr and "done" not in hung.stdout
    for finished in (watched(0.0), watched(2.0, limit=None)):  # in time, or with no limit
        assert finished.returncode == 0 and finished.stdout.strip() == "done"
