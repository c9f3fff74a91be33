"""The accuracy harness: library functions and the command line."""

from __future__ import annotations

import json

import pytest

from zyfa_tools import accuracy


@pytest.fixture(scope="module")
def activation_result():
    return accuracy.evaluate(accuracy.Case("activation", 256, 128, 128, 2, 1))


def test_errors_order_as_the_numerics_predict(activation_result):
    errors = activation_result["errors"]
    assert set(errors) == {v.name for v in accuracy.VARIANTS}
    assert 1e-3 < errors["bf16"] < 3e-3
    # Sink-heavy inputs: per-block scaling helps every P format; offsetting P by 8 binades keeps the tail.
    assert errors["lean"] < errors["lean noblk"] and errors["exact"] < errors["exact noblk"]
    assert errors["exact +8"] < errors["lean +8"] < errors["exact"] < errors["lean"]
    assert errors["bf16"] < errors["exact +8"]


def test_gaussian_inputs_hide_the_tail(activation_result):
    gauss = accuracy.evaluate(accuracy.Case("gaussian", 256, 128, 128, 2, 1),
                              [v for v in accuracy.VARIANTS if v.name in ("lean", "lean noblk", "lean +8")])
    assert gauss["far_block_fraction"] == 0.0 < activation_result["far_block_fraction"]
    assert gauss["errors"]["lean"] == gauss["errors"]["lean noblk"] == gauss["errors"]["lean +8"]


def test_summary_and_table(activation_result):
    lines = accuracy.summary([activation_result])
    assert any(line.startswith("activation lean / exact") for line in lines)
    table = accuracy.table([activation_result]).splitlines()
    assert len(table) == 3 and table[2].startswith("| activation | 256 | 128/128 | 2/1 |")


def test_command_line_writes_table_json_and_plot(tmp_path, capsys):
    json_path, png_path = tmp_path / "acc.json", tmp_path / "acc.png"
    args = ["--quick", "--dims", "128", "--inputs", "gaussian", "--variants", "bf16", "lean",
            "--json", str(json_path), "--plot", str(png_path)]
    assert accuracy.main(args) == 0
    captured = capsys.readouterr()
    assert "| gaussian | 256 | 128/128 | 2/2 |" in captured.out and "[2/2]" in captured.err
    data = json.loads(json_path.read_text())
    assert data["command"].endswith(" ".join(args))
    assert [r["case"]["heads_k"] for r in data["results"]] == [2, 1]
    assert set(data["results"][0]["errors"]) == {"bf16", "lean"}
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_command_line_rejects_a_group_that_does_not_divide_heads(capsys):
    with pytest.raises(SystemExit):
        accuracy.main(["--heads", "4", "--group", "3"])
    assert "--group 3 must divide --heads 4" in capsys.readouterr().err
