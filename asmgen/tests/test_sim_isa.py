"""Instruction-level tests of the gfx950 simulator: hand-written snippets assembled with clang, results checked
against numpy expectations written from each instruction's pseudocode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asmgen.sim import HazardError, MemoryFault, SimError, instruction_table
from asmgen.sim.testing import load_input, run_snippet, store_output

RNG = np.random.default_rng(1234)
LANES = 64


def f32_table(*rows) -> np.ndarray:
    return np.stack([np.asarray(r, dtype=np.float32) for r in rows]).view(np.uint32)


def gaussian(n: int = 2, scale: float = 4.0) -> np.ndarray:
    return (RNG.standard_normal((n, LANES)) * scale).astype(np.float32)


def loads(*regs: int) -> str:
    return "".join(load_input(r, i) for i, r in enumerate(regs)) + "  s_waitcnt vmcnt(0)\n"


def stores(*regs: int) -> str:
    return "".join(store_output(r, i) for i, r in enumerate(regs))


def run_f32(body: str, x: np.ndarray, outputs: int = 1, **kw) -> np.ndarray:
    return run_snippet(body, x.view(np.uint32), outputs, **kw).view(np.float32)


# --- VALU float ---------------------------------------------------------------------------------------------------
def test_float_arithmetic_matches_float32():
    x = gaussian(3)
    a, b, c = x
    body = loads(2, 3, 4) + """\
  v_add_f32 v10, v2, v3
  v_sub_f32 v11, v2, v3
  v_mul_f32 v12, v2, v3
  v_fma_f32 v13, v2, -v3, |v4|
  v_mov_b32 v14, v4
  v_fmac_f32 v14, v2, v3
  v_max_f32 v15, v2, v3
  v_min_f32 v16, v2, v3
  v_max3_f32 v17, v2, v3, v4
  v_med3_f32 v18, v2, v3, v4
  v_mul_f32 v19, v2, 0.5
  v_add_f32 v20, v2, v3 clamp
""" + stores(*range(10, 21))
    out = run_f32(body, x, 11)
    fma = (a.astype(np.float64) * b + c.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(out[0], a + b)
    np.testing.assert_array_equal(out[1], a - b)
    np.testing.assert_array_equal(out[2], a * b)
    np.testing.assert_array_equal(out[3], (a.astype(np.float64) * -b + np.abs(c)).astype(np.float32))
    np.testing.assert_array_equal(out[4], fma)
    np.testing.assert_array_equal(out[5], np.maximum(a, b))
    np.testing.assert_array_equal(out[6], np.minimum(a, b))
    np.testing.assert_array_equal(out[7], np.max(x, axis=0))
    np.testing.assert_array_equal(out[8], np.median(x, axis=0))
    np.testing.assert_array_equal(out[9], a * np.float32(0.5))
    np.testing.assert_array_equal(out[10], np.clip(a + b, 0, 1))


def _exact_fma_f32(a, b, c) -> np.ndarray:
    """fl32(a*b + c) from the exact rational value (nearest, ties to even)."""
    from fractions import Fraction
    out = []
    for x, y, z in zip(a.tolist(), b.tolist(), c.tolist(), strict=True):
        exact = Fraction(x) * Fraction(y) + Fraction(z)
        near = np.float32(float(exact))
        candidates = [np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf))]
        out.append(min(candidates, key=lambda f: (abs(Fraction(float(f)) - exact), int(f.view(np.uint32)) & 1)))
    return np.array(out, dtype=np.float32)


def test_fused_multiply_add_rounds_once():
    """a*b lands on a float32 midpoint and c is far below it: a float64 sum would round to the midpoint and then
    to even (twice); the fused result is the neighbour on c's side. Plus random operands with cancellation."""
    a = (1 + 2.0**-12 * (1 + 2 * np.arange(LANES) % 7)).astype(np.float32)
    b = np.full(LANES, 1 + 2.0**-12, np.float32)
    c = (np.where(np.arange(LANES) % 2, 1, -1) * 2.0**-80).astype(np.float32)
    r = gaussian(3)
    r[2] = np.where(np.arange(LANES) % 3, -(r[0].astype(np.float64) * r[1]).astype(np.float32), r[2])
    x = np.stack([a, b, c, *r])
    body = loads(2, 4, 6, 8, 9, 11) + """\
  v_fma_f32 v20, v2, v4, v6
  v_fma_f32 v21, v8, v9, v11
  v_pk_fma_f32 v[22:23], v[2:3], v[4:5], v[6:7] op_sel_hi:[0,0,0]
""" + stores(20, 21, 22)
    out = run_f32(body, x, 3)
    np.testing.assert_array_equal(out[0], _exact_fma_f32(a, b, c))
    assert not np.array_equal(out[0], (a.astype(np.float64) * b + c).astype(np.float32))  # the double rounding
    np.testing.assert_array_equal(out[1], _exact_fma_f32(*r))
    np.testing.assert_array_equal(out[2], out[0])


@pytest.mark.parametrize("mode,flush_in,flush_out", [(0, True, True), (1, False, True), (2, True, False),
                                                     (3, False, False)])
def test_fp32_denormals_follow_the_descriptor(mode, flush_in, flush_out):
    """.amdhsa_float_denorm_mode_32: 0 flushes denormal inputs and results (LLVM's default), 1 results, 2 inputs,
    3 neither; moves keep their bits."""
    tiny = np.float32(2.0**-140)
    x = np.stack([np.full(LANES, tiny), np.full(LANES, np.float32(2.0**-20)), np.full(LANES, np.float32(2.0**-110))])
    body = loads(2, 3, 4) + """\
  v_add_f32 v10, v2, 0
  v_mul_f32 v11, v3, v4
  v_mov_b32 v12, v2
  v_pk_mul_f32 v[14:15], v[2:3], 1.0 op_sel_hi:[0,0]
""" + stores(10, 11, 12, 14)
    out = run_f32(body, x, 4, float_denorm_mode_32=mode)
    product = np.float32(2.0**-130)  # denormal result of two normal inputs
    assert out[0][0] == (0 if flush_in or flush_out else tiny)
    assert out[1][0] == (0 if flush_out else product)
    assert out[2][0] == tiny
    assert out[3][0] == (0 if flush_in or flush_out else tiny)


def test_transcendentals_and_rounding():
    x = gaussian(2, 8.0)
    x[0, :4] = [-130.0, -126.5, 2.5, -2.5]  # exp2 below 2^-126 flushes to zero; rndne ties go to even
    body = loads(2, 3) + """\
  v_exp_f32 v10, v2
  v_log_f32 v11, |v2|
  v_rcp_f32 v12, v3
  v_floor_f32 v13, v2
  v_rndne_f32 v14, v2
  v_cvt_i32_f32 v15, v2
  v_ldexp_f32 v16, v3, v15
""" + stores(10, 11, 12, 13, 14, 15, 16)
    out = run_snippet(body, x.view(np.uint32), 7)
    f = out.view(np.float32)
    expected_exp = np.exp2(x[0].astype(np.float64)).astype(np.float32)  # rounded once, on every CPU
    expected_exp[np.abs(expected_exp) < 2.0**-126] = 0
    np.testing.assert_array_equal(f[0], expected_exp)
    assert f[0][0] == 0 and f[0][1] == 0
    np.testing.assert_allclose(f[1], np.log2(np.abs(x[0])), rtol=1e-6)
    np.testing.assert_array_equal(f[2], np.float32(1) / x[1])
    np.testing.assert_array_equal(f[3], np.floor(x[0]))
    np.testing.assert_array_equal(f[4], np.rint(x[0]))
    assert f[4][2] == 2.0 and f[4][3] == -2.0
    trunc = np.trunc(x[0]).astype(np.int32)
    np.testing.assert_array_equal(out[5].view(np.int32), trunc)
    scaled = np.ldexp(x[1], trunc)  # denormal results flush (the snippet's descriptor flushes FP32 denormals)
    np.testing.assert_array_equal(f[6], np.where(np.abs(scaled) < 2.0**-126, np.copysign(0, scaled), scaled))


def test_byte_conversion_rounds_to_nearest_even_saturates_and_packs():
    """v_cvt_pk_u8_f32 (lean P's last step): round to nearest even (ties 0.5 -> 0, 1.5 -> 2, 119.5 -> 120),
    saturate to [0, 255] (negative and -inf -> 0, beyond -> 255), NaN -> 0, byte k of the destination replaced."""
    special = [0.5, 1.5, 2.5, 119.5, 120.49, -3.0, -np.inf, 300.0, np.nan, 0.0]
    x = gaussian(4, 60.0) + 60
    x[0, :len(special)] = special
    body = loads(2, 3, 4, 5) + """\
  v_mov_b32 v10, 0x12345678
  v_cvt_pk_u8_f32 v10, v2, 0, v10
  v_cvt_pk_u8_f32 v11, v3, 1, 0
  v_cvt_pk_u8_f32 v11, v4, 2, v11
  v_cvt_pk_u8_f32 v11, v5, 3, v11
""" + stores(10, 11)
    out = run_snippet(body, x.view(np.uint32), 2)
    with np.errstate(invalid="ignore"):
        codes = np.where(np.isnan(x), 0, np.clip(np.rint(x), 0, 255)).astype(np.uint32)
    np.testing.assert_array_equal(out[0], (np.uint32(0x12345600)) | codes[0])
    np.testing.assert_array_equal(out[1], codes[1] << 8 | codes[2] << 16 | codes[3] << 24)
    assert list(codes[0, :len(special)]) == [0, 2, 2, 120, 120, 0, 0, 255, 0, 0]


def test_conversions_to_fp8_and_bf16_round_to_nearest_even():
    x = gaussian(2, 30.0)
    x[0, :3] = [500.0, -460.0, 0.0009]  # beyond 464 is NaN (no clamp), 460 rounds to 448, a subnormal
    body = loads(2, 3) + """\
  v_mov_b32 v10, 0x12345678
  v_cvt_pk_fp8_f32 v10, v2, v3
  v_mov_b32 v11, 0x12345678
  v_cvt_pk_fp8_f32 v11, v2, v3 op_sel:[0,0,1]
  v_cvt_pk_bf16_f32 v12, v2, v3
""" + stores(10, 11, 12)
    out = run_snippet(body, x.view(np.uint32), 3)

    def fp8(v):
        codes = torch.from_numpy(v).to(torch.float8_e4m3fn).view(torch.uint8).numpy().astype(np.uint32)
        return np.where(np.abs(v) > 464, 0x7F | (np.signbit(v).astype(np.uint32) << 7), codes)

    def bf16(v):
        return torch.from_numpy(v).to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16).astype(np.uint32)

    packed = fp8(x[0]) | fp8(x[1]) << 8
    np.testing.assert_array_equal(out[0], 0x12340000 | packed)
    np.testing.assert_array_equal(out[1], 0x5678 | packed << 16)
    np.testing.assert_array_equal(out[2], bf16(x[0]) | bf16(x[1]) << 16)
    assert out[0][0] & 0xFF == 0x7F and out[0][1] & 0xFF == 0xFE  # NaN, -448


# --- VALU integer -------------------------------------------------------------------------------------------------
def test_integer_and_bitwise():
    x = RNG.integers(0, 2**32, (3, LANES), dtype=np.uint64).astype(np.uint32)
    x[2] &= 31  # shift amounts / field widths
    a, b, c = (r.astype(np.uint64) for r in x)
    m = np.uint64(0xFFFFFFFF)
    body = loads(2, 3, 4) + """\
  v_lshlrev_b32 v10, v4, v2
  v_lshrrev_b32 v11, v4, v2
  v_ashrrev_i32 v12, v4, v2
  v_and_b32 v13, v2, v3
  v_or_b32 v14, v2, v3
  v_xor_b32 v15, v2, v3
  v_add_u32 v16, v2, v3
  v_sub_u32 v17, v2, v3
  v_mul_lo_u32 v18, v2, v3
  v_mul_u32_u24 v19, v2, v3
  v_mad_u32_u24 v20, v2, v3, v4
  v_lshl_add_u32 v21, v2, v4, v3
  v_add_lshl_u32 v22, v2, v3, v4
  v_lshl_or_b32 v23, v2, v4, v3
  v_and_or_b32 v24, v2, v3, v4
  v_bfe_u32 v25, v2, v4, 7
  s_mov_b32 s8, 0x0c0a0704
  v_perm_b32 v26, v2, v3, s8
  v_cvt_f32_u32 v27, v2
  v_cvt_u32_f32 v28, v27
""" + stores(*range(10, 29))
    out = run_snippet(body, x, 19).astype(np.uint64)
    s = c & np.uint64(31)
    u24 = np.uint64(0xFFFFFF)
    expected = [
        (a << s) & m, a >> s, (x[0].view(np.int32) >> x[2].astype(np.int32)).view(np.uint32), a & b, a | b, a ^ b,
        (a + b) & m, (a - b) & m, (a * b) & m, (a & u24) * (b & u24) & m, ((a & u24) * (b & u24) + c) & m,
        (((a << s) & m) + b) & m, (((a + b) & m) << s) & m, ((a << s) & m) | b, (a & b) | c,
        (a >> s) & np.uint64(0x7F),
    ]
    for i, e in enumerate(expected):
        np.testing.assert_array_equal(out[i], e, err_msg=f"output {i}")
    # v_perm_b32 selectors (high to low byte): 0x0c -> 0, 0x0a -> sign of byte 5 (S0 byte 1), 7 -> S0 byte 3,
    # 4 -> S0 byte 0
    sign = ((a >> np.uint64(15)) & np.uint64(1)) * np.uint64(0xFF)
    perm = (sign << np.uint64(16)) | (((a >> np.uint64(24)) & np.uint64(0xFF)) << np.uint64(8)) | (a & np.uint64(0xFF))
    np.testing.assert_array_equal(out[16], perm)
    as_f32 = x[0].astype(np.float32)
    np.testing.assert_array_equal(out[17].astype(np.uint32).view(np.float32), as_f32)
    np.testing.assert_array_equal(out[18], np.minimum(as_f32.astype(np.float64), 2**32 - 1).astype(np.uint64))


# --- compare, select, EXEC ------------------------------------------------------------------------------------------
def test_compare_cndmask_and_exec():
    x = gaussian(2)
    x[1, :8] = x[0, :8]
    body = loads(2, 3) + """\
  v_cmp_lt_f32 vcc, v2, v3
  s_nop 1
  v_cndmask_b32 v10, v2, v3, vcc
  v_cmp_ge_i32 s[8:9], v2, v3
  s_nop 1
  v_cndmask_b32_e64 v11, 0, 1.0, s[8:9]
  v_cmp_eq_f32 vcc, v2, v3
  v_mov_b32 v12, 7
  s_and_saveexec_b64 s[10:11], vcc
  v_mov_b32 v12, 9
  s_mov_b64 exec, s[10:11]
  v_cmp_neq_f32 s[12:13], v2, v3
  s_nop 1
  v_mov_b32 v13, s12
  v_mov_b32 v14, s13
""" + stores(10, 11, 12, 13, 14)
    out = run_snippet(body, x.view(np.uint32), 5)
    a, b = x
    np.testing.assert_array_equal(out[0].view(np.float32), np.where(a < b, b, a))
    np.testing.assert_array_equal(out[1].view(np.float32), np.where(x[0].view(np.int32) >= x[1].view(np.int32),
                                                                   1.0, 0.0).astype(np.float32))
    np.testing.assert_array_equal(out[2], np.where(a == b, 9, 7))
    ne = np.sum((a != b).astype(np.uint64) << np.arange(64, dtype=np.uint64))
    assert int(out[3][0]) | int(out[4][0]) << 32 == int(ne)


def test_scalar_alu_and_branches():
    body = """\
  s_mov_b32 s8, 0xfffffff0
  s_add_u32 s9, s8, 0x20
  s_addc_u32 s10, 0, 0
  s_sub_u32 s11, 3, 5
  s_subb_u32 s12, 10, 1
  s_mul_i32 s13, s8, 3
  s_mul_hi_u32 s14, s8, s8
  s_lshl_b32 s15, s8, 4
  s_ashr_i32 s16, s8, 2
  s_mov_b32 s17, 0xabcd1234
  s_bfe_u32 s17, s17, 0x80004
  s_movk_i32 s18, 0x8000
  s_addk_i32 s18, 0x10
  s_mulk_i32 s18, 0x2
  s_min_i32 s19, s8, 5
  s_max_u32 s20, s8, 5
  s_cmp_lt_i32 s8, 0
  s_cselect_b32 s21, 1, 2
  s_mov_b32 s22, 0
  s_mov_b32 s23, 5
loop:
  s_add_i32 s22, s22, s23
  s_sub_i32 s23, s23, 1
  s_cmp_gt_u32 s23, 0
  s_cbranch_scc1 loop
  s_lshl_b64 s[24:25], 1, 40
  s_andn2_b32 s26, 0xff, 0x0f
  s_cmpk_gt_i32 s8, 0xfff0
  s_cselect_b32 s27, 1, 2
  s_cmpk_lt_i32 s8, 0x7fff
  s_cselect_b32 s28, 1, 2
  s_cmpk_gt_u32 s8, 0xfff0
  s_cselect_b32 s29, 1, 2
"""
    regs = list(range(8, 30))
    body += "".join(f"  v_mov_b32 v{10 + i}, s{r}\n" for i, r in enumerate(regs))
    out = run_snippet(body + stores(*range(10, 10 + len(regs))), None, len(regs))
    got = {r: int(out[i][0]) for i, r in enumerate(regs)}
    s8 = 0xFFFFFFF0
    assert got[9] == 0x10 and got[10] == 1  # carry out of s_add_u32 feeds s_addc_u32
    assert got[11] == (3 - 5) & 0xFFFFFFFF and got[12] == 10 - 1 - 1  # borrow of s_sub_u32 feeds s_subb_u32
    assert got[13] == (s8 * 3) & 0xFFFFFFFF and got[14] == (s8 * s8) >> 32
    assert got[15] == (s8 << 4) & 0xFFFFFFFF and got[16] == 0xFFFFFFFC
    assert got[17] == (0xABCD1234 >> 4) & 0xFF
    assert got[18] == ((-0x8000 + 0x10) * 2) & 0xFFFFFFFF
    assert got[19] == s8 and got[20] == s8 and got[21] == 1
    assert got[22] == 15 and got[23] == 0
    assert got[24] == 0 and got[25] == 1 << 8 and got[26] == 0xF0
    # SOPK compares: the i32 forms sign-extend the constant (-16 > -16 is false), the u32 forms zero-extend it
    assert (got[27], got[28], got[29]) == (2, 1, 1)


def test_lane_operations():
    x = np.arange(2 * LANES, dtype=np.uint32).reshape(2, LANES) + 1000
    body = loads(2, 3, 4) + """\
  v_readfirstlane_b32 s8, v2
  v_readlane_b32 s9, v2, 37
  s_nop 1
  v_mov_b32 v10, s8
  v_mov_b32 v11, s9
  v_mov_b32 v12, v2
  v_mov_b32 v13, v3
  s_nop 1
  v_permlane32_swap_b32 v12, v13
  v_mov_b32 v14, v2
  v_mov_b32 v15, v3
  s_nop 1
  v_permlane16_swap_b32 v14, v15
  v_lshlrev_b32 v16, 2, v0
  v_xor_b32 v16, 0x7c, v16
  ds_bpermute_b32 v17, v16, v2
  s_waitcnt lgkmcnt(0)
""" + stores(10, 11, 12, 13, 14, 15, 17)
    out = run_snippet(body, np.concatenate([x, x[:1]]), 7)
    a, b = x
    assert out[0][0] == a[0] and out[1][0] == a[37]
    # PCODE V_PERMLANE32_SWAP: VDST's upper 32 lanes trade with SRC0's lower 32 lanes.
    np.testing.assert_array_equal(out[2], np.concatenate([a[:32], b[:32]]))
    np.testing.assert_array_equal(out[3], np.concatenate([a[32:], b[32:]]))
    np.testing.assert_array_equal(out[4], np.concatenate([a[:16], b[:16], a[32:48], b[32:48]]))
    np.testing.assert_array_equal(out[5], np.concatenate([a[16:32], b[16:32], a[48:], b[48:]]))
    np.testing.assert_array_equal(out[6], a[np.arange(LANES) ^ 31])


def test_packed_f32_and_accvgpr_moves():
    x = gaussian(4)
    body = loads(2, 3, 4, 5) + """\
  v_pk_mul_f32 v[10:11], v[2:3], v[4:5]
  v_pk_add_f32 v[12:13], v[2:3], v[4:5] op_sel:[1,0] op_sel_hi:[0,1]
  v_pk_fma_f32 v[14:15], v[2:3], v[4:5], v[2:3] neg_lo:[1,0,0]
  v_accvgpr_write_b32 a3, v2
  v_accvgpr_read_b32 v16, a3
""" + stores(10, 11, 12, 13, 14, 15, 16)
    out = run_f32(body, x, 7, agprs=8)
    a0, a1, b0, b1 = x
    np.testing.assert_array_equal(out[0], a0 * b0)
    np.testing.assert_array_equal(out[1], a1 * b1)
    np.testing.assert_array_equal(out[2], a1 + b0)  # low result takes the high half of src0
    np.testing.assert_array_equal(out[3], a0 + b1)  # high result takes the low half of src0
    np.testing.assert_array_equal(out[4], (-a0.astype(np.float64) * b0 + a0).astype(np.float32))
    np.testing.assert_array_equal(out[5], (a1.astype(np.float64) * b1 + a1).astype(np.float32))
    np.testing.assert_array_equal(out[6], a0)


# --- MFMA -----------------------------------------------------------------------------------------------------------
def _fp8_operand(rng, m: int, k: int):
    """Random e4m3 matrix (m, k) and its register image (8 regs, 64 lanes) in the gfx950.md layout."""
    vals = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.float8_e4m3fn)
    codes = vals.view(torch.uint8).numpy()
    groups = LANES // m
    lane, byte = np.meshgrid(np.arange(LANES), np.arange(32), indexing="ij")
    kk = 16 * groups * (byte // 16) + 16 * (lane // m) + byte % 16
    image = codes[lane % m, kk].astype(np.uint8).reshape(LANES, 8, 4).view(np.uint32)[..., 0].T
    return vals.float().numpy().astype(np.float64), np.ascontiguousarray(image)


def _output_image(shape: str, d: np.ndarray) -> np.ndarray:
    regs = 16 if shape == "32x32x64" else 4
    reg, lane = np.meshgrid(np.arange(regs), np.arange(LANES), indexing="ij")
    row = 8 * (reg // 4) + 4 * (lane // 32) + reg % 4 if shape == "32x32x64" else 4 * (lane // 16) + reg
    return d[row, lane % d.shape[0]]


@pytest.mark.parametrize("shape", ["32x32x64", "16x16x128"])
@pytest.mark.parametrize("scaled", [False, True])
def test_mfma_fp8_matches_matmul(shape, scaled):
    m, k = (32, 64) if shape == "32x32x64" else (16, 128)
    regs = 16 if m == 32 else 4
    rng = np.random.default_rng(7)
    a, a_img = _fp8_operand(rng, m, k)
    b_t, b_img = _fp8_operand(rng, m, k)  # B given by columns: B[k, j] = b_t[j, k]
    c = rng.standard_normal((m, m)).astype(np.float32)
    c_img = _output_image(shape, c).view(np.uint32)
    scale_a = np.full(LANES, 127 + 2, np.uint32) << 8  # byte 1 (op_sel:[1,..]): 2^2
    scale_b = np.full(LANES, 127 - 3, np.uint32)  # byte 0: 2^-3
    table = np.concatenate([a_img, b_img, c_img, scale_a[None], scale_b[None]])
    body = "".join(load_input(2 + i, i) for i in range(16 + regs + 2)) + "  s_waitcnt vmcnt(0)\n"
    src_c = f"v[18:{17 + regs}]"
    scale_regs = f"v{18 + regs}", f"v{19 + regs}"
    if scaled:
        body += (f"  v_mfma_scale_f32_{shape}_f8f6f4 v[40:{39 + regs}], v[2:9], v[10:17], {src_c}, "
                 f"{scale_regs[0]}, {scale_regs[1]} op_sel:[1,0,0] op_sel_hi:[0,0,0]\n")
    else:
        body += f"  v_mfma_f32_{shape}_f8f6f4 v[40:{39 + regs}], v[2:9], v[10:17], {src_c}\n"
    body += "  s_nop 15\n  s_nop 7\n" + stores(*range(40, 40 + regs))
    out = run_snippet(body, table, regs).view(np.float32)
    factor = 2.0**2 * 2.0**-3 if scaled else 1.0
    expected = (factor * (a @ b_t.T) + c).astype(np.float32)
    np.testing.assert_allclose(out, _output_image(shape, expected), rtol=1e-6, atol=1e-6)


def test_mfma_result_read_too_early_is_a_hazard():
    body = """\
  v_mfma_f32_32x32x64_f8f6f4 a[0:15], v[2:9], v[10:17], 0
  s_nop 15
  s_nop 2
  v_accvgpr_read_b32 v20, a0
"""
    with pytest.raises(HazardError, match=r"after 19 wait states; 20 required"):
        run_snippet(body, None, 1, agprs=16)
    run_snippet(body.replace("s_nop 2", "s_nop 3"), None, 1, agprs=16)  # 20 wait states: fine


def test_mfma_chain_into_same_accumulator_needs_no_wait_but_a_b_read_does():
    chain = """\
  v_mfma_f32_16x16x128_f8f6f4 v[20:23], v[2:9], v[10:17], 0
  v_mfma_f32_16x16x128_f8f6f4 v[20:23], v[2:9], v[10:17], v[20:23]
  s_nop 11
  v_mov_b32 v30, v20
"""
    run_snippet(chain, None, 1)
    as_source = """\
  v_mfma_f32_16x16x128_f8f6f4 v[2:5], v[2:9], v[10:17], 0
  s_nop 7
  v_mfma_f32_16x16x128_f8f6f4 v[20:23], v[2:9], v[10:17], 0
"""
    with pytest.raises(HazardError, match="after 8 wait states; 12 required"):
        run_snippet(as_source, None, 1)


@pytest.mark.parametrize("producer,consumer,required", [
    ("v_mov_b32 v2, 1.0", "v_mfma_f32_16x16x128_f8f6f4 v[20:23], v[2:9], v[10:17], 0", 2),
    ("v_mov_b32 v3, 1.0", "v_permlane32_swap_b32 v2, v3", 2),
    ("v_exp_f32 v2, v3", "v_add_f32 v4, v2, v2", 1),
    ("s_mov_b32 m0, 0", "buffer_load_dword v1, s[8:11], 0 offen lds", 1),
])
def test_short_hazards_need_their_wait_states(producer, consumer, required):
    body = f"  {producer}\n" + "  s_nop 0\n" * (required - 1) + f"  {consumer}\n"
    with pytest.raises(HazardError, match=f"after {required - 1} wait states; {required} required"):
        run_snippet(body, None, 1, lds_bytes=256)
    padded = f"  {producer}\n" + "  s_nop 0\n" * required + f"  {consumer}\n"
    run_snippet(padded, None, 1, lds_bytes=256)


# --- memory ---------------------------------------------------------------------------------------------------------
def test_lds_reads_writes_and_transpose():
    x = RNG.integers(0, 2**32, (4, LANES), dtype=np.uint64).astype(np.uint32)
    body = loads(2, 3, 4, 5) + """\
  v_lshlrev_b32 v6, 4, v0
  ds_write_b128 v6, v[2:5]
  v_lshlrev_b32 v7, 3, v0
  ds_write_b64 v7, v[2:3] offset:1024
  ds_write_b32 v1, v4 offset:2048
  s_waitcnt lgkmcnt(0)
  ds_read_b128 v[10:13], v6
  ds_read_b64 v[14:15], v7 offset:1024
  ds_read_b32 v16, v1 offset:2048
  ds_read_b64_tr_b8 v[18:19], v7 offset:1024
  s_waitcnt lgkmcnt(0)
""" + stores(10, 11, 12, 13, 14, 15, 16, 18, 19)
    out = run_snippet(body, x, 9, lds_bytes=4096)
    for i in range(4):
        np.testing.assert_array_equal(out[i], x[i])
    np.testing.assert_array_equal(out[4], x[0])
    np.testing.assert_array_equal(out[5], x[1])
    np.testing.assert_array_equal(out[6], x[2])
    # gfx950.md: per 16 lanes, destination lane d byte j comes from source lane 2j + d/8, byte d%8.
    src = np.stack([x[0], x[1]], axis=1).view(np.uint8).reshape(LANES, 8)
    lane = np.arange(LANES)
    d = lane % 16
    expected = np.stack([src[lane - d + 2 * j + d // 8, d % 8] for j in range(8)], axis=1)
    got = np.stack([out[7], out[8]], axis=1).view(np.uint8).reshape(LANES, 8)
    np.testing.assert_array_equal(got, expected)


def test_lds_address_is_a_32_bit_sum():
    """A base below zero plus an offset that brings it back in range addresses LDS (LLVM folds offsets so)."""
    x = RNG.integers(0, 2**32, (1, LANES), dtype=np.uint64).astype(np.uint32)
    body = loads(2) + """\
  v_lshlrev_b32 v6, 2, v0
  v_subrev_u32 v7, 0x400, v6
  ds_write_b32 v7, v2 offset:1024
  s_waitcnt lgkmcnt(0)
  ds_read_b32 v10, v6
  s_waitcnt lgkmcnt(0)
""" + stores(10)
    np.testing.assert_array_equal(run_snippet(body, x, 1, lds_bytes=256)[0], x[0])


def test_lds_access_outside_allocation_faults():
    with pytest.raises(MemoryFault, match="outside the workgroup's 256-byte allocation"):
        run_snippet("  ds_write_b32 v1, v0 offset:16\n", None, 1, lds_bytes=256)


def _buffer_prologue(num_records: int) -> str:
    """s[8:11] = raw buffer over the input table with `num_records` bytes."""
    return f"""\
  s_mov_b32 s8, s4
  s_and_b32 s9, s5, 0xffff
  s_mov_b32 s10, {num_records}
  s_mov_b32 s11, 0x20000
"""


def test_buffer_loads_bounds_and_stores():
    x = np.arange(4 * LANES, dtype=np.uint32).reshape(4, LANES) + 7
    records = 256 + 4 * 40  # row 0 fully and 40 lanes of row 1
    body = _buffer_prologue(records) + """\
  buffer_load_dword v10, v1, s[8:11], 0 offen offset:256
  v_lshlrev_b32 v2, 3, v0
  buffer_load_dwordx2 v[12:13], v2, s[8:11], 0 offen
  s_mov_b32 s12, 512
  buffer_load_dwordx4 v[16:19], v1, s[8:11], s12 offen
  s_waitcnt vmcnt(0)
  s_mov_b32 s10, 2048
  buffer_store_dword v10, v1, s[8:11], 0 offen offset:1024
  buffer_store_short v10, v1, s[8:11], 0 offen offset:1280
  s_waitcnt vmcnt(0)
  buffer_load_dword v17, v1, s[8:11], 0 offen offset:1024
  buffer_load_dword v18, v1, s[8:11], 0 offen offset:1280
  s_waitcnt vmcnt(0)
""" + stores(10, 12, 13, 16, 17, 18)
    table = np.concatenate([x, np.zeros((4, LANES), np.uint32)])
    out = run_snippet(body, table, 6)
    flat = table.reshape(-1)
    np.testing.assert_array_equal(out[0], np.where(np.arange(LANES) < 40, x[1], 0))
    in_range = 8 * np.arange(LANES) + 8 <= records
    np.testing.assert_array_equal(out[1], np.where(in_range, flat[2 * np.arange(LANES)], 0))
    np.testing.assert_array_equal(out[2], np.where(in_range, flat[2 * np.arange(LANES) + 1], 0))
    # soffset moves the address but is not part of the range check (ISA guide)
    np.testing.assert_array_equal(out[3], x[2])
    np.testing.assert_array_equal(out[4], out[0])
    np.testing.assert_array_equal(out[5], out[0] & 0xFFFF)


def test_direct_to_lds_buffer_load():
    x = RNG.integers(0, 2**32, (4, LANES), dtype=np.uint64).astype(np.uint32)
    body = _buffer_prologue(4 * 256) + """\
  s_mov_b32 m0, 64
  v_lshlrev_b32 v2, 4, v0
  buffer_load_dwordx4 v2, s[8:11], 0 offen lds
  s_mov_b32 m0, 2048
  s_nop 0
  buffer_load_dword v1, s[8:11], 0 offen offset:512 lds
  s_waitcnt vmcnt(0)
  v_lshlrev_b32 v3, 2, v0
  ds_read_b32 v10, v3 offset:64
  ds_read_b32 v11, v3 offset:320
  ds_read_b32 v12, v3 offset:2560
  s_waitcnt lgkmcnt(0)
""" + stores(10, 11, 12)
    out = run_snippet(body, x, 3, lds_bytes=4096)
    flat = x.reshape(-1)
    np.testing.assert_array_equal(out[0], flat[:LANES])  # lane i's 16 bytes land at M0 + 16 i
    np.testing.assert_array_equal(out[1], flat[LANES:2 * LANES])
    np.testing.assert_array_equal(out[2], x[2])  # the instruction offset also shifts the LDS address


def test_unmodelled_instruction_is_named():
    with pytest.raises(SimError, match="not modelled by the simulator: v_sin_f32"):
        run_snippet("  v_sin_f32 v2, v1\n", None, 1)


def test_global_load_with_64bit_vgpr_address_and_fault():
    x = gaussian(1)
    body = """\
  v_mov_b32 v3, s5
  v_add_u32 v2, s4, v1
  global_load_dword v10, v[2:3], off offset:-4
  s_waitcnt vmcnt(0)
""" + stores(10)
    with pytest.raises(MemoryFault, match="outside the allocated memory"):
        run_snippet(body, x.view(np.uint32), 1)
    out = run_snippet(body.replace("offset:-4", "offset:0"), x.view(np.uint32), 1)
    np.testing.assert_array_equal(out[0], x[0].view(np.uint32))


# --- waitcnt, barrier -------------------------------------------------------------------------------------------------
def test_missing_waitcnt_reads_stale_registers():
    x = gaussian(1)
    fresh = load_input(2, 0) + "  s_waitcnt vmcnt(0)\n  v_mov_b32 v10, v2\n" + stores(10)
    stale = load_input(2, 0) + "  v_mov_b32 v10, v2\n  s_waitcnt vmcnt(0)\n" + stores(10)
    np.testing.assert_array_equal(run_snippet(fresh, x.view(np.uint32), 1)[0], x[0].view(np.uint32))
    np.testing.assert_array_equal(run_snippet(stale, x.view(np.uint32), 1)[0], 0)
    # with a latency the load lands on its own after that many instructions of the wave
    late = load_input(2, 0) + "  s_nop 0\n" * 4 + "  v_mov_b32 v10, v2\n  s_waitcnt vmcnt(0)\n" + stores(10)
    np.testing.assert_array_equal(run_snippet(late, x.view(np.uint32), 1, latency=4)[0], x[0].view(np.uint32))


def test_vmcnt_counts_in_order():
    x = gaussian(2)
    body = load_input(2, 0) + load_input(3, 1) + "  s_waitcnt vmcnt(1)\n  v_mov_b32 v10, v2\n  v_mov_b32 v11, v3\n" \
        + "  s_waitcnt vmcnt(0)\n" + stores(10, 11)
    out = run_snippet(body, x.view(np.uint32), 2)
    np.testing.assert_array_equal(out[0], x[0].view(np.uint32))
    np.testing.assert_array_equal(out[1], 0)


BARRIER_BODY = """\
  v_and_b32 v1, 0xfc, v1
  v_lshrrev_b32 v5, 6, v0
  s_nop 0
  v_readfirstlane_b32 s12, v5
  s_cmp_eq_u32 s12, 0
  s_cbranch_scc0 consumer
  v_mov_b32 v6, 0x1234
  ds_write_b32 v1, v6
  s_waitcnt lgkmcnt(0)
consumer:
  s_barrier
  ds_read_b32 v10, v1
  s_waitcnt lgkmcnt(0)
  s_cmp_eq_u32 s12, 3
  s_cbranch_scc0 done
""" + store_output(10, 0) + "done:\n"


@pytest.mark.parametrize("schedule", ["round_robin", "greedy", "random"])
def test_barrier_orders_lds_between_waves(schedule):
    out = run_snippet(BARRIER_BODY, None, 1, lds_bytes=256, threads=256, schedule=schedule, seed=3)
    np.testing.assert_array_equal(out[0], 0x1234)


def test_missing_barrier_reads_stale_lds():
    body = BARRIER_BODY.replace("  s_barrier\n", "")
    outcomes = [run_snippet(body, None, 1, lds_bytes=256, threads=256, schedule="greedy", seed=seed)[0]
                for seed in range(4)]
    assert any(np.array_equal(out, np.zeros(LANES)) for out in outcomes)


def test_instruction_table_cites_the_pseudocode():
    from tinygrad.runtime.autogen.amd.cdna.str_pcode import PCODE
    names = {k.name for k in PCODE}
    rows = instruction_table()
    assert len(rows) > 100
    for name, _unit, source in rows:
        if source.startswith("PCODE "):
            cited = source.split()[1].rstrip("*")
            assert any(n.startswith(cited) for n in names), (name, source)


def test_docs_list_every_implemented_instruction():
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / "simulator.md").read_text()
    missing = [name for name, _, _ in instruction_table() if f"`{name}`" not in doc]
    assert not missing, f"docs/simulator.md does not list {missing}"


def test_smem_returns_out_of_order_under_a_nonzero_lgkmcnt():
    x = np.arange(LANES, dtype=np.uint32)[None] + 100
    body = """\
  s_load_dword s8, s[4:5], 0x0
  s_load_dword s9, s[4:5], 0x4
  s_waitcnt lgkmcnt(1)
  v_mov_b32 v10, s8
  v_mov_b32 v11, s9
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v12, s8
""" + stores(10, 11, 12)
    out = run_snippet(body, x, 3)
    assert (out[0][0], out[1][0], out[2][0]) == (0, 101, 100)  # the younger load landed first


def test_kernel_descriptor_and_register_allocation():
    from asmgen.sim import SimError as Error
    from asmgen.sim import load
    from asmgen.sim.testing import assemble, snippet_source
    program = load(assemble(snippet_source("  v_accvgpr_write_b32 a3, v2\n", vgprs=40, agprs=8, lds_bytes=1536)))
    kd = program.descriptor("snippet")
    assert (kd.accum_offset, kd.vgpr_count, kd.group_segment_size, kd.kernarg_size) == (40, 48, 1536, 16)
    assert kd.user_sgprs == (("kernarg_segment_ptr", 2),) and kd.workgroup_id_sgprs == (True, False, False)
    with pytest.raises(Error, match="a8 is beyond the 8 AGPRs"):
        run_snippet("  v_accvgpr_write_b32 a8, v2\n", None, 1, vgprs=40, agprs=8)
    with pytest.raises(Error, match="v40 is beyond the 40 VGPRs"):
        run_snippet("  v_mov_b32 v40, 0\n", None, 1, vgprs=40, agprs=8)
