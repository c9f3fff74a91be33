"""The in-kernel V^T of asmgen/sm90a/experiments/transpose_v_smem.patch (kTransposeV, producer.cuh's
transpose_v_tiles) on the CPU: its lanes' ldmatrix.trans / byte permute / stmatrix moves, emulated with the
instructions' fragment layouts, turn a raw V slot (as TMA writes it, 128-byte swizzle) into exactly the V^T slot that
TMA loads from the host pre-pass's output (keys permuted within each 16), and neither move has a bank conflict.
The addresses are the patch's formulas, written again here: change both together."""

from __future__ import annotations

import numpy as np

ROW = 128  # bytes per shared-memory row (the 128-byte swizzle's width)
EVEN_DIM, ODD_DIM = 0x6420, 0x7531
WARPS, UNITS = 3, 32


def swizzled(row: int, chunk: int) -> int:
    """Byte offset of 16-byte chunk `chunk` of `row` under the 128-byte swizzle."""
    return row * ROW + 16 * (chunk ^ (row % 8))


def byte_perm(a: bytes, b: bytes, selector: int) -> bytes:
    pool = a + b
    return bytes(pool[(selector >> (4 * i)) & 0xF] for i in range(4))


def lane_addresses(unit: int):
    """Per lane: (ldmatrix address in the raw slot, stmatrix address in the V^T slot), as transpose_v_tiles."""
    group, pair = unit // 4, unit % 4
    out = []
    for lane in range(32):
        row, matrix = lane % 8, lane // 8
        load_lane = (8 * (matrix % 2) + row) * ROW + 16 * ((matrix // 2) ^ row)
        dim = 2 * row + int((matrix % 2 == 0) == (row >= 4))
        store_lane = (16 * (matrix // 2) + dim) * ROW + 16 * (dim % 8)
        out.append((group * 16 * ROW + (load_lane ^ (16 * 2 * pair)), pair * 32 * ROW + (store_lane ^ (16 * group))))
    return out


def ldmatrix_x4_trans(smem: bytearray, addresses) -> list[list[bytes]]:
    """regs[lane][j]: elements (2(l%4), l/4) and (2(l%4)+1, l/4) of matrix j, whose row r is at addresses[8j + r]."""
    rows = [[smem[addresses[8 * j + r]: addresses[8 * j + r] + 16] for r in range(8)] for j in range(4)]
    return [[rows[j][2 * (lane % 4)][2 * (lane // 4): 2 * (lane // 4) + 2] +
             rows[j][2 * (lane % 4) + 1][2 * (lane // 4): 2 * (lane // 4) + 2] for j in range(4)]
            for lane in range(32)]


def stmatrix_x4(smem: bytearray, addresses, regs) -> None:
    """Row r of matrix j (registers j of lanes 4r .. 4r + 3) to addresses[8j + r]."""
    for j in range(4):
        for r in range(8):
            smem[addresses[8 * j + r]: addresses[8 * j + r] + 16] = b"".join(regs[4 * r + t][j] for t in range(4))


def transpose(raw: bytearray) -> bytearray:
    vt = bytearray(len(raw))
    for warp in range(WARPS):  # warp w: key groups w, w + 3, ..., each in its four pairs of 16-dim chunks
        for unit in (4 * group + pair for group in range(warp, UNITS // 4, WARPS) for pair in range(4)):
            addresses = lane_addresses(unit)
            regs = ldmatrix_x4_trans(raw, [a[0] for a in addresses])
            out = []
            for lane in range(32):
                even_first, odd_first = (EVEN_DIM, ODD_DIM) if lane < 16 else (ODD_DIM, EVEN_DIM)
                m = regs[lane]
                out.append([byte_perm(m[0], m[1], even_first), byte_perm(m[0], m[1], odd_first),
                            byte_perm(m[2], m[3], even_first), byte_perm(m[2], m[3], odd_first)])
            stmatrix_x4(vt, [a[1] for a in addresses], out)
    return vt


def test_the_moves_make_the_pre_pass_v_transposed_slot():
    v = np.random.default_rng(7).integers(0, 256, size=(128, 128), dtype=np.uint8)  # [key][dim]
    raw = bytearray(128 * ROW)
    for key in range(128):
        for chunk in range(8):
            raw[swizzled(key, chunk): swizzled(key, chunk) + 16] = v[key, 16 * chunk: 16 * chunk + 16].tobytes()
    expected = bytearray(128 * ROW)  # the pre-pass's V^T, as TMA puts it in the slot
    for dim in range(128):
        for pos in range(128):
            group, p = divmod(pos, 16)
            t, a, b = p // 4, (p // 2) % 2, p % 2
            expected[swizzled(dim, group) + p] = v[16 * group + 8 * a + 2 * t + b, dim]
    assert transpose(raw) == expected


def test_every_move_is_free_of_bank_conflicts():
    # each 8x8 matrix's eight 16-byte rows, read or written in one phase, fall in eight distinct 16-byte bank groups
    for unit in range(UNITS):
        addresses = lane_addresses(unit)
        for side in range(2):
            for j in range(4):
                assert len({addresses[8 * j + r][side] % ROW // 16 for r in range(8)}) == 8
