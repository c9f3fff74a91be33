"""The accuracy harness: library functions and the command line (tiny shapes: seconds)."""

from __future__ import annotations

import io
import json

import pytest

from zyfa import numerics
from zyfa_tools import accuracy


@pytest.fixture(scope="module")
def sink_result():
    return accuracy.evaluate(accuracy.Case("sink12", 256, 128, 128, 2, 1))


def test_configurations_are_the_contract_and_the_peers():
    by_name = {v.name: v.config(128) for v in accuracy.VARIANTS}
    assert by_name["exact"] == numerics.resolve_config(numerics.FP8_DTYPE, 128)  # the contract's default
    assert by_name["lean"] == numerics.resolve_config(numerics.FP8_DTYPE, 128, p_mode="lean")
    assert by_name["fa3-like"] == numerics.Config("exact", False, "fp32", 0.0, 128, 64, 8)
    assert by_name["aiter-like"] == numerics.Config("exact", False, "fp32", 0.125, 128, 64, 0)
    assert by_name["exact noblk"] == numerics.Config("exact", False, "rounded", 0.125, 128, 64, 8)
    assert set(accuracy.INPUTS) == {"gauss0.1", "gauss1", "sink8", "sink12", "sink20"}


def test_errors_order_as_the_numerics_predict(sink_result):
    errors, lse = sink_result["errors"], sink_result["lse_errors"]
    assert set(errors) == set(lse) == {v.name for v in accuracy.VARIANTS}
    assert 1e-3 < errors["bf16"] < 3e-3
    # Sink-heavy inputs: without the offset the keys sharing the sink's block are lost; with it exact P keeps them.
    assert errors["bf16"] < errors["exact"] < errors["lean"] < errors["aiter-like"]
    assert errors["exact"] < 1.1 * errors["fa3-like"]
    for name, bound in accuracy.lse_bounds().items():
        assert bound is None or lse[name] <= bound


def test_gaussian_inputs_hide_the_tail():
    gauss = accuracy.evaluate(accuracy.Case("gauss0.1", 256, 128, 128, 2, 1),
                              [v for v in accuracy.VARIANTS if v.name in ("exact", "exact noblk", "aiter-like")])
    assert gauss["far_block_fraction"] == 0.0
    assert gauss["errors"]["exact"] == gauss["errors"]["exact noblk"]  # no block lies far below its row's max


def test_summary_criteria_and_tables(sink_result):
    lines = accuracy.summary([sink_result])
    assert any(line.startswith("sink12    default / FA3-like") for line in lines)
    (criterion,) = accuracy.criteria([sink_result])
    assert criterion.startswith(("PASS sink12 S=256", "FAIL sink12 S=256")) and "within 1.10x" in criterion
    table = accuracy.table([sink_result]).splitlines()
    assert len(table) == 3 and table[2].startswith("| sink12 | 256 | 128/128 | 2/1 |")
    lse_table = accuracy.table([sink_result], key="lse_errors", fmt="{:.4f}").splitlines()
    assert len(lse_table[2].split("|")) == len(table[2].split("|"))
    assert any(line.startswith("exact ") and "holds" in line for line in accuracy.lse_lines([sink_result]))


def test_progress_bar_counts_steps():
    stream = io.StringIO()
    progress = accuracy.Progress(2, stream)
    progress.step("one")
    progress.step("two")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("[####################] 2/2 two")
    assert accuracy.steps(3, accuracy.VARIANTS) == 3 * (len(accuracy.VARIANTS) + 2)  # + a reference per dtype


def test_command_line_writes_tables_json_and_plot(tmp_path, capsys):
    json_path, png_path = tmp_path / "acc.json", tmp_path / "acc.png"
    args = ["--shapes", "128:2:2", "128:2:1", "--inputs", "gauss1", "--variants", "bf16", "exact", "fa3-like",
            "--json", str(json_path), "--plot", str(png_path)]
    assert accuracy.main(args) == 0
    captured = capsys.readouterr()
    assert "| gauss1 | 128 | 128/128 | 2/2 |" in captured.out and "Largest lse error" in captured.out
    assert "default / FA3-like" in captured.out and "10/10" in captured.err  # 2 cases x (3 + 2 references)
    data = json.loads(json_path.read_text())
    assert data["command"].endswith(" ".join(args))
    assert [r["case"]["heads_k"] for r in data["results"]] == [2, 1]
    assert set(data["results"][0]["errors"]) == set(data["lse_bounds"]) == {"bf16", "exact", "fa3-like"}
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_command_line_rejects_a_bad_shape(capsys):
    with pytest.raises(SystemExit):
        accuracy.main(["--shapes", "256:4:3"])
    assert "HEADS_K must divide HEADS" in capsys.readouterr().err
