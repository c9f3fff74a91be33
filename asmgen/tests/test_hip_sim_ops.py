"""The simulator's instructions for the HIP kernels (asmgen/sim/compiled_ops.py, mfma_bf16.py), each assembled with
clang-22 and run against numpy expectations written from the CDNA pseudocode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asmgen.sim import HazardError, instruction_table
from asmgen.sim.testing import load_input, run_snippet, store_output

LANES = 64
RNG = np.random.default_rng(77)
NEW = ("v_mov_b64", "v_lshl_add_u64", "v_mad_u64_u32", "v_add_co_u32", "s_lshl2_add_u32", "ds_read2_b64",
       "ds_write_b16", "ds_write_b16_d16_hi", "v_bfrev_b32", "v_bitop3_b32", "v_add3_u32", "v_sub_u16",
       "v_mul_lo_u16", "v_lshlrev_b16", "v_mul_hi_u32", "v_subrev_u32", "v_or3_b32", "s_mul_hi_i32", "ds_write_b8",
       "ds_write_b8_d16_hi", "s_load_dwordx16", "s_cmpk_gt_u32", "s_cmpk_lt_u32", "v_writelane_b32",
       "v_mfma_f32_32x32x16_bf16", "v_mfma_f32_16x16x32_bf16")


def u32_rows(n: int) -> np.ndarray:
    return RNG.integers(0, 2**32, size=(n, LANES), dtype=np.uint64).astype(np.uint32)


def run(body: str, table: np.ndarray, outputs: list[int], **kw) -> np.ndarray:
    loads = "".join(load_input(2 + i, i) for i in range(len(table))) + "  s_waitcnt vmcnt(0)\n"
    stores = "".join(store_output(r, i) for i, r in enumerate(outputs))
    return run_snippet(loads + body + stores, table, len(outputs), **kw).astype(np.uint64)


def pair(lo, hi):
    return lo.astype(np.uint64) | hi.astype(np.uint64) << np.uint64(32)


def test_every_new_instruction_cites_the_pseudocode():
    sources = {name: source for name, _, source in instruction_table()}
    for name in NEW:
        assert sources[name].startswith("PCODE " + name.upper()), name


def test_64_bit_moves_and_shift_add():
    x = u32_rows(4)
    out = run("  v_mov_b64 v[10:11], v[2:3]\n  v_lshl_add_u64 v[12:13], v[2:3], 3, v[4:5]\n"
              "  v_mov_b64 v[14:15], 0x7b\n", x, [10, 11, 12, 13, 14, 15])
    a, b = pair(x[0], x[1]), pair(x[2], x[3])
    with np.errstate(over="ignore"):
        expected = (a << np.uint64(3)) + b
    np.testing.assert_array_equal(pair(out[0], out[1]), a)
    np.testing.assert_array_equal(pair(out[2], out[3]), expected)
    np.testing.assert_array_equal(pair(out[4], out[5]), np.full(LANES, 0x7B, np.uint64))


def test_mad_u64_u32_and_add_co_carry_out():
    x = u32_rows(4)
    x[0, :2] = x[1, :2] = 0xFFFFFFFF  # lanes 0-1 overflow 64 bits (carry out)
    x[2, :2] = x[3, :2] = 0xFFFFFFFF
    body = ("  v_mad_u64_u32 v[10:11], s[20:21], v2, v3, v[4:5]\n  v_mov_b32 v12, s20\n  v_mov_b32 v13, s21\n"
            "  v_add_co_u32 v14, vcc, v2, v3\n  v_mov_b32 v15, vcc_lo\n  v_mov_b32 v16, vcc_hi\n")
    out = run(body, x, [10, 11, 12, 13, 14, 15, 16])
    full = [int(a) * int(b) + int(c) for a, b, c in zip(x[0], x[1], pair(x[2], x[3]), strict=True)]
    np.testing.assert_array_equal(pair(out[0], out[1]), np.array([f % 2**64 for f in full], np.uint64))
    carry = sum(1 << i for i, f in enumerate(full) if f >> 64)
    assert int(out[2, 0]) | int(out[3, 0]) << 32 == carry
    total = x[0].astype(np.uint64) + x[1].astype(np.uint64)
    np.testing.assert_array_equal(out[4], total & np.uint64(0xFFFFFFFF))
    assert int(out[5, 0]) | int(out[6, 0]) << 32 == sum(1 << i for i, t in enumerate(total) if t >> 32)


def test_bitwise_add3_and_16_bit_ops():
    x = u32_rows(3)
    body = ("  v_bfrev_b32 v10, v2\n  v_bitop3_b32 v11, v2, v3, v4 bitop3:0x6c\n  v_add3_u32 v12, v2, v3, v4\n"
            "  v_sub_u16 v13, v2, v3\n  v_mul_lo_u16 v14, v2, v3\n  v_lshlrev_b16 v15, v2, v3\n"
            "  v_mul_hi_u32 v16, v2, v3\n  v_subrev_u32 v17, v2, v3\n  v_or3_b32 v18, v2, v3, v4\n")
    out = run(body, x, [10, 11, 12, 13, 14, 15, 16, 17, 18])
    a, b, c = (int(v[5]) for v in x)
    assert int(out[0, 5]) == int(f"{a:032b}"[::-1], 2)
    minterms = [(a if m & 4 else ~a) & (b if m & 2 else ~b) & (c if m & 1 else ~c) for m in range(8)]
    assert int(out[1, 5]) == sum(minterms[m] for m in range(8) if 0x6C >> m & 1) & 0xFFFFFFFF
    assert int(out[2, 5]) == (a + b + c) & 0xFFFFFFFF
    assert int(out[3, 5]) == (a - b) & 0xFFFF  # high 16 bits zero
    assert int(out[4, 5]) == (a * b) & 0xFFFF
    assert int(out[5, 5]) == ((b & 0xFFFF) << (a & 15)) & 0xFFFF
    assert int(out[6, 5]) == (a * b) >> 32
    assert int(out[7, 5]) == (b - a) & 0xFFFFFFFF
    assert int(out[8, 5]) == a | b | c


def test_scalar_shift_add_multiply_high_and_wide_load():
    body = "  s_mov_b32 s10, 0x40000001\n  s_mov_b32 s11, 7\n  s_lshl2_add_u32 s12, s10, s11\n" \
           "  s_cselect_b32 s13, 1, 0\n  v_mov_b32 v10, s12\n  v_mov_b32 v11, s13\n" \
           "  s_mov_b32 s14, -5\n  s_mul_hi_i32 s15, s14, s10\n  v_mov_b32 v12, s15\n" \
           "  s_load_dwordx16 s[32:47], s[4:5], 0x0\n  s_waitcnt lgkmcnt(0)\n  v_mov_b32 v13, s47\n"
    body += "  s_movk_i32 s16, 0x100\n  s_cmpk_gt_u32 s16, 0xff\n  s_cselect_b32 s17, 1, 0\n" \
            "  s_cmpk_lt_u32 s16, 0x100\n  s_cselect_b32 s18, 1, 0\n  v_mov_b32 v14, s17\n  v_mov_b32 v15, s18\n"
    body += "  v_mov_b32 v16, 0\n  s_mov_b64 exec, 0\n  v_writelane_b32 v16, s10, 5\n  s_mov_b64 exec, -1\n"
    x = u32_rows(1)
    out = run(body, x, [10, 11, 12, 13, 14, 15, 16])
    assert int(out[6, 5]) == 0x40000001 and not out[6, :5].any()  # lane 5 written with EXEC off
    assert (int(out[4, 0]), int(out[5, 0])) == (1, 0)  # 0x100 > 0xff, not < 0x100
    assert int(out[0, 0]) == (0x40000001 * 4 + 7) & 0xFFFFFFFF and int(out[1, 0]) == 1  # carry out in SCC
    assert int(out[2, 0]) == ((-5 * 0x40000001) >> 32) & 0xFFFFFFFF
    assert int(out[3, 0]) == int(x[0, 15])  # dword 15 of the input table


def test_lds_16_bit_writes_and_paired_read():
    x = u32_rows(1)
    body = ("  v_lshlrev_b32 v10, 2, v0\n"  # lane l writes its dword at 4l in pieces: 16 bits, 8 bits, 8 bits
            "  ds_write_b16 v10, v2\n  v_lshrrev_b32 v20, 16, v2\n  ds_write_b8 v10, v20 offset:2\n"
            "  v_lshrrev_b32 v21, 8, v2\n  ds_write_b8_d16_hi v10, v21 offset:3\n  s_waitcnt lgkmcnt(0)\n"
            "  v_lshlrev_b32 v11, 3, v0\n  v_and_b32 v11, 0x78, v11\n"  # 8l mod 128: two reads of 8 bytes
            "  ds_read2_b64 v[12:15], v11 offset1:4\n  s_waitcnt lgkmcnt(0)\n")
    out = run(body, x, [12, 13, 14, 15], lds_bytes=512)
    lds = x[0].view(np.uint8)  # the writes reassemble each lane's dword at 4l
    for lane in (0, 9, 63):
        start = 8 * lane % 128
        expect = np.concatenate([lds[start:start + 8], lds[start + 32:start + 40]]).view(np.uint32)
        np.testing.assert_array_equal(out[:, lane], expect)


def _bf16_operand(rng, rows: int, k: int):
    """A (rows x k) bf16 matrix and its register image: lane l holds row l % rows, element i is k = 8 (l // rows) + i.
    """
    values = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32)).bfloat16()
    lane = np.arange(LANES)
    elements = values.view(torch.int16).numpy()[lane[:, None] % rows, 8 * (lane[:, None] // rows) + np.arange(8)]
    image = np.ascontiguousarray(elements.astype(np.int16)).view(np.uint32).T  # (4 registers, 64 lanes)
    return values.double().numpy(), image


@pytest.mark.parametrize("shape", ["32x32x16", "16x16x32"])
def test_mfma_bf16_matches_matmul(shape):
    m, k = (32, 16) if shape == "32x32x16" else (16, 32)
    regs = 16 if m == 32 else 4
    rng = np.random.default_rng(5)
    a, a_img = _bf16_operand(rng, m, k)
    b_t, b_img = _bf16_operand(rng, m, k)  # B by columns: B[k, j] = b_t[j, k]
    c = rng.standard_normal((m, m)).astype(np.float32)
    reg, lane = np.meshgrid(np.arange(regs), np.arange(LANES), indexing="ij")
    row = 8 * (reg // 4) + 4 * (lane // 32) + reg % 4 if m == 32 else 4 * (lane // 16) + reg
    c_img = c[row, lane % m]
    table = np.concatenate([a_img, b_img, c_img.view(np.uint32)])
    body = f"  v_mfma_f32_{shape}_bf16 v[40:{39 + regs}], v[2:5], v[6:9], v[10:{9 + regs}]\n  s_nop 15\n"
    out = run(body, table, list(range(40, 40 + regs))).astype(np.uint32).view(np.float32)
    expected = (a @ b_t.T + c).astype(np.float32)
    np.testing.assert_allclose(out, expected[row, lane % m], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape,required", [("32x32x16", 12), ("16x16x32", 8)])
def test_mfma_bf16_result_read_too_early_is_a_hazard(shape, required):
    regs = 16 if shape == "32x32x16" else 4
    body = f"  v_mfma_f32_{shape}_bf16 v[20:{19 + regs}], v[2:5], v[6:9], 0\n  s_nop {required - 2}\n" \
           "  v_mov_b32 v50, v20\n"
    with pytest.raises(HazardError, match=f"after {required - 1} wait states; {required} required"):
        run_snippet(body, None, 1)
    run_snippet(body.replace(f"s_nop {required - 2}", f"s_nop {required - 1}"), None, 1)
