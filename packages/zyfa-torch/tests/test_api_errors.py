"""Every rule of the public API: each unsupported argument raises ValueError or TypeError naming it and the rule."""

from __future__ import annotations

import math

import pytest
import torch

from zyfa import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
)

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


def qkv(batch=1, seqlen=16, heads=2, heads_k=2, d_qk=128, d_v=128, dtype=BF16, device="cpu"):
    def t(h, d):
        return torch.zeros(batch, seqlen, h, d, device=device).to(dtype)

    return t(heads, d_qk), t(heads_k, d_qk), t(heads_k, d_v)


FP8_DESCALES = {"q_descale": 1.0, "k_descale": 1.0, "v_descale": 1.0}


def raises(error, *patterns):
    """pytest.raises whose message must contain every pattern (the argument's name and the rule)."""
    return pytest.raises(error, match="(?s)" + "".join(f"(?=.*{p})" for p in patterns))


# --- flash-attn options ------------------------------------------------------------------------------------------


def test_causal_false_raises():
    with raises(ValueError, "causal=False", "causal=True"):
        flash_attn_func(*qkv())
    with raises(TypeError, "causal", "bool"):
        flash_attn_func(*qkv(), causal=1)


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (None, None), [-1, -1]])
def test_causal_windows_accepted(window):
    assert flash_attn_func(*qkv(), causal=True, window_size=window).shape == (1, 16, 2, 128)


@pytest.mark.parametrize("window", [(128, 0), (-1, 5), (0, 0), (-1,), -1, None])
def test_other_windows_raise(window):
    with raises(ValueError, "window_size", "sliding window"):
        flash_attn_func(*qkv(), causal=True, window_size=window)


def test_dropout_softcap_alibi_raise():
    with raises(ValueError, "dropout_p", "0.0"):
        flash_attn_func(*qkv(), 0.1, causal=True)
    with raises(ValueError, "softcap", "0.0"):
        flash_attn_func(*qkv(), causal=True, softcap=30.0)
    with raises(ValueError, "alibi_slopes", "None"):
        flash_attn_func(*qkv(), causal=True, alibi_slopes=torch.ones(2))
    with raises(TypeError, "dropout_p", "float"):
        flash_attn_func(*qkv(), "0", causal=True)
    with raises(TypeError, "softcap", "float"):
        flash_attn_func(*qkv(), causal=True, softcap=None)


def test_flash_attn_3_positional_order_raises():
    q, k, v = qkv()
    for call in (
        lambda: flash_attn_func(q, k, v, 0.125, True),  # flash-attn 3: (q, k, v, softmax_scale, causal)
        lambda: flash_attn_func(q, k, v, True),
        lambda: flash_attn_func(q, k, v, softmax_scale=True),
        lambda: flash_attn_qkvpacked_func(torch.stack([q, k, v], 2), 0.125, True),
        lambda: flash_attn_kvpacked_func(q, torch.stack([k, v], 2), 0.125, True),
    ):
        with raises(TypeError, "flash-attn 3", "by keyword"):
            call()


@pytest.mark.parametrize("scale", [0.0, -0.1, math.inf, math.nan])
def test_bad_softmax_scale_value(scale):
    with raises(ValueError, "softmax_scale", "positive and finite"):
        flash_attn_func(*qkv(), softmax_scale=scale, causal=True)


@pytest.mark.parametrize("scale", ["0.1", torch.tensor(0.1), [0.1]])
def test_bad_softmax_scale_type(scale):
    with raises(TypeError, "softmax_scale", "float"):
        flash_attn_func(*qkv(), softmax_scale=scale, causal=True)


# --- tensors -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float8_e5m2])
def test_unsupported_dtype(dtype):
    with raises(TypeError, "q has dtype", "bfloat16 or torch.float8_e4m3fn"):
        flash_attn_func(*qkv(dtype=dtype), causal=True)


def test_mixed_dtypes():
    q, k, v = qkv()
    with raises(TypeError, "k has dtype", "share one dtype"):
        flash_attn_func(q, k.to(FP8), v, causal=True)
    with raises(TypeError, "v has dtype", "share one dtype"):
        flash_attn_func(q, k, v.half(), causal=True)


def test_mixed_devices():
    q, k, v = qkv()
    with raises(ValueError, "v is on meta", "one device"):
        flash_attn_func(q, k, v.to("meta"), causal=True)


def test_not_a_tensor():
    q, k, v = qkv()
    with raises(TypeError, "k must be a torch.Tensor"):
        flash_attn_func(q, [1.0], v, causal=True)


@pytest.mark.parametrize(
    ("shape", "patterns"),
    [
        ({"d_qk": 64, "d_v": 64}, ("d_qk=64", "kernels take d_qk = 128, d_v = 128 or d_qk = 192, d_v = 128")),
        ({"d_qk": 128, "d_v": 64}, ("d_v=64",)),
        ({"d_qk": 192, "d_v": 192}, ("d_qk=192, d_v=192",)),
        ({"d_qk": 256, "d_v": 128}, ("d_qk=256",)),
        ({"heads": 3, "heads_k": 2}, ("3 heads", "multiple of nheads_k")),
        ({"seqlen": 0}, ("seqlen 0", "empty")),
        ({"batch": 0}, ("batch 0", "empty")),
    ],
)
def test_bad_shapes(shape, patterns):
    with raises(ValueError, *patterns):
        flash_attn_func(*qkv(**shape), causal=True)


def test_mismatched_shapes():
    q, k, v = qkv()
    with raises(ValueError, "batch sizes differ", "equal"):
        flash_attn_func(q, torch.cat([k, k]), v, causal=True)
    with raises(ValueError, "sequence lengths differ", "seqlen_q == seqlen_k"):
        flash_attn_func(q, k[:, :8], v[:, :8], causal=True)
    with raises(ValueError, "k has 2 heads but v has 1"):
        flash_attn_func(q, k, v[:, :, :1], causal=True)
    with raises(ValueError, "q has head dim 128 but k has 192"):
        flash_attn_func(q, torch.zeros(1, 16, 2, 192, dtype=BF16), v, causal=True)
    with raises(ValueError, "k has 3 dimensions", "expected 4"):
        flash_attn_func(q, k[0], v, causal=True)


def test_bad_layout():
    with raises(ValueError, "layout='sbhd'", "bshd"):
        flash_attn_func(*qkv(), causal=True, layout="sbhd")


# --- descales ----------------------------------------------------------------------------------------------------


def test_descales_with_bf16_raise():
    with raises(ValueError, "k_descale", "FP8 inputs only"):
        flash_attn_func(*qkv(), causal=True, k_descale=1.0)


@pytest.mark.parametrize("missing", ["q_descale", "k_descale", "v_descale"])
def test_missing_descale_with_fp8(missing):
    given = {name: 1.0 for name in FP8_DESCALES if name != missing}
    with raises(ValueError, f"{missing} is missing", "FP8 inputs need"):
        flash_attn_func(*qkv(dtype=FP8), causal=True, **given)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.int32])
def test_non_float32_descale_tensor(dtype):
    descales = dict(FP8_DESCALES, v_descale=torch.ones(1, dtype=dtype))
    with raises(TypeError, "v_descale has dtype", "float32"):
        flash_attn_func(*qkv(dtype=FP8), causal=True, **descales)


@pytest.mark.parametrize("shape", [(2,), (1, 1, 2), (2, 2), (1, 3), (0,)])
def test_descale_tensor_shape(shape):
    descales = dict(FP8_DESCALES, q_descale=torch.ones(shape))
    with raises(ValueError, "q_descale has shape", "(batch, nheads_k)"):
        flash_attn_func(*qkv(dtype=FP8), causal=True, **descales)


@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, math.nan, 1e-40, 1e39])
def test_descale_float_value(value):
    descales = dict(FP8_DESCALES, k_descale=value)
    with raises(ValueError, "k_descale=", "positive, finite, normal"):
        flash_attn_func(*qkv(dtype=FP8), causal=True, **descales)


@pytest.mark.parametrize("value", ["1.0", True, [1.0]])
def test_descale_type(value):
    descales = dict(FP8_DESCALES, q_descale=value)
    with raises(TypeError, "q_descale must be a float or a float32 tensor"):
        flash_attn_func(*qkv(dtype=FP8), causal=True, **descales)


def test_descale_on_another_device():
    descales = dict(FP8_DESCALES, q_descale=torch.ones(1, device="meta"))
    with raises(ValueError, "q_descale is on meta", "one device"):
        flash_attn_func(*qkv(dtype=FP8), causal=True, **descales)


# --- packed and varlen -------------------------------------------------------------------------------------------


def test_packed_shapes():
    q, k, v = qkv()
    with raises(ValueError, "qkv has shape", r"\(batch, seqlen, 3, heads, dim\)"):
        flash_attn_qkvpacked_func(torch.stack([q, k], 2), causal=True)
    with raises(ValueError, "qkv has shape", r"\(batch, 3, heads, seqlen, dim\)"):
        flash_attn_qkvpacked_func(torch.stack([q, k, v], 2), causal=True, layout="bhsd")
    with raises(ValueError, "kv has shape", r"\(batch, seqlen, 2, heads, dim\)"):
        flash_attn_kvpacked_func(q, k, causal=True)
    with raises(TypeError, "qkv must be a torch.Tensor"):
        flash_attn_qkvpacked_func((q, k, v), causal=True)
    with raises(ValueError, "layout='sbhd'"):
        flash_attn_qkvpacked_func(torch.stack([q, k, v], 2), causal=True, layout="sbhd")


def varlen_args(batch=2, seqlen=16, heads=2, heads_k=2, dtype=BF16):
    q, k, v = (t.reshape(batch * seqlen, t.shape[2], t.shape[3]) for t in qkv(batch, seqlen, heads, heads_k))
    cu = torch.arange(batch + 1, dtype=torch.int32) * seqlen
    return [q, k, v, cu, cu.clone(), seqlen, seqlen]


def test_varlen_accepts_equal_lengths():
    assert flash_attn_varlen_func(*varlen_args(), causal=True).shape == (32, 2, 128)


@pytest.mark.parametrize(
    ("index", "value", "error", "patterns"),
    [
        (3, torch.tensor([0, 10, 32], dtype=torch.int32), ValueError, ("cu_seqlens_q", "unequal varlen lengths")),
        (4, torch.tensor([0, 12, 32], dtype=torch.int32), ValueError, ("cu_seqlens_k", "unequal varlen lengths")),
        (3, torch.tensor([0, 16, 32]), ValueError, ("cu_seqlens_q", "1-D torch.int32")),
        (3, torch.tensor([[0, 16, 32]], dtype=torch.int32), ValueError, ("cu_seqlens_q", "1-D torch.int32")),
        (3, torch.tensor([0], dtype=torch.int32), ValueError, ("cu_seqlens_q", "batch \\+ 1 offsets")),
        (3, [0, 16, 32], TypeError, ("cu_seqlens_q", "torch.Tensor")),
        (3, torch.tensor([0, 16, 32], dtype=torch.int32, device="meta"), ValueError, ("cu_seqlens_q is on meta",)),
        (4, torch.tensor([0, 32], dtype=torch.int32), ValueError, ("cu_seqlens_k", "1 sequences hold 32 tokens")),
        (5, 8, ValueError, ("max_seqlen_q=8, max_seqlen_k=16", "seqlen_q == seqlen_k")),
        (5, 16.0, TypeError, ("max_seqlen", "int")),
    ],
)
def test_varlen_errors(index, value, error, patterns):
    args = varlen_args()
    args[index] = value
    if index == 5 and error is TypeError:
        args[6] = value
    with raises(error, *patterns):
        flash_attn_varlen_func(*args, causal=True)


def test_varlen_more_errors():
    q, k, v, cu, cu_k, s, _ = varlen_args()
    with raises(ValueError, "max_seqlen=0", "empty"):
        flash_attn_varlen_func(q[:0], k[:0], v[:0], cu * 0, cu_k * 0, 0, 0, causal=True)
    with raises(ValueError, "k holds 32 tokens but v 16"):
        flash_attn_varlen_func(q, k, v[:16], cu, cu_k, s, s, causal=True)
    with raises(ValueError, "cu_seqlens_q holds 2 sequences but cu_seqlens_k 1"):
        flash_attn_varlen_func(q, k[:16], v[:16], cu, torch.tensor([0, 16], dtype=torch.int32), s, s, causal=True)
    with raises(ValueError, "q has 4 dimensions", "total, heads, dim"):
        flash_attn_varlen_func(q[None], k, v, cu, cu_k, s, s, causal=True)
    with raises(ValueError, "block_table", "None"):
        flash_attn_varlen_func(q, k, v, cu, cu_k, s, s, causal=True, block_table=torch.zeros(1, 1))
    with raises(ValueError, "causal=False"):
        flash_attn_varlen_func(q, k, v, cu, cu_k, s, s)
    with raises(TypeError, "flash-attn 3"):
        flash_attn_varlen_func(q, k, v, cu, cu_k, s, s, 0.125, True)
