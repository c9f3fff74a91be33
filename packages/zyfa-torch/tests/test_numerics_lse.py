"""The contract's lse bound (numerics.lse_error_bound): its value, inputs that nearly reach it, and inputs that
must stay within it (random ones, and the case that broke the previous contract's bound)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zyfa import flash_attn_func, numerics
from zyfa_tools.reference import attention_fp64

FP8 = torch.float8_e4m3fn


def bound(p_mode, **options):
    return numerics.lse_error_bound(numerics.resolve_config(FP8, 128, p_mode=p_mode, **options))


def lse_error(q, k, v, descales=None, **options):
    """Largest |lse - lse_fp64| in nats of the model with `options`, and where it occurs (batch, head, row)."""
    descales = descales or {}
    _, lse = numerics.attention(q, k, v, return_lse=True, **descales, **options)
    _, ref = attention_fp64(q, k, v, return_lse=True, **descales)
    err = (lse.double() - ref).abs()
    return err.max().item(), tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))


def test_bound_values():
    others = 63 * 2.0**-10 / 2**7  # a block's 63 other keys, each off by half a subnormal step, against 2^7
    assert bound("exact") == pytest.approx(-math.log(1 - 1 / 17 - others) + 1e-4, rel=1e-12)  # 0.0612
    assert bound("lean") == pytest.approx(math.log(1.5 / math.sqrt(2) * 2 ** (1 / 16)) + 1e-4, rel=1e-12)  # 0.1023
    assert bound("exact", block_scale=False) is None  # a row's tail can drop to zero
    assert bound("lean", p_shift=0) is None  # a block's subnormal codes can outweigh its largest value
    assert bound("exact", rowsum="fp32") == numerics.LSE_FP32_ALLOWANCE
    bf16 = numerics.resolve_config(torch.bfloat16, 128)
    assert numerics.lse_error_bound(bf16) == numerics.LSE_FP32_ALLOWANCE
    bf16_rounded = numerics.resolve_config(torch.bfloat16, 128, rowsum="rounded")
    assert numerics.lse_error_bound(bf16_rounded) == pytest.approx(math.log(257 / 256) + 1e-4)


def _two_level_row(gap, seqlen=256, d=16):
    """Key 0 scores `gap` binades above all other keys for every query (q = e_0, k_0 = 2, k_j = 1.75)."""
    q = torch.zeros(1, seqlen, 1, d)
    q[..., 0] = 1.0
    k = torch.zeros(1, seqlen, 1, d)
    k[..., 0] = 1.75
    k[:, 0, :, 0] = 2.0
    v = torch.randn(1, seqlen, 1, d, generator=torch.Generator().manual_seed(0))
    scale = gap / 0.25 * math.log(2)  # scores in binades: 2c and 1.75c
    return [t.to(FP8) for t in (q, k, v)], scale


@pytest.mark.parametrize("p_mode,gap,low,sign", [
    # lean: y = 8 - 0.5624 puts 8y + 56 just above the tie 115.5, so code 116 = 1.5 * 2^7 = 192 stands for
    # 2^7.4376 = 173.4: 10.7% high, the most lean P overstates a value.
    ("lean", 0.5624, 0.099, 1),
    # exact: 2^y just below 136 = 17/16 * 2^7 rounds to 128: 5.9% low, the most exact P understates a value.
    ("exact", 0.9126, 0.0595, -1),
])
def test_bound_is_nearly_reached(p_mode, gap, low, sign):
    (q, k, v), scale = _two_level_row(gap)
    _, lse = numerics.attention(q, k, v, softmax_scale=scale, p_mode=p_mode, return_lse=True)
    _, ref = attention_fp64(q, k, v, softmax_scale=scale, return_lse=True)
    err = (lse.double() - ref)[0, 0]
    worst = err[-1].item()  # the last row holds the most keys of the lower level
    assert low < sign * worst <= bound(p_mode)
    assert (err.abs() <= bound(p_mode)).all()


def _randn_case():
    """The case that exceeded the previous bound (0.11 nats): randn q, k, v cast to FP8, GQA 8/4, S = 251."""
    torch.manual_seed(153686867)
    q, k, v = torch.randn(2, 251, 8, 128), torch.randn(2, 251, 4, 128), torch.randn(2, 251, 4, 128)
    return [t.to(FP8) for t in (q, k, v)]


def test_the_case_beyond_the_previous_bound_stays_within_the_new_one():
    q, k, v = _randn_case()
    previous, where = lse_error(q, k, v, p_mode="lean", p_shift=0)  # the previous default at d = 128
    assert previous > 0.11 and where == (1, 7, 75)  # batch 1, head 7, row 75: its blocks' subnormal codes
    for p_mode in ("exact", "lean"):
        err, _ = lse_error(q, k, v, p_mode=p_mode)
        assert err <= bound(p_mode)
    # The public call in the bhsd layout (the reference backend on CPU).
    bhsd = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
    _, lse = flash_attn_func(*bhsd, causal=True, layout="bhsd", return_lse=True, q_descale=1.0, k_descale=1.0,
                             v_descale=1.0)
    _, ref = attention_fp64(q, k, v, return_lse=True)
    assert (lse.double() - ref).abs().max().item() <= bound("exact")


@settings(max_examples=15, deadline=None)
@given(seqlen=st.integers(1, 300), heads_k=st.integers(1, 2), group=st.sampled_from([1, 2, 4]),
       dims=st.sampled_from([(128, 128), (192, 128)]), sharpness=st.floats(0.25, 4.0),
       p_mode=st.sampled_from(["exact", "lean"]), seed=st.integers(0, 2**16))
def test_random_inputs_stay_within_the_bound(seqlen, heads_k, group, dims, sharpness, p_mode, seed):
    gen = torch.Generator().manual_seed(seed)
    heads = heads_k * group
    q = torch.randn(1, seqlen, heads, dims[0], generator=gen) * sharpness  # sharper rows put keys far down
    k = torch.randn(1, seqlen, heads_k, dims[0], generator=gen)
    v = torch.randn(1, seqlen, heads_k, dims[1], generator=gen)
    descales = {name: torch.rand(1, heads_k, generator=gen) + 0.5 for name in ("q_descale", "k_descale", "v_descale")}
    err, _ = lse_error(*(t.to(FP8) for t in (q, k, v)), descales, p_mode=p_mode)
    assert err <= bound(p_mode)
