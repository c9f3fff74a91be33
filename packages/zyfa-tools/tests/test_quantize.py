"""FP8 preparation: power-of-two scales, the rotate-and-quantize pass, and ZYFA FP8 attention through it."""

from __future__ import annotations

import pytest
import torch

from zyfa import fp8_quantize
from zyfa_tools import inputs
from zyfa_tools.quantize import Recipe, fp8_attention, pow2_scales, prepare, rotate_quantize
from zyfa_tools.reference import attention_fp64, decode, relative_rms_error
from zyfa_tools.rotation import rotation_matrix

FP8 = torch.float8_e4m3fn


def test_pow2_scales_match_fp8_quantize():
    for amax in (0.0, 1e-3, 0.875, 1.0, 447.0, 448.0, 449.0, 3.0e5):
        x = torch.tensor([amax, -amax / 3])
        scale, descale = pow2_scales(x.abs().amax())
        x8, ref_descale = fp8_quantize(x)
        assert descale.item() == ref_descale.item() and scale.item() * descale.item() == 1.0
        assert torch.equal((x * scale).to(FP8).view(torch.uint8), x8.view(torch.uint8))


def test_rotate_quantize_per_call_and_static():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 33, 4, 128, generator=gen).bfloat16()
    r = rotation_matrix(128)
    x8, descale = rotate_quantize(x, 2, rotation=r)
    assert x8.shape == x.shape and x8.dtype == FP8 and descale.shape == (2, 2) and x8.is_contiguous()
    y = (x.float() @ r).reshape(2, 33, 2, 2, 128)
    amax = y.abs().amax(dim=(1, 3, 4))
    assert torch.equal(descale, pow2_scales(amax)[1])  # one scale per (batch, kv head), from the rotated amax
    assert (x8.float().abs().amax() <= 448) and (x8.float().abs().amax() > 224)
    err = relative_rms_error(decode(x8, descale).reshape(y.shape), y)
    assert 0.01 < err < 0.04  # e4m3 rounding: 3 mantissa bits
    # static: a scale that is too large saturates at 448 instead of overflowing to NaN
    big, _ = pow2_scales(torch.full((2, 2), 0.01))
    s8, sd = rotate_quantize(x, 2, rotation=r, scale=big)
    assert torch.equal(sd, 1 / big) and s8.float().abs().max() == 448 and not s8.float().isnan().any()
    # transformers' (batch, heads, seqlen, d) tensors come as transposed views: same bytes, written contiguous
    # (the rotation's float32 sums may round differently with other strides: a few codes move by one)
    for rot, moved in ((None, 0.0), (r, 0.01)):
        t8, _ = rotate_quantize(x.transpose(1, 2).contiguous().transpose(1, 2), 2, rotation=rot)
        codes, ref = t8.view(torch.uint8).int(), rotate_quantize(x, 2, rotation=rot)[0].view(torch.uint8).int()
        assert t8.is_contiguous() and (codes != ref).double().mean() <= moved and (codes - ref).abs().max() <= 1


@pytest.mark.slow
def test_compiled_pass_equals_eager():
    x = torch.randn(1, 64, 2, 128).bfloat16()
    r = rotation_matrix(128)
    a = rotate_quantize(x, 1, rotation=r, smooth=True, compile=True)
    b = rotate_quantize(x, 1, rotation=r, smooth=True, compile=False)
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])


def test_prepare_smooths_the_rotated_keys():
    q, k, v = (t.bfloat16() for t in inputs.gaussian(1, 100, 4, 2, seed=1))
    k = (k.float() + 1.0).bfloat16()
    q8, k8, v8, d = prepare(q, k, v, Recipe(rotation=True, smoothing=True))
    r = rotation_matrix(128)
    kr = k.float() @ r
    dec = decode(k8, d["k_descale"])
    torch.testing.assert_close(dec.mean(dim=1), torch.zeros(1, 2, 128, dtype=torch.float64), atol=2e-3, rtol=0)
    assert relative_rms_error(dec, kr - kr.mean(dim=1, keepdim=True)) < 0.04
    assert torch.equal(v8.view(torch.uint8), rotate_quantize(v, 2)[0].view(torch.uint8))  # v is never rotated


@pytest.mark.parametrize("d_qk", [128, 192])
def test_fp8_attention_close_and_helped_by_the_recipe(d_qk):
    """On activation-like inputs (K outlier channels, a sink) rotation lowers the error; every variant stays
    near the BF16 error times FP8's precision."""
    q, k, v = (t.bfloat16() for t in inputs.activation_like(1, 256, 4, 2, d_qk, 128, seed=0))
    ref = attention_fp64(q, k, v)
    errors = {recipe: relative_rms_error(fp8_attention(q, k, v, recipe), ref)
              for recipe in (Recipe(False, False), Recipe(True, False), Recipe(True, True))}
    assert all(e < 0.08 for e in errors.values())
    assert errors[Recipe(True, True)] < errors[Recipe(False, False)] * 0.97
