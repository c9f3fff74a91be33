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


def scalar_attention(q, k, v, *, scale, p_mode, block_scale, rowsum, tau, tile, block, p_shift, descales=None):
    """The contract, written out per row and key: FP8 P = e4m3 of 2^y with y = (x - m) + e + p_shift (or lean
    P's code rne(8y + 56)), l sums the rounded (or FP32) P, lse = ln 2 (m - p_shift + log2 l).

    Returns out (float, BF16-valued), lse, and the extremes of e, y and the lean codes that occurred."""
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
            # kernels take softmax_scale as an FP32 argument
            c = f32(f32(f32(float(f32(scale)) / math.log(2)) * f32(qd[b, g].item())) * f32(kd[b, g].item()))
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
                        # t = (x - m) + e in FP32; the offset is exact in the operation that follows
                        t = {j: f32(f32(x[j] - m) + f32(e)) for j in bkeys}
                        seen["y_max"] = max(seen["y_max"], *(float(t[j]) + p_shift for j in bkeys))
                        if p_mode == "lean":
                            codes = {j: max(0, int(np.rint(f32(f32(8 * t[j]) + f32(56 + 8 * p_shift))))) for j in bkeys}
                            seen["code_max"] = max(seen["code_max"], *codes.values())
                            seen["subnormal_codes"] += sum(0 < cd < 8 for cd in codes.values())
                            p8 = {j: _e4m3_decode(codes[j]) for j in bkeys}
                        else:
                            p8 = {j: _e4m3_round(f32(2.0 ** float(t[j])) * 2.0**p_shift) for j in bkeys}
                        w = 2.0**-e
                        if rowsum == "rounded":
                            rs = f32(math.fsum(p8.values()))
                        else:
                            rs = f32(math.fsum(f32(2.0 ** float(t[j])) * 2.0**p_shift for j in bkeys))
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
    # p_mode, block_scale, rowsum, p_shift: the contract (exact, lean) and the peers' switches
    ("bf16", False, "fp32", 0),
    ("bf16", False, "rounded", 0),
    ("exact", True, "rounded", 8),
    ("lean", True, "rounded", 8),
    ("lean", False, "fp32", 8),
    ("exact", False, "rounded", 8),
    ("exact", True, "fp32", 8),
    ("exact", False, "fp32", 0),  # AITER-like
    ("lean", True, "rounded", 0),  # the previous contract's lean P
]


@pytest.mark.parametrize("p_mode,block_scale,rowsum,p_shift", SCALAR_CASES)
def test_model_equals_scalar_implementation(p_mode, block_scale, rowsum, p_shift):
    dtype = torch.bfloat16 if p_mode == "bf16" else FP8
    q, k, v = _inputs(dtype)
    tau = 0.125 if dtype == FP8 else 0.5
    descales = None
    kwargs = {}
    if dtype == FP8:
        descales = [torch.tensor([[0.7]]), torch.tensor([[1.3]]), torch.tensor([[0.25]])]
        kwargs = dict(zip(("q_descale", "k_descale", "v_descale"), descales, strict=True))
        kwargs.update(block_scale=block_scale, p_shift=p_shift, scale_block=16)
    scale = 0.3
    out, lse = numerics.attention(q, k, v, softmax_scale=scale, p_mode=p_mode, rowsum=rowsum, rescale_threshold=tau,
                                  key_tile=32, return_lse=True, **kwargs)
    want_out, want_lse, seen = scalar_attention(q, k, v, scale=scale, p_mode=p_mode, block_scale=block_scale,
                                                rowsum=rowsum, tau=tau, tile=32, block=16 if dtype == FP8 else 32,
                                                p_shift=p_shift, descales=descales)
    assert seen["rescales"] > 0  # the inputs exercise lazy rescaling
    if dtype == FP8 and block_scale:
        assert seen["e_max"] >= 2 and seen["e_min"] == -1  # blocks far below the max, and the tau headroom used
        assert p_shift - 1 < seen["y_max"] <= p_shift  # so 2^y <= 2^p_shift: P never needs saturation
    np.testing.assert_array_equal(out.float().numpy(), want_out)
    np.testing.assert_array_equal(lse.numpy(), want_lse.astype(np.float32))


def _gqa_inputs(d_qk, d_v, heads, heads_k, seed, seqlen=144):
    """Contract-sized problems (tiles of 128, blocks of 64): a strong key 0 and a ladder of stronger keys."""
    q, k, v = _inputs(FP8, seqlen=seqlen, heads=heads, heads_k=heads_k, d_qk=d_qk, d_v=d_v, sharpness=0.6,
                      seed=seed)
    gen = torch.Generator().manual_seed(seed)
    descales = [torch.rand(1, heads_k, generator=gen) + 0.5 for _ in range(3)]  # random per kv head
    return q, k, v, descales


@pytest.mark.parametrize("dims,heads", [((128, 128), (4, 2)), ((192, 128), (2, 1))], ids=["d128", "d192_128"])
@pytest.mark.parametrize("p_mode", [None, "lean"], ids=["default", "lean"])
def test_model_with_contract_defaults_equals_scalar_implementation(p_mode, dims, heads):
    """No numerics options but p_mode: the contract's defaults (exact P, p_shift 8, tau 0.125, tiles of 128 keys,
    blocks of 64, rounded row sum), bit for bit, with GQA, per-kv-head descales and a partial last tile."""
    q, k, v, descales = _gqa_inputs(*dims, *heads, seed=sum(dims))
    kwargs = dict(zip(("q_descale", "k_descale", "v_descale"), descales, strict=True))
    out, lse = numerics.attention(q, k, v, p_mode=p_mode, return_lse=True, **kwargs)
    want_out, want_lse, seen = scalar_attention(q, k, v, scale=dims[0] ** -0.5, p_mode=p_mode or "exact",
                                                block_scale=True, rowsum="rounded", tau=0.125, tile=128, block=64,
                                                p_shift=8, descales=descales)
    assert seen["rescales"] > 0 and seen["e_max"] >= 1 and 7 < seen["y_max"] <= 8
    if p_mode == "lean":
        assert seen["code_max"] == 120
    np.testing.assert_array_equal(out.float().numpy(), want_out)
    np.testing.assert_array_equal(lse.numpy(), want_lse.astype(np.float32))


# ---------------------------------------------------------------------------------------------------------------
# The contract's promises.


@pytest.mark.parametrize("p_shift", [0, 8])
@pytest.mark.parametrize("tau", [0.125, 0.5])
def test_block_scaling_bounds_codes_and_e(tau, p_shift):
    q, k, v = _inputs(FP8, seqlen=96, heads=2, heads_k=2, seed=3)
    _, _, seen = scalar_attention(q, k, v, scale=0.25, p_mode="lean", block_scale=True, rowsum="rounded",
                                  tau=tau, tile=32, block=16, p_shift=p_shift)
    assert seen["code_max"] == 56 + 8 * p_shift and seen["e_min"] == -1
    # Without block scaling the lazily kept maximum lets codes pass 2^p_shift: the bound is block scaling's doing.
    _, _, seen = scalar_attention(q, k, v, scale=0.25, p_mode="lean", block_scale=False, rowsum="rounded",
                                  tau=0.5, tile=32, block=16, p_shift=p_shift)
    assert seen["code_max"] > 56 + 8 * p_shift


@pytest.mark.parametrize("p_shift", [0, 8])
def test_lean_codes_formula_including_ties(p_shift):
    t = torch.cat([torch.arange(-80, 9, dtype=torch.float32) / 16,  # every half-code tie in range
                   -torch.rand(2000, generator=torch.Generator().manual_seed(1)) * 17,
                   torch.tensor([-math.inf, -100.0])])
    codes = numerics.lean_codes(t, p_shift)
    want = [max(0, round(8 * (float(x) + p_shift) + 56)) if math.isfinite(x) else 0 for x in t.tolist()]
    assert codes.tolist() == want  # round() is half to even, as rne


def test_lean_p_values_with_the_offset():
    # y = t + 8: code 120 is 2^8, one binade is 8 codes, code 8 is e4m3's smallest normal, codes 1..7 subnormals.
    t = torch.tensor([0.0, -1.0, -14.0, -15.0 + 1 / 8, -15.0])
    assert numerics.lean_p(t).tolist() == [256.0, 128.0, 2.0**-6, 2.0**-9, 0.0]
    assert numerics.lean_codes(t).tolist() == numerics.lean_codes(t, numerics.FP8_P_SHIFT).tolist()


@pytest.mark.parametrize("p_shift", [0, 8])
def test_exact_p_rounds_to_nearest_even_without_saturation(p_shift):
    t = torch.cat([-torch.rand(3000, generator=torch.Generator().manual_seed(2)) * 20, torch.tensor([0.0])])
    p32 = torch.exp2(t.double()).float()
    want = [_e4m3_round(float(p) * 2.0**p_shift) for p in p32.tolist()]
    assert numerics.exact_p(t, p_shift).tolist() == want
    assert numerics.exact_p(torch.tensor([0.0]), p_shift).item() == 2.0**p_shift


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
    """One key tile over all keys (no rescaling): sum_b 2^-e_b sum_j P8_bj (P8 2^8 larger) with m the row max."""
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
    want = math.log(2) * (m - 8 + torch.log2(rounded_sum))  # the offset of P comes off again
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


def test_defaults_are_the_contracts():
    exact = numerics.Config("exact", True, "rounded", 0.125, 128, 64, 8)
    assert numerics.resolve_config(FP8, 128) == numerics.resolve_config(FP8, 192) == exact
    lean = numerics.Config("lean", True, "rounded", 0.125, 128, 64, 8)
    assert numerics.resolve_config(FP8, 128, p_mode="lean") == lean
    assert numerics.resolve_config(torch.bfloat16, 128) == numerics.Config("bf16", False, "fp32", 0.5, 128, 128, 0)
    assert numerics.resolve_config(torch.bfloat16, 192).rescale_threshold == 8.0


def test_peers_numerics_can_be_expressed():
    fa3 = numerics.resolve_config(FP8, 128, block_scale=False, rowsum="fp32", rescale_threshold=0)
    assert fa3 == numerics.Config("exact", False, "fp32", 0, 128, 64, 8)
    aiter = numerics.resolve_config(FP8, 128, block_scale=False, rowsum="fp32", p_shift=0)
    assert aiter == numerics.Config("exact", False, "fp32", 0.125, 128, 64, 0)


FP8_ENTRY = {"name": "fp8_d128", "dtype": "fp8e4m3", "d_qk": 128, "d_v": 128, "p_mode": "lean", "p_shift": 8,
             "rescale_threshold": 0.125, "scale_block": 64, "rowsum": "rounded", "tile_m": 256, "tile_n": 64}
BF16_ENTRY = {"name": "bf16_d128", "dtype": "bf16", "d_qk": 128, "d_v": 128, "p_mode": "bf16", "p_shift": 0,
              "rescale_threshold": 0.5, "scale_block": None, "rowsum": "fp32", "tile_m": 128, "tile_n": 128}


def test_config_from_kernel_maps_the_manifest_fields():
    assert numerics.config_from_kernel(FP8_ENTRY) == numerics.Config("lean", True, "rounded", 0.125, 64, 64, 8)
    assert numerics.config_from_kernel(FP8_ENTRY) == numerics.resolve_config(FP8, 128, p_mode="lean", key_tile=64)
    assert numerics.config_from_kernel(BF16_ENTRY) == numerics.resolve_config(torch.bfloat16, 128)
    unscaled = numerics.config_from_kernel({**FP8_ENTRY, "p_mode": "exact", "scale_block": None})
    assert unscaled == numerics.Config("exact", False, "rounded", 0.125, 64, 64, 8)
    q, k, v = _inputs(FP8, seqlen=100, heads=2, heads_k=2)
    by_config = numerics.attention(q, k, v, config=numerics.config_from_kernel(FP8_ENTRY), return_lse=True)
    by_options = numerics.attention(q, k, v, p_mode="lean", key_tile=64, return_lse=True)
    assert all(torch.equal(a, b) for a, b in zip(by_config, by_options, strict=True))


@pytest.mark.parametrize("change,match", [
    ({"p_shift": None}, "p_shift must be an int"),
    ({"rowsum": "kahan"}, "rowsum must be one of"),
    ({"tile_n": 0}, "tile_n must be a positive int"),
    ({"scale_block": 48}, "scale_block must be null or a positive int dividing tile_n=64"),
    ({"dtype": "bf16"}, "p_mode 'lean' does not fit dtype 'bf16'"),
    ({"dtype": "fp16"}, "dtype must be one of"),
    ({"p_shift": 9}, "below e4m3's largest value 448"),
    ({"p_mode": "fast"}, "p_mode must be one of"),
])
def test_config_from_kernel_names_bad_fields(change, match):
    with pytest.raises(ValueError, match=match) as info:
        numerics.config_from_kernel({**FP8_ENTRY, **change})
    assert "kernel entry 'fp8_d128'" in str(info.value)


def test_config_from_kernel_names_missing_fields_and_bad_input():
    entry = {k: v for k, v in FP8_ENTRY.items() if k not in ("rowsum", "tile_n")}
    with pytest.raises(ValueError, match="kernel entry 'fp8_d128' lacks the numerics field.s. rowsum, tile_n"):
        numerics.config_from_kernel(entry)
    with pytest.raises(TypeError, match="fields must be a mapping"):
        numerics.config_from_kernel(["p_mode"])
    with pytest.raises(ValueError, match="p_shift, block_scale and scale_block apply to FP8"):
        numerics.config_from_kernel({**BF16_ENTRY, "p_shift": 8})


def test_p_range_guard():
    # With block scaling P8 <= 2^p_shift; without it P8 reaches 2^(p_shift + tau) before m is raised.
    numerics.resolve_config(FP8, 128, block_scale=False, rescale_threshold=0.5)  # 2^8.5 = 362 rounds to 352
    with pytest.raises(ValueError, match="p_shift . rescale_threshold must be at most 8.682"):
        numerics.resolve_config(FP8, 128, block_scale=False, rescale_threshold=0.75)  # 2^8.75 = 431 -> 448
    with pytest.raises(ValueError, match="p_shift must be at most 8.682"):
        numerics.resolve_config(FP8, 128, p_shift=9)
    assert numerics.MAX_P_EXPONENT == pytest.approx(math.log2(448) - 1 / 8)
    worst = torch.tensor([numerics.MAX_P_EXPONENT - 8])
    assert numerics.lean_p(worst).item() < 448 and numerics.exact_p(worst).item() < 448


def test_config_and_options_do_not_mix():
    q, k, v = _inputs(FP8, seqlen=16, heads=2, heads_k=2)
    cfg = numerics.resolve_config(FP8, 16)
    with pytest.raises(ValueError, match="either config or the numerics options"):
        numerics.attention(q, k, v, config=cfg, p_mode="lean")
    with pytest.raises(ValueError, match="does not fit torch.bfloat16 inputs"):
        numerics.attention(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), config=cfg)
    with pytest.raises(TypeError, match="config must be a zyfa.numerics.Config"):
        numerics.attention(q, k, v, config={"p_mode": "exact"})


@pytest.mark.parametrize("change,error,match", [
    ({"p_mode": "bf16"}, ValueError, "p_mode='bf16'"),
    ({"p_mode": "fast"}, ValueError, "p_mode must be"),
    ({"rowsum": "fp16"}, ValueError, "rowsum"),
    ({"scale_block": 48}, ValueError, "scale_block"),
    ({"key_tile": 0}, ValueError, "key_tile"),
    ({"rescale_threshold": -1.0}, ValueError, "rescale_threshold"),
    ({"p_shift": 9}, ValueError, "e4m3's largest value"),
    ({"p_shift": -1}, ValueError, "p_shift must be an int >= 0"),
    ({"block_scale": 1}, ValueError, "block_scale must be True or False"),
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
