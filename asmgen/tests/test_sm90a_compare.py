"""python -m asmgen.sm90a.experiments.compare on a benchmark result with a variant, its shipped kernel and FA3."""

from __future__ import annotations

import json

import pytest

from asmgen.sm90a.experiments import compare

BASE = "sm90a_fwd_bf16_d128_code_test_pingpong"


def _row(contender: str, note: str, runs: list[float], seqlen: int = 2048) -> dict:
    return {"dtype": "bf16", "d_qk": 128, "kind": "MHA", "seqlen": seqlen, "contender": contender, "note": note,
            "kernel_ms": sorted(runs)[1], "kernel_ms_runs": runs}


RUN = {"rows": [
    _row("zyfa", BASE, [1.0, 1.1, 1.2]),
    _row(f"{BASE}_first_pair", f"{BASE}_first_pair", [0.8, 1.0, 1.2]),
    _row("fa3", "fa3_fwd_interface", [0.9, 1.0, 1.1]),
    _row(f"{BASE}_first_pair", f"{BASE}_first_pair", [1.0, 1.0, 1.0], seqlen=4096),  # its shipped kernel not run
]}


def test_a_variant_is_held_against_its_shipped_kernel_and_fa3_from_the_same_run():
    assert compare.shipped_of(f"{BASE}_first_pair") == BASE
    assert compare.shipped_of("sm90a_fwd_bf16_d128_pingpong_late_turn8") == "sm90a_fwd_bf16_d128_pingpong"
    assert compare.shipped_of("fa3_fwd_interface") is None
    (row,) = compare.rows(RUN)
    assert row[:4] == ["first_pair", BASE, "bf16 d 128 MHA", "2048"]
    assert row[4] == "+10.0%"  # medians 1.1 against 1.0
    assert row[5] == "+25.0% +10.0% +0.0%"  # round by round
    assert row[6] == "1.000 / 0.909"


def test_a_variant_is_held_against_another_variant_of_its_kernel_on_request():
    run = {"rows": RUN["rows"] + [_row(f"{BASE}_late_turn1", f"{BASE}_late_turn1", [1.2, 1.2, 1.2]),
                                  _row(f"{BASE}_late_turn8", f"{BASE}_late_turn8", [1.0, 1.2, 1.5])]}
    (row,) = [r for r in compare.rows(run, against="late_turn1") if r[0] == "late_turn8"]
    assert row[1] == f"{BASE}_late_turn1" and row[4] == "+0.0%"  # medians 1.2 against 1.2
    assert row[5] == "+20.0% +0.0% -20.0%"
    assert row[6] == "0.833 / 0.833"
    # the control itself and the variants without a control in the configuration give no row
    assert [r[0] for r in compare.rows(run, against="late_turn1")] == ["first_pair", "late_turn8"]


def test_a_file_that_is_not_a_benchmark_result_is_refused(tmp_path, capsys):
    (tmp_path / "run.json").write_text(json.dumps({"kernels": []}))
    with pytest.raises(SystemExit):
        compare.main([str(tmp_path / "run.json")])
    assert "no \"rows\"" in capsys.readouterr().err
