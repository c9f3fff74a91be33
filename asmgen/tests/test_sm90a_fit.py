"""python -m asmgen.sm90a.experiments.fit: a run's times split into a key-tile step and per-tile work."""

from __future__ import annotations

import json

import pytest

from asmgen.sm90a.experiments import fit

SMS = 132


def _row(contender: str, seqlen: int, step_us: float, per_tile_us: float, heads: int = 32, slower: float = 1.0):
    tiles = -(-seqlen // 128)
    us = (step_us * heads * tiles * (tiles + 1) / 2 + per_tile_us * heads * tiles) / SMS * slower
    return {"dtype": "bf16", "d_qk": 128, "d_v": 128, "kind": "MHA", "seqlen": seqlen, "heads": heads,
            "contender": contender, "kernel_ms": us / 1e3, "eager_ms": 1.1 * us / 1e3}


def test_the_fit_recovers_a_step_and_a_per_tile_work_and_reports_where_the_model_stops_holding():
    rows = [_row("zyfa", s, 1.6, 3.9, heads=max(32, 262144 // s)) for s in (2048, 4096, 8192, 16384)]
    result = fit.fit(rows, SMS)
    assert result["step_us"] == pytest.approx(1.6) and result["per_tile_us"] == pytest.approx(3.9)
    assert all(abs(r) < 1e-9 for r in result["residuals"].values())
    # a length 5% slower than the model shows as the largest residual, half of it taken into the per-tile work
    rows[0] = _row("zyfa", 2048, 1.6, 3.9, heads=128, slower=1.05)
    result = fit.fit(rows, SMS)
    assert result["residuals"][2048] > 0.02 and all(abs(result["residuals"][s]) < 0.015 for s in (4096, 8192, 16384))
    assert result["per_tile_us"] > 4.2


def test_the_table_fits_each_contender_with_three_lengths_or_more(tmp_path, capsys):
    rows = [_row(c, s, step, per_tile) for c, step, per_tile in (("zyfa", 1.58, 3.92), ("fa3", 1.67, 2.05))
            for s in (2048, 4096, 8192)]
    rows += [_row("sdpa-cudnn", s, 1.85, 4.5) for s in (2048, 4096)]  # two lengths: left out
    run = tmp_path / "bench.json"
    run.write_text(json.dumps({"machine": {"gpu": {"multiprocessors": SMS}}, "rows": rows}))
    assert fit.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "| fa3 | 1.670 | 2.05 |" in out and "| zyfa | 1.580 | 3.92 |" in out and "sdpa-cudnn" not in out
    assert fit.main([str(run), "--eager"]) == 0
    assert "| zyfa | 1.738 | 4.31 |" in capsys.readouterr().out  # eager: 1.1x here
