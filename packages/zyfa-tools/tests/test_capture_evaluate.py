"""Capture of post-RoPE q, k, v; KL and per-layer errors; the command line."""

from __future__ import annotations

import json

import pytest
import torch

from zyfa_tools import __main__ as cli
from zyfa_tools import capture, evaluate, models
from zyfa_tools.evaluate import kl_divergence


@pytest.fixture(scope="module")
def llama():
    return models.random_model("llama", key_bias=20.0)


def test_capture_is_post_rope(llama, tmp_path):
    ids = torch.randint(0, 512, (1, 48), generator=torch.Generator().manual_seed(0))
    tensors, scale = capture.capture(llama, ids)
    assert scale == 128**-0.5 and len(tensors) == 6
    path = tmp_path / "qkv.safetensors"
    capture.save(path, tensors, scale)
    layers, loaded_scale = capture.load(path)
    assert loaded_scale == scale and sorted(layers) == [0, 1]
    q, k, v = layers[0]
    assert q.shape == (1, 48, 4, 128) and k.shape == v.shape == (1, 48, 2, 128) and q.dtype == torch.bfloat16
    attn = llama.model.layers[0].self_attn
    with torch.no_grad():
        x = llama.model.layers[0].input_layernorm(llama.model.embed_tokens(ids))
        k_pre = attn.k_proj(x).view(1, 48, 2, 128)
        v_pre = attn.v_proj(x).view(1, 48, 2, 128)
    assert torch.equal(v, v_pre)
    assert torch.equal(k[:, 0], k_pre[:, 0])  # position 0: RoPE is the identity
    assert not torch.allclose(k[:, 1:], k_pre[:, 1:])  # later positions are rotated
    torch.testing.assert_close(k.float().norm(dim=-1), k_pre.float().norm(dim=-1), rtol=2e-2, atol=0)
    only, _ = capture.capture(llama, ids, layers={1})
    assert sorted(only) == ["layers.1.k", "layers.1.q", "layers.1.v"]


def test_kl_divergence():
    p = torch.randn(3, 10, 50)
    assert kl_divergence(p, p) == 0
    assert kl_divergence(p, p + 5.0) == pytest.approx(0, abs=1e-12)  # a shift of all logits changes nothing
    assert kl_divergence(p, torch.zeros_like(p)) > 0
    with pytest.raises(ValueError, match="must be equal"):
        kl_divergence(p, p[:, :5])


def test_model_report_measures_what_rotation_and_smoothing_do(llama):
    ids = torch.randint(0, 512, (1, 128), generator=torch.Generator().manual_seed(2))
    rows = {r["variant"]: r for r in evaluate.model_report(llama, ids)}
    assert list(rows) == [v.name for v in evaluate.VARIANTS]
    bf16, plain, both = rows["zyfa bf16"], rows["fp8 plain"], rows["fp8 rotation + smoothing"]
    assert bf16["kl"] < plain["kl"] / 10 and max(bf16["layer_errors"].values()) < 4e-3
    assert both["kl"] < plain["kl"] / 2
    for layer in (0, 1):
        assert both["layer_errors"][layer] < plain["layer_errors"][layer] * 0.8
        assert rows["fp8 smoothing"]["layer_errors"][layer] < plain["layer_errors"][layer] * 0.8


def test_functional_report_192():
    rows = {r["variant"]: r["error"] for r in evaluate.functional_report(192, 128, seqlen=256, heads=2, heads_k=1)}
    assert rows["zyfa bf16"] < 3e-3
    assert rows["fp8 rotation + smoothing"] < rows["fp8 plain"] * 0.97 < 0.08


def test_cli(tmp_path, capsys):
    scales = tmp_path / "s.safetensors"
    assert cli.main(["calibrate", "--model", "random:qwen2", "--layers", "1", "--seqlen", "64", "--out",
                     str(scales)]) == 0
    assert "static scales of 1 layers (rotation + smoothing, seed 0)" in capsys.readouterr().out
    qkv = tmp_path / "qkv.safetensors"
    assert cli.main(["capture", "--model", "random:qwen2", "--layers", "1", "--seqlen", "32", "--out",
                     str(qkv)]) == 0
    assert "layers.0.q: (1, 32, 4, 128)" in capsys.readouterr().out
    out_json, png = tmp_path / "e.json", tmp_path / "e.png"
    assert cli.main(["evaluate", "--model", "random:qwen2", "--layers", "1", "--seqlen", "64", "--scales",
                     str(scales), "--json", str(out_json), "--plot", str(png)]) == 0
    table = capsys.readouterr().out
    assert "fp8 rotation + smoothing static" in table and "KL (nats)" in table
    result = json.loads(out_json.read_text())
    assert len(result["rows"]) == 6 and png.stat().st_size > 10_000
    with pytest.raises(SystemExit):
        cli.main(["evaluate", "--help"])
    assert "The FP8 recipe" in capsys.readouterr().out


def test_cli_eager_preparation_and_random_model_size(tmp_path, monkeypatch, capsys):
    """--eager reaches every FP8 preparation (the per-layer errors and the model's attention); --vocab and a
    --seqlen beyond 4096 positions size the random model."""
    from zyfa_tools import hf

    seen = []

    def recording(original):
        def fp8_attention(*args, compile=None, **kwargs):
            seen.append(compile)
            return original(*args, compile=compile, **kwargs)
        return fp8_attention

    monkeypatch.setattr(hf, "fp8_attention", recording(hf.fp8_attention))
    monkeypatch.setattr(evaluate, "fp8_attention", recording(evaluate.fp8_attention))
    out_json = tmp_path / "e.json"
    assert cli.main(["evaluate", "--layers", "1", "--seqlen", "32", "--vocab", "300", "--eager", "--json",
                     str(out_json)]) == 0
    capsys.readouterr()
    assert len(seen) == 8 and set(seen) == {False}  # 4 FP8 variants, per layer and in the model
    assert json.loads(out_json.read_text())["arguments"]["vocab"] == 300
    model = models.random_model("llama", layers=1, vocab=300, max_positions=8192)
    assert model.config.vocab_size == 300 and model.config.max_position_embeddings == 8192
