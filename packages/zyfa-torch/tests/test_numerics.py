"""The numerics model against an independent per-row scalar implementation of the contract, and its promises."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

import zyfa
from zyfa import numerics
from zyfa.backends import reference
from zyfa_tools.reference import attention_fp64, relative_rms_error

FP8 = torch.float8_e4m3fn
f32 = np.float32


# ---------------------------------------------------------------------------------------------------------------
# An independent straightforward implementation: one row at a time, one key at a time, FP32 scalars.


def _bf16_round(x: float) -> float:
    """Round an FP32 value to BF16 (nearest even) by its bit pattern."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _e4m3_round(p: float) -> float:
    """Round a non-negative value below 448 to e4m3 (nearest even): 3 mantissa bits, smallest exponent -6."""
    if p == 0:
        return 0.0
    exponent = max(math.floor(math.log2(p)), -6)
    quantum = 2.0 ** (exponent - 3)
    return round(p / quantum) * quantum  # Python's round is half to even


def _e4m3_decode(code: int) -> float:
    exponent, mantissa = code >> 3, code & 7
    return mantissa * 2.0**-9 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def scalar_attention(q, k, v, *, scale, p_mode, block_scale, rowsum, tau, tile, block, descales=None, p_shift=0):
    """Returns out (float, BF16-valued), lse, and the extremes of e and of the lean codes that occurred."""
    b_, s_, h_, _ = q.shape
    hk, dv = k.shape[2], v.shape[3]
    qd, kd, vd = descales if descales is not None else [torch.ones(b_, hk)] * 3
    qs, ks, vs = (t.double().tolist() for t in (q, k, v))
    out = np.zeros((b_, s_, h_, dv))
    lse = np.zeros((b_, h_, s_))
    seen = {"e_min": math.inf, "e_max": -math.inf, "y_max": -math.inf, "code_max": 0, "rescales": 0,
            "subnormal_codes": 0}
    for b in range(b_):
        for h in range(h_):
            g = h // (h_ // hk)
            c = f32(f32(f32(scale / math.log(2)) * f32(qd[b, g].item())) * f32(kd[b, g].item()))
            for i in range(s_):
                m, l, o = None, f32(0), [f32(0)] * dv
                for t0 in range(0, i + 1, tile):
                    keys = range(t0, min(t0 + tile, i + 1))
                    x = {j: f32(c * f32(math.fsum(map(float.__mul__, qs[b][i][h], ks[b][j][g])))) for j in keys}
                    mt = max(x.values())
                    if m is None or mt > f32(m + f32(tau)):
                        alpha = f32(0) if m is None else f32(2.0 ** float(f32(m - mt)))
                        seen["rescales"] += m is not None
                        m, l, o = mt, f32(l * alpha), [f32(a * alpha) for a in o]
                    if p_mode == "bf16":
                        p = {j: f32(2.0 ** float(f32(x[j] - m))) for j in keys}
                        pr = {j: _bf16_round(p[j]) for j in keys}
                        l = f32(l + f32(math.fsum((pr if rowsum == "rounded" else p).values())))
                        o = [f32(o[d] + f32(math.fsum(pr[j] * vs[b][j][g][d] for j in keys))) for d in range(dv)]
                        continue
                    for b0 in range(t0, t0 + tile, block):
                        bkeys = [j for j in keys if b0 <= j < b0 + block]
                        if not bkeys:
                            continue
                        mb = max(x[j] for j in bkeys)
                        e = math.floor(f32(m - mb)) if block_scale else 0
                        seen["e_min"], seen["e_max"] = min(seen["e_min"], e), max(seen["e_max"], e)
                        y = {j: f32(f32(x[j] - m) + f32(e)) for j in bkeys}
                        seen["y_max"] = max(seen["y_max"], *y.values())
                        if p_mode == "lean":
                            codes = {j: max(0, int(np.rint(f32(f32(8 * y[j]) + f32(56 + 8 * p_shift))))) for j in bkeys}
                            seen["code_max"] = max(seen["code_max"], *codes.values())
                            seen["subnormal_codes"] += sum(0 < cd < 8 for cd in codes.values())
                            p8 = {j: _e4m3_decode(codes[j]) for j in bkeys}
                        else:
                            p8 = {j: _e4m3_round(f32(2.0 ** float(y[j])) * 2.0**p_shift) for j in bkeys}
                        w = 2.0**-e
                        if rowsum == "rounded":
                            rs = f32(math.fsum(p8.values()))
                        else:
                            rs = f32(math.fsum(f32(2.0 ** float(y[j])) * 2.0**p_shift for j in bkeys))
                        l = f32(l + f32(w * rs))
                        o = [f32(o[d] + f32(w * f32(math.fsum(p8[j] * vs[b][j][g][d] for j in bkeys))))
                             for d in range(dv)]
                vscale = f32(vd[b, g].item())
                out[b, i, h] = [_bf16_round(f32(f32(a / l) * vscale)) for a in o]
                lse[b, h, i] = f32(math.log(2) * (float(m) - p_shift + math.log2(float(l))))
    return out, lse, seen


def _inputs(dtype, *, seqlen=72, heads=2, heads_k=1, d_qk=16, d_v=8, sharpness=3.0, seed=0):
    """Scores a few binades wide, with a strong key 0, so that rescaling, e >= 1 and tiny codes all occur."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, seqlen, heads, d_qk, generator=gen) * sharpness
    k = torch.randn(1, seqlen, heads_k, d_qk, generator=gen)
    k[:, 0] += 2 * q[:, :, : heads // heads_k].mean(dim=(1, 2)) / sharpness
    k[:, 1::5] *= 1.6  # a ragged ladder of stronger keys makes later tiles raise the row maximum
    v = torch.randn(1, seqlen, heads_k, d_v, generator=gen)
    return tuple(t.to(dtype) for t in (q, k, v))


SCALAR_CASES = [
    # p_mode, block_scale, rowsum
    ("bf16", True, "fp32"),
    ("bf16", True, "rounded"),
    ("lean", True, "rounded"),
    ("lean", False, "fp32"),
    ("exact", True, "rounded"),
    ("exact", False, "rounded"),
    ("exact", True, "fp32"),
]


@pytest.mark.parametrize("p_mode,block_scale,rowsum", SCALAR_CASES)
def test_model_equals_scalar_implementation(p_mode, block_scale, rowsum):
    dtype = torch.bfloat16 if p_mode == "bf16" else FP8
    q, k, v = _inputs(dtype)
    tau = 0.125 if dtype == FP8 else 0.5
    descales = None
    kwargs = {}
    if dtype == FP8:
        descales = [torch.tensor([[0.7]]), torch.tensor([[1.3]]), torch.tensor([[0.25]])]
        kwargs = dict(zip(("q_descale", "k_descale", "v_descale"), descales, strict=True))
    scale = 0.3
    out, lse = numerics.attention(q, k, v, softmax_scale=scale, p_mode=p_mode, block_scale=block_scale,
                                  rowsum=rowsum, rescale_threshold=tau, key_tile=32, scale_block=16,
                                  return_lse=True, **kwargs)
    want_out, want_lse, seen = scalar_attention(q, k, v, scale=scale, p_mode=p_mode, block_scale=block_scale,
                                                rowsum=rowsum, tau=tau, tile=32, block=16, descales=descales)
    assert seen["rescales"] > 0  # the inputs exercise lazy rescaling
    if dtype == FP8 and block_scale:
        assert seen["e_max"] >= 2 and seen["e_min"] == -1  # blocks far below the max, and the tau headroom used
        assert -1 < seen["y_max"] <= 0  # so 2^y <= 1: exact P never needs saturation
    np.testing.assert_array_equal(out.float().numpy(), want_out)
    np.testing.assert_array_equal(lse.numpy(), want_lse.astype(np.float32))


def test_model_equals_scalar_implementation_with_p_shift_and_partial_tile():
    q, k, v = _inputs(FP8, seqlen=50, heads=3, heads_k=3)
    out, lse = numerics.attention(q, k, v, p_mode="lean", key_tile=32, scale_block=16, p_shift=8, return_lse=True)
    want_out, want_lse, seen = scalar_attention(q, k, v, scale=0.25, p_mode="lean", block_scale=True,
                                                rowsum="rounded", tau=0.125, tile=32, block=16, p_shift=8)
    assert seen["code_max"] > 56
    np.testing.assert_array_equal(out.float().numpy(), want_out)
    np.testing.assert_array_equal(lse.numpy(), want_lse.astype(np.float32))


# ---------------------------------------------------------------------------------------------------------------
# The contract's promises.


@pytest.mark.parametrize("tau", [0.125, 0.5])
def test_block_scaling_keeps_codes_at_most_one_and_e_at_least_minus_one(tau):
    q, k, v = _inputs(FP8, seqlen=96, heads=2, heads_k=2, seed=3)
    _, _, seen = scalar_attention(q, k, v, scale=0.25, p_mode="lean", block_scale=True, rowsum="rounded",
                                  tau=tau, tile=32, block=16)
    assert seen["code_max"] == 56 and seen["e_min"] == -1 and seen["subnormal_codes"] > 0
    # Without block scaling the lazily kept maximum lets codes pass 1.0: the bound is block scaling's doing.
    _, _, seen = scalar_attention(q, k, v, scale=0.25, p_mode="lean", block_scale=False, rowsum="rounded",
                                  tau=0.5, tile=32, block=16)
    assert seen["code_max"] > 56


def test_lean_codes_formula_including_ties():
    y = torch.cat([torch.arange(-80, 9, dtype=torch.float32) / 16,  # every half-code tie in range
                   -torch.rand(2000, generator=torch.Generator().manual_seed(1)) * 9,
                   torch.tensor([-math.inf, -100.0])])
    codes = numerics.lean_codes(y)
    want = [max(0, round(8 * float(t) + 56)) if math.isfinite(t) else 0 for t in y.tolist()]
    assert codes.tolist() == want  # round() is half to even, as rne
    assert numerics.lean_p(torch.tensor([0.0, -1.0, -6.0, -7.0 + 1 / 8, -7.0])).tolist() == [
        1.0, 0.5, 2.0**-6, 2.0**-9, 0.0]


def test_exact_p_rounds_to_nearest_even_without_saturation():
    y = torch.cat([-torch.rand(3000, generator=torch.Generator().manual_seed(2)) * 12, torch.tensor([0.0])])
    p32 = torch.exp2(y.double()).float()
    want = [_e4m3_round(float(p)) for p in p32.tolist()]
    assert numerics.exact_p(y).tolist() == want
    assert numerics.exact_p(torch.tensor([0.0])).item() == 1.0


@pytest.mark.parametrize("p_mode", ["lean", "exact"])
def test_rounded_rowsum_makes_every_row_a_convex_combination(p_mode):
    q, k, v = _inputs(FP8, seqlen=256, heads=4, heads_k=2, d_qk=32, d_v=16, seed=4)
    v = v.float()
    v[..., 0] = 1.0  # a constant column: its output is the sum of the weights
    v = v.to(FP8)
    out = numerics.attention(q, k, v, p_mode=p_mode, softmax_scale=0.3).float()
    assert torch.all(out[..., 0] == 1.0)  # the weights sum to one to the last bit of FP32
    vf = v.float().repeat_interleave(2, dim=2)
    lo, hi = torch.cummin(vf, dim=1).values, torch.cummax(vf, dim=1).values
    assert torch.all((lo <= out) & (out <= hi))
    fp32_sum = numerics.attention(q, k, v, p_mode=p_mode, softmax_scale=0.3, rowsum="fp32").float()
    assert (fp32_sum[..., 0] - 1.0).abs().max() > 1e-3  # FA3's row sum does not have the property


def _probabilities_sum(q, k, scale, p_mode):
    """One key tile over all keys (no rescaling): sum_b 2^-e_b sum_j P8_bj with m the row max, in float64."""
    x = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()).float() * f32(scale / math.log(2))
    seqlen = x.shape[-1]
    x = x.masked_fill(torch.ones(seqlen, seqlen, dtype=torch.bool).triu(1), -math.inf)
    m = x.amax(-1, keepdim=True)
    xb = x.unflatten(-1, (-1, 64))
    mb = xb.amax(-1, keepdim=True)
    e = torch.where(mb > -math.inf, torch.floor(m[..., None] - mb), 0.0)
    p8 = numerics.lean_p((xb - m[..., None]) + e) if p_mode == "lean" else numerics.exact_p((xb - m[..., None]) + e)
    return m.squeeze(-1).double(), (p8.double() * torch.exp2(-e.double())).sum(dim=(-2, -1)), x


@pytest.mark.parametrize("p_mode", ["lean", "exact"])
def test_lse_is_log_of_rounded_probabilities_sum(p_mode):
    q, k, v = _inputs(FP8, seqlen=256, heads=2, heads_k=2, d_qk=32, d_v=16, seed=5)
    _, lse = numerics.attention(q, k, v, p_mode=p_mode, softmax_scale=0.3, key_tile=256, return_lse=True)
    m, rounded_sum, x = _probabilities_sum(q, k, 0.3, p_mode)
    want = math.log(2) * (m + torch.log2(rounded_sum))
    torch.testing.assert_close(lse.double(), want, rtol=0, atol=2e-6)
    true_lse = math.log(2) * torch.logsumexp(x.double() * math.log(2), dim=-1) / math.log(2)
    assert (lse.double() - true_lse).abs().max() > 1e-3  # lse follows the rounded sum, not the exact one


def test_bf16_error_against_fp64_is_near_2e_3():
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 1024, 4, 128, generator=gen).to(torch.bfloat16) for _ in range(3))
    out = numerics.attention(q, k, v)
    err = relative_rms_error(out, attention_fp64(q, k, v))
    assert 1.5e-3 < err < 2.5e-3


# ---------------------------------------------------------------------------------------------------------------
# Invariances the contract implies.


def _sink_inputs(dtype, seqlen=512, heads=2, d=64, seed=7):
    """Key 0 dominates every row by far, so tile 0 holds each row's maximum and no later tile rescales."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, seqlen, heads, d, generator=gen)
    q[..., 0] = 4.0
    k = torch.randn(1, seqlen, heads, d, generator=gen) * 0.5
    k[:, 0, :, 0] = 10.0
    v = torch.randn(1, seqlen, heads, d, generator=gen)
    return tuple(t.to(dtype) for t in (q, k, v))


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8])
def test_key_tile_only_changes_fp32_summation_order_when_no_tile_rescales(dtype):
    q, k, v = _sink_inputs(dtype)
    out64, lse64 = numerics.attention(q, k, v, key_tile=64, return_lse=True)
    for tile in (128, 256):
        out, lse = numerics.attention(q, k, v, key_tile=tile, return_lse=True)
        torch.testing.assert_close(out.float(), out64.float(), rtol=2**-8, atol=1e-6)  # one BF16 rounding step
        torch.testing.assert_close(lse, lse64, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8])
def test_gqa_equals_mha_with_repeated_kv(dtype):
    q, k, v = _inputs(dtype, seqlen=160, heads=6, heads_k=2, d_qk=32, d_v=16, seed=8)
    kwargs, mha_kwargs = {}, {}
    if dtype == FP8:
        descales = [torch.tensor([[0.5, 2.0]]), torch.tensor([[1.5, 0.75]]), torch.tensor([[3.0, 0.125]])]
        kwargs = dict(zip(("q_descale", "k_descale", "v_descale"), descales, strict=True))
        mha_kwargs = {name: d.repeat_interleave(3, dim=1) for name, d in kwargs.items()}
    out, lse = numerics.attention(q, k, v, return_lse=True, **kwargs)
    rep = (t.repeat_interleave(3, dim=2) for t in (k, v))
    out_mha, lse_mha = numerics.attention(q, *rep, return_lse=True, **mha_kwargs)
    assert torch.equal(out, out_mha) and torch.equal(lse, lse_mha)


def test_float_descales_equal_tensor_descales():
    q, k, v = _inputs(FP8, seqlen=64, heads=2, heads_k=2)
    by_float = numerics.attention(q, k, v, q_descale=0.5, k_descale=2.0, v_descale=0.25)
    by_tensor = numerics.attention(q, k, v, q_descale=torch.tensor(0.5), k_descale=torch.full((1, 2), 2.0),
                                   v_descale=torch.tensor([0.25]))
    assert torch.equal(by_float, by_tensor)


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8])
def test_zero_padding_leaves_real_rows_bitwise_unchanged(dtype):
    q, k, v = _inputs(dtype, seqlen=200, heads=2, heads_k=1, d_qk=32, d_v=16, seed=9)
    out, lse = numerics.attention(q, k, v, return_lse=True)
    padded = [torch.cat([t.float(), torch.zeros(1, 56, *t.shape[2:])], dim=1).to(dtype) for t in (q, k, v)]
    out_p, lse_p = numerics.attention(*padded, return_lse=True)
    assert torch.equal(out_p[:, :200], out) and torch.equal(lse_p[..., :200], lse)


def test_query_chunking_does_not_change_results(monkeypatch):
    q, k, v = _inputs(FP8, seqlen=300, heads=2, heads_k=2, d_qk=32, d_v=16, seed=10)
    whole = numerics.attention(q, k, v, return_lse=True)
    monkeypatch.setattr(numerics, "MAX_ROWS_PER_STEP", 37)  # chunks of rows that cut key tiles anywhere
    chunked = numerics.attention(q, k, v, return_lse=True)
    assert all(torch.equal(a, b) for a, b in zip(whole, chunked, strict=True))


# ---------------------------------------------------------------------------------------------------------------
# Defaults, errors and the reference backend.


def test_defaults_follow_the_kernels():
    assert numerics.resolve_config(FP8, 128) == numerics.Config("lean", True, "rounded", 0.125, 128, 64, 0)
    assert numerics.resolve_config(FP8, 192).p_mode == "exact"
    assert numerics.resolve_config(torch.bfloat16, 128) == numerics.Config("bf16", True, "fp32", 0.5, 128, 64, 0)
    assert numerics.resolve_config(torch.bfloat16, 192).rescale_threshold == 8.0


@pytest.mark.parametrize("change,error,match", [
    ({"p_mode": "bf16"}, ValueError, "p_mode='bf16'"),
    ({"p_mode": "fast"}, ValueError, "p_mode must be"),
    ({"rowsum": "fp16"}, ValueError, "rowsum"),
    ({"scale_block": 48}, ValueError, "scale_block"),
    ({"key_tile": 0}, ValueError, "key_tile"),
    ({"rescale_threshold": -1.0}, ValueError, "rescale_threshold"),
    ({"p_shift": 9}, ValueError, "e4m3's range"),
    ({"q_descale": torch.ones(3)}, ValueError, "q_descale"),
    ({"k_descale": torch.ones(1, 2, dtype=torch.float64)}, TypeError, "k_descale must be float32"),
    ({"v_descale": -1.0}, ValueError, "v_descale must hold positive"),
    ({"softmax_scale": 0.0}, ValueError, "softmax_scale"),
])
def test_invalid_arguments_are_named(change, error, match):
    q, k, v = _inputs(FP8, seqlen=16, heads=2, heads_k=2)
    with pytest.raises(error, match=match):
        numerics.attention(q, k, v, **change)


def test_shape_and_dtype_errors():
    q, k, v = _inputs(torch.bfloat16, seqlen=16, heads=3, heads_k=3)
    with pytest.raises(ValueError, match="heads"):
        numerics.attention(q, k[:, :, :2], v[:, :, :2])
    with pytest.raises(TypeError, match="share a dtype"):
        numerics.attention(q, k.to(FP8), v)
    with pytest.raises(ValueError, match="FP8 inputs only"):
        numerics.attention(q, k, v, v_descale=0.5)
    with pytest.raises(TypeError, match="bfloat16 or torch.float8_e4m3fn"):
        numerics.attention(q.float(), k.float(), v.float())
    with pytest.raises(ValueError, match="every dimension must be at least 1"):
        numerics.attention(q[:0], k[:0], v[:0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8])
def test_reference_backend_runs_the_model_in_both_layouts(dtype):
    q, k, v = _inputs(dtype, seqlen=256, heads=4, heads_k=2, d_qk=32, d_v=16, seed=11)
    descales = [torch.rand(1, 2, generator=torch.Generator().manual_seed(i)) + 0.5 for i in range(3)]
    if dtype != FP8:
        descales = [None] * 3
    out, lse = reference.forward(q, k, v, *descales, 0.2, "bshd")
    kwargs = dict(zip(("q_descale", "k_descale", "v_descale"), descales, strict=True)) if dtype == FP8 else {}
    want_out, want_lse = numerics.attention(q, k, v, softmax_scale=0.2, key_tile=128, return_lse=True, **kwargs)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    bhsd = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
    out_t, lse_t = reference.forward(*bhsd, *descales, 0.2, "bhsd")
    assert out_t.shape == (1, 4, 256, 16) and out_t.is_contiguous()
    assert torch.equal(out_t.transpose(1, 2), out) and torch.equal(lse_t, lse)


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8])
def test_flash_attn_func_on_cpu_is_the_model_with_the_kernels_defaults(dtype):
    q, k, v = _inputs(dtype, seqlen=300, heads=4, heads_k=2, d_qk=192, d_v=128, sharpness=1.0, seed=12)
    kwargs = {}
    if dtype == FP8:
        kwargs = {name: torch.full((1, 2), value) for name, value in
                  (("q_descale", 0.5), ("k_descale", 1.5), ("v_descale", 0.75))}
    result = zyfa.flash_attn_func(q, k, v, causal=True, **kwargs)
    out = result[0] if isinstance(result, tuple) else result
    assert torch.equal(out, numerics.attention(q, k, v, **kwargs))  # padded to 512 inside: padding is exact
