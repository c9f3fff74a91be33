"""Static scales: exact statistics, save and load, use in the model without amax at run time."""

from __future__ import annotations

import pytest
import torch

from zyfa_tools import hf, models
from zyfa_tools.calibration import Calibrator, StaticScales, calibrate
from zyfa_tools.evaluate import kl_divergence
from zyfa_tools.quantize import Recipe, prepare, rotation_for
from zyfa_tools.reference import decode


def _qkv(seed, seqlen=40):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, seqlen, 4, 128, generator=gen)
    k = torch.randn(1, seqlen, 2, 128, generator=gen) + 4.0
    v = torch.randn(1, seqlen, 2, 128, generator=gen)
    return q, k, v


def test_statistics_equal_a_pass_over_all_data():
    recipe = Recipe(rotation=True, smoothing=True)
    cal = Calibrator(recipe)
    parts = [_qkv(0), _qkv(1, 25)]
    for part in parts:
        cal.observe(3, *part)
    s = cal.scales()[3]
    q, k, v = (torch.cat(t, dim=1) for t in zip(*parts, strict=True))
    r = rotation_for(128, "cpu", 0)
    kr = k @ r
    mean = kr.mean(dim=(0, 1))
    torch.testing.assert_close(s.k_mean, mean)
    torch.testing.assert_close(s.k_amax, (kr - mean).abs().amax(dim=(0, 1, 3)))
    torch.testing.assert_close(s.q_amax, (q @ r).reshape(1, 65, 2, 256).abs().amax(dim=(0, 1, 3)))
    torch.testing.assert_close(s.v_amax, v.abs().amax(dim=(0, 1, 3)))
    plain = Calibrator(Recipe(False, False))
    plain.observe(0, q, k, v)
    torch.testing.assert_close(plain.scales()[0].k_amax, k.abs().amax(dim=(0, 1, 3)))


def test_save_load_and_static_preparation(tmp_path):
    cal = Calibrator(Recipe(True, True, seed=5))
    cal.observe(0, *_qkv(0))
    scales = cal.scales()
    path = tmp_path / "scales.safetensors"
    scales.save(path)
    loaded = StaticScales.load(path)
    assert loaded.recipe == Recipe(True, True, seed=5) and list(loaded.layers) == [0]
    for name in ("q_amax", "k_amax", "v_amax", "k_mean"):
        assert torch.equal(getattr(loaded[0], name), getattr(scales[0], name))
    q, k, v = (t.bfloat16() for t in _qkv(7))
    q8, k8, v8, d = prepare(q, k, v, loaded.recipe, loaded[0])
    kr = k.float() @ rotation_for(128, "cpu", 5)
    assert (decode(k8, d["k_descale"]) - (kr - loaded[0].k_mean)).abs().max() < 0.5  # the fixed mean, not k's
    assert d["q_descale"].shape == (1, 2)
    with pytest.raises(ValueError, match="calibrated with .* but are used with"):
        prepare(q, k, v, Recipe(True, False, seed=5), loaded[0])
    with pytest.raises(KeyError, match="no static scales for layer 4"):
        loaded[4]


def test_load_refuses_other_files(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match="not a ZYFA static-scales file"):
        StaticScales.load(path)
    with pytest.raises(ValueError, match="has seen no data"):
        Calibrator().scales()


def test_static_scales_in_the_model(tmp_path):
    model = models.random_model("llama", key_bias=20.0)
    gen = torch.Generator().manual_seed(1)
    calibration = [torch.randint(0, 512, (1, 64), generator=gen) for _ in range(2)]
    scales = calibrate(model, calibration)
    assert sorted(scales.layers) == [0, 1]
    path = tmp_path / "s.safetensors"
    scales.save(path)
    ids = torch.randint(0, 512, (1, 96), generator=gen)
    hf.register()
    with torch.no_grad():
        ref = model(ids).logits
        hf.configure(model, scales=path)
        hf.counts.clear()
        with hf.use(model, "zyfa-fp8"):
            static = model(ids).logits
        hf.configure(model)
    assert hf.counts == {"zyfa-fp8": 2}
    assert kl_divergence(ref, static) < 2e-3
    with pytest.raises(ValueError, match="calibrated with"):
        hf.configure(model, rotation=False, scales=path)
