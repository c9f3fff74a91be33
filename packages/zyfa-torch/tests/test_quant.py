"""fp8_quantize: power-of-two scale from the amax, round to nearest even, descale on the tensor's device."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zyfa import fp8_quantize

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def exponent_of(descale: torch.Tensor) -> int:
    """s with descale == 2**-s exactly (fails if descale is not a power of two)."""
    mantissa, exponent = math.frexp(descale.item())
    assert mantissa == 0.5, f"descale {descale.item()} is not a power of two"
    return 1 - exponent


@pytest.mark.parametrize(
    ("amax", "s"),
    [(448.0, 0), (449.0, -1), (1.0, 8), (0.875, 9), (0.876, 8), (224.0, 1), (1e6, -12), (2.0**-100, 108)],
)
def test_scale_is_the_largest_power_of_two_that_fits(amax, s):
    x = torch.tensor([amax, -amax / 3, 0.0])
    x8, descale = fp8_quantize(x)
    assert descale.dtype == torch.float32 and descale.shape == (1,) and descale.device == x.device
    assert exponent_of(descale) == s
    assert amax * 2.0**s <= E4M3_MAX < amax * 2.0 ** (s + 1)
    assert x8.dtype == FP8 and x8.shape == x.shape


def test_round_to_nearest_even():
    """With amax 448 the scale is 1: halfway values go to the even e4m3 neighbour (three mantissa bits)."""
    x = torch.tensor([448.0, 1.0625, 1.1875, 1.0624, 1.0626, -1.0625, 0.5 * 2.0**-9 * 1.5, 2.0**-10, 2.0**-11])
    x8, descale = fp8_quantize(x)
    assert descale.item() == 1.0
    expected = [448.0, 1.0, 1.25, 1.0, 1.125, -1.0, 2.0**-9, 0.0, 0.0]  # 2**-10 ties to 0 (smallest subnormal 2**-9)
    assert x8.float().tolist() == expected


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_input_dtypes(dtype):
    x = (torch.randn(64, 32) * 3).to(dtype)
    x8, descale = fp8_quantize(x)
    s = exponent_of(descale)
    assert torch.equal(x8.view(torch.uint8), (x.double() * 2.0**s).to(FP8).view(torch.uint8))


def test_zeros_and_non_finite():
    x8, descale = fp8_quantize(torch.zeros(4, 4, dtype=torch.bfloat16))
    assert descale.item() == 2.0**-9 and not x8.float().any()
    for bad in (math.inf, math.nan):
        _, descale = fp8_quantize(torch.tensor([1.0, bad]))
        assert math.isnan(descale.item())


def test_extreme_amax_keeps_descale_normal():
    for amax in (1e-42, 3e38):
        _, descale = fp8_quantize(torch.tensor([amax]))
        assert torch.finfo(torch.float32).tiny <= descale.item() <= torch.finfo(torch.float32).max


def test_errors():
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fp8_quantize([1.0])
    with pytest.raises(TypeError, match="x has dtype torch.int32"):
        fp8_quantize(torch.ones(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="x has dtype torch.float8_e4m3fn"):
        fp8_quantize(torch.ones(3).to(FP8))
    with pytest.raises(ValueError, match="x is empty"):
        fp8_quantize(torch.ones(0))


@settings(max_examples=40, deadline=None)
@given(
    log_scale=st.floats(-30, 30),
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_property_fits_and_rounds(log_scale, shape, seed):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2.0**log_scale
    x = x.float()
    x8, descale = fp8_quantize(x)
    s = exponent_of(descale)
    amax = x.abs().max().item()
    assert amax * 2.0**s <= E4M3_MAX < amax * 2.0 ** (s + 1)
    scaled = x.double() * 2.0**s
    error = (x8.double() - scaled).abs()
    # round to nearest: within half an e4m3 step (2**-3 relative for normals, 2**-10 absolute for subnormals)
    half_step = torch.maximum(scaled.abs() * 2.0**-4, torch.full_like(scaled, 2.0**-10))
    assert (error <= half_step).all()
    assert torch.allclose(x8.double() * descale.item(), x.double(), rtol=2.0**-4, atol=2.0**-10 * descale.item())
