"""The sm90a FP8 kernels on CPU: the P fragments and the permuted V^T pair up keys as the P V product needs, the
manifest entries carry the contract's numerics, the plan passes V^T and the descales, and the moved-maximum test on
the codes misses no move of the row maximum."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import zyfa_kernels
from asmgen import sm90a as sources
from zyfa import numerics
from zyfa.backends import sm90a


def acc_col(reg: int, lane: int) -> int:  # tile.cuh: accumulator register -> key column
    return 8 * (reg // 4) + 2 * (lane % 4) + (reg % 2)


def test_p_fragments_meet_the_permuted_v_transpose():
    """Emulate pack_p's choice of accumulator registers for the e4m3 A operand and the wgmma k = 32 A layout (lane
    l, register j: row half j % 2, columns 4 (l % 4) + 16 (j // 2) + byte), against V^T from transposed_v: the
    product over the A columns is P V."""
    rng = np.random.default_rng(0)
    p = rng.random((16, 128))  # rows g (half 0) and g + 8 (half 1) of lanes 4g .. 4g + 3, here g = 0
    v = rng.random((128, 16))
    vt = sm90a.transposed_v(torch.from_numpy(v)[None, :, None, :], "bshd")[0, 0].numpy()  # (d, keys permuted)
    out = np.zeros((2, 16))
    for lane in range(4):
        for k in range(4):  # k = 32 steps
            for j in range(4):  # A registers
                half = j % 2
                first = 16 * k + 8 * (j // 2) + 2 * (j % 2)  # pack_p: registers first, +1, +4, +5
                for byte, reg in enumerate((first, first + 1, first + 4, first + 5)):
                    assert reg % 4 // 2 == half  # the accumulator register holds this row half
                    a_col = 32 * k + 4 * (lane % 4) + 16 * (j // 2) + byte
                    key = acc_col(reg, lane)
                    out[half] += p[8 * half, key] * vt[:, a_col]
    np.testing.assert_allclose(out, p[[0, 8]] @ v)


def test_transposed_v_pads_keys_with_zeros():
    v = torch.arange(2 * 20 * 3 * 64, dtype=torch.float32).reshape(2, 20, 3, 64).div(4000).to(torch.float8_e4m3fn)
    vt = sm90a.transposed_v(v, "bshd")
    assert vt.shape == (2, 3, 64, 32) and vt.is_contiguous()
    keys = torch.arange(32).view(2, 2, 4, 2).permute(0, 2, 1, 3).reshape(32)  # position -> key
    for pos, key in enumerate(keys.tolist()):
        expect = v[:, key] if key < 20 else torch.zeros(2, 3, 64, dtype=v.dtype)  # keys past 20: zeros
        assert torch.equal(vt[..., pos].contiguous().view(torch.uint8), expect.contiguous().view(torch.uint8))
    bhsd = sm90a.transposed_v(v.transpose(1, 2).contiguous(), "bhsd")
    assert torch.equal(bhsd.view(torch.uint8), vt.view(torch.uint8))


@pytest.mark.parametrize("p_mode", [None, "lean"])
@pytest.mark.parametrize("d_qk", [128, 192])
def test_fp8_entries_carry_the_contract(d_qk, p_mode):
    k = sm90a.find_kernel(torch.float8_e4m3fn, d_qk, 128, 8192, p_mode)
    assert (k.p_mode, k.p_mode_default, k.p_shift, k.rowsum, k.rescale_threshold) == (
        p_mode or "exact", p_mode is None, 8, "rounded", 0.125)
    assert k.scale_block is None and k.masks_tail and k.v_transposed and k.offset_bits == 64
    assert (k.tile_m, k.tile_n, k.seqlen_min, k.seqlen_max) == (128, 128, None, None)
    assert k.resources["local_bytes"] == 0 and k.resources["stack_bytes"] == 0
    assert [a["name"] for a in k.args][:9] == ["q", "k", "vt", "out", "lse", "jobs", "q_descale", "k_descale",
                                               "v_descale"]


def test_fp8_plan_passes_v_transpose_and_descales():
    batch, seqlen, heads, heads_k, d = 2, 1000, 8, 2, 192
    q = torch.empty(batch, seqlen, heads, d, dtype=torch.float8_e4m3fn)
    k = torch.empty(batch, seqlen, heads_k, d, dtype=torch.float8_e4m3fn)
    v = torch.empty(batch, seqlen, heads_k, 128, dtype=torch.float8_e4m3fn)
    out = torch.empty(batch, seqlen, heads, 128, dtype=torch.bfloat16)
    vt = sm90a.transposed_v(v, "bshd")
    kern = sm90a.find_kernel(torch.float8_e4m3fn, d, 128, seqlen)
    ops = [sm90a.Operand.of(t, "bshd") for t in (q, k, v, out)]
    p = sm90a.plan(kern, *ops, lse_ptr=0x1000, jobs_ptr=0x2000, num_jobs=16, grid=132, softmax_scale=0.1, vt=vt,
                   descales=(0x3000, 0x3100, 0x3200, 0, 0, heads_k, 1, 0, 1))
    assert set(p.tensor_maps) == {"q", "k", "vt"}
    assert p.tensor_maps["q"].box_dims == (128, 128, 1, 1)  # 128 e4m3 columns: d_qk = 192 reads two boxes
    t = p.tensor_maps["vt"]
    assert t.dims == (1008, 128, heads_k, batch) and t.strides_bytes == (1008, 128 * 1008, heads_k * 128 * 1008)
    assert t.box_dims == (128, 128, 1, 1)
    assert (p.args["q_descale"], p.args["k_descale"], p.args["v_descale"], p.args["seqlen"]) == (
        0x3000, 0x3100, 0x3200, 1000)
    assert [p.args[f"{n}_descale_stride_{d}"] for n in "qkv" for d in "bh"] == [0, 0, heads_k, 1, 0, 1]
    with pytest.raises(ValueError, match="takes V\\^T and the descales"):
        sm90a.plan(kern, *ops, 0x1000, 0x2000, 16, 132, 0.1)


def test_fp8_kernels_have_their_own_source_and_layout():
    for entry in sources.KERNELS:
        if entry["dtype"] != "fp8e4m3":
            continue
        header = sources.config_header(entry)
        assert f"kDynamicSharedBytes = {entry['shared_bytes'] - sources.RESERVED_SHARED};" in header
        assert "struct Config : E4m3 {" in header
        assert f"kPMode = PMode::{'kLean' if entry['p_mode'] == 'lean' else 'kExact'};" in header
        assert sources.SOURCES[entry["dtype"]] == "attention_fwd_fp8.cu"
        assert entry["shared_bytes"] <= sources.MAX_SHARED
        assert zyfa_kernels.manifest().find("sm90a", name=entry["name"]).args == entry["args"]


def fp32(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32)


def lean_p(scores, c, m):
    """softmax_fp8.cuh's lean_p, emulated in float64 (each FP32 operation rounded once, a fused multiply-add exact
    before its rounding): v = sat(s c/16 + fp32(120 - 8m)/128), code = rne(128 v) (the FMA with 1.5 2^23); m of
    the scores' last axis but one."""
    scale, bias = fp32(c * fp32(8 / 128)), fp32(fp32(120 - fp32(8 * m)) / 128)
    with np.errstate(invalid="ignore"):
        v = np.clip(fp32(scores.astype(np.float64) * scale + bias[..., None]), 0, 1)
    return np.round(v.astype(np.float64) * 128).astype(np.int64)  # half to even, like the 1.5 2^23 addition


def test_lean_codes_of_the_saturating_fma_follow_the_model():
    """lean_p's codes (emulated) equal the model's max(0, rne(8 (x - m) + 120)) but for the FMA's fusion (rare
    one-code steps), and masked keys (-inf) give code 0."""
    rng = np.random.default_rng(0)
    scores = fp32(rng.standard_normal(1 << 20) * 20)
    scores[::97] = -np.inf
    c = fp32(fp32(0.0883883476) * fp32(1.4426950409) * fp32(1.7))
    m = fp32(fp32(np.max(scores) * c) - fp32(0.1))  # a row maximum below the tile's by less than tau
    codes = lean_p(scores, c, m)
    t = torch.from_numpy(fp32(fp32(scores * c) - m))
    model = numerics.lean_codes(t, 8).numpy().astype(np.int64)
    assert codes.max() <= 121 and model.max() <= 121  # the P range guard at tau 0.125
    assert (codes[::97] == 0).all()
    assert np.abs(codes - model).max() <= 1 and (codes != model).mean() < 1e-4


def test_gather_low_bytes_puts_the_codes_in_pack_p_order():
    """ptx.cuh gather_low_bytes: PRMT selectors 0x0040 then 0x5410 (PTX prmt: nibble i of the selector picks byte
    i of the result from {a bytes 0-3, b bytes 4-7}) leave the low bytes of b0..b3 in result bytes 0..3."""
    def prmt(a, b, selector):
        pool = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
        return sum(pool[(selector >> (4 * i)) & 0x7] << (8 * i) for i in range(4))

    regs = [0x4B400000 | code for code in (0x12, 0x34, 0x56, 0x78)]  # FP32 bits K + code
    assert prmt(prmt(regs[0], regs[1], 0x0040), prmt(regs[2], regs[3], 0x0040), 0x5410) == 0x78563412


def code_test_fires(codes: np.ndarray) -> np.ndarray:
    """softmax_fp8.cuh codes_may_have_moved per code: kMovedCodeBias's byte added sets the byte's top bit."""
    text = (sources.SOURCE_DIR / "softmax_fp8.cuh").read_text()
    bias = int(re.search(r"kMovedCodeBias = (0x[0-9a-fA-F]+)u;", text).group(1), 16)
    assert bias == (bias & 0xFF) * 0x01010101  # the same for every byte
    return ((codes.astype(np.int64) + (bias & 0xFF)) & 0x80) != 0


@pytest.mark.parametrize("magnitude", [1.0, 100.0, 12000.0])
def test_the_moved_maximum_test_on_the_codes_misses_no_move(magnitude):
    """The codes of P written against m as it stands show every row maximum that the model moves (x_max > m + tau,
    compared in FP32 as row_maxima does), for exact P (e4m3 of 2^fp32(x - m + 8) as one FMA, saturating) and lean P
    (the saturating FMA's code), while |m| stays below the test's bound 2^14; and they stay quiet while x - m is
    below 0.08 (exact) or 1/16 (lean), so that a tile whose maximum holds takes the fast path."""
    rng = np.random.default_rng(1)
    tau = fp32(0.125)
    c = fp32(0.0883883476 * 1.4426950409)
    s = fp32(rng.standard_normal((4096, 64)) + magnitude / c)  # rows of one lane's scores
    x_max = fp32(s.max(axis=1) * c)  # the model's tile maximum, FP32
    m = fp32(x_max - fp32(rng.uniform(-0.3, 0.3, size=x_max.shape)))  # around and across m + tau
    assert np.abs(m).max() < 2.0**14
    moved = x_max > fp32(m + tau)
    exact_y = fp32(s.astype(np.float64) * c + fp32(8.0 - m)[:, None])
    p = torch.from_numpy(fp32(np.exp2(exact_y.astype(np.float64)))).clamp(max=448.0)
    exact = p.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    lean = lean_p(s, c, m)
    margin = x_max - m
    for codes, quiet in ((exact, 0.08), (lean, 1 / 16 - 1e-3)):
        fires = code_test_fires(codes).any(axis=1)
        assert moved.any() and (~moved).any()
        assert fires[moved].all()  # no move missed
        assert not fires[margin < quiet].any()  # no second pass while the maximum holds
