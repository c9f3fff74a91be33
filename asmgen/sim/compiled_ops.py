"""Scalar, vector and LDS instructions that clang emits for the HIP kernels (asmgen/hip) beyond those of the
generated assembly kernels: 64-bit address arithmetic, carries, paired and 16-bit LDS accesses.

Each cites its CDNA pseudocode entry (tinygrad.runtime.autogen.amd.cdna.str_pcode.PCODE). Carry-outs to VCC or an
SGPR pair are written per lane with inactive lanes 0, as the comparisons (valu.py).
"""

from __future__ import annotations

import numpy as np

from . import memops
from .errors import SimError
from .isa import LDS, SALU, SMEM, VALU, define
from .memops import _check_lds, _lds_addresses, _rows_to_regs, _write_regs
from .salu import U32, i32
from .wave import LANES, mask_to_int

U64_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)
LOW32 = np.uint64(0xFFFFFFFF)
SHIFT_3BITS = np.uint64(7)
DS2_B64_UNIT = 8  # ds_read2_b64 offsets count 8-byte elements


def read64(w, op) -> np.ndarray:
    """A 64-bit vector source per lane: a VGPR/SGPR pair, or an immediate (its printed value)."""
    if op.kind == "imm":
        return np.full(LANES, np.uint64(int(op.value) & 0xFFFFFFFFFFFFFFFF), dtype=np.uint64)
    if op.neg or op.abs:
        raise SimError(f"neg / abs are not modelled on 64-bit integer operand {op}")
    lo, hi = w.vread(op, 0).astype(np.uint64), w.vread(op, 1).astype(np.uint64)
    return hi << np.uint64(32) | lo


def write64(w, op, values: np.ndarray) -> None:
    values = values.astype(np.uint64)
    w.vwrite(op, (values & LOW32).astype(np.uint32), 0)
    w.vwrite(op, (values >> np.uint64(32)).astype(np.uint32), 1)


def _carry(w, op, carry: np.ndarray) -> None:
    w.swrite(op, mask_to_int(carry & w.exec_mask), 64)


@define("v_mov_b64", VALU, "PCODE {NAME}")
def v_mov_b64(w, ins, ctx):
    write64(w, ins.operands[0], read64(w, ins.operands[1]))


@define("v_lshl_add_u64", VALU, "PCODE {NAME} (D = (S0 << S1[2:0]) + S2)")
def v_lshl_add_u64(w, ins, ctx):
    d, s0, s1, s2 = ins.operands
    shift = w.vread(s1).astype(np.uint64) & SHIFT_3BITS
    with np.errstate(over="ignore"):
        write64(w, d, (read64(w, s0) << shift) + read64(w, s2))


@define("v_mad_u64_u32", VALU, "PCODE {NAME} ({carry, D} = S0.u32 * S1.u32 + S2.u64)")
def v_mad_u64_u32(w, ins, ctx):
    d, carry, s0, s1, s2 = ins.operands
    a, b, c = ([int(x) for x in w.vread(s0)], [int(x) for x in w.vread(s1)], [int(x) for x in read64(w, s2)])
    full = [x * y + z for x, y, z in zip(a, b, c, strict=True)]
    write64(w, d, np.array([f & 0xFFFFFFFFFFFFFFFF for f in full], dtype=np.uint64))
    _carry(w, carry, np.array([f >> 64 != 0 for f in full]))


@define("v_add_co_u32", VALU, "PCODE {NAME} (VCC / SDST = unsigned carry-out)")
def v_add_co_u32(w, ins, ctx):
    d, carry, s0, s1 = ins.operands
    total = w.vread(s0).astype(np.uint64) + w.vread(s1).astype(np.uint64)
    w.vwrite(d, (total & LOW32).astype(np.uint32))
    _carry(w, carry, total > LOW32)


@define("s_lshl2_add_u32", SALU, "PCODE {NAME}")
def s_lshl2_add_u32(w, ins, ctx):
    a, b = (w.sread(op) for op in ins.operands[1:])
    total = (a << 2) + b
    w.swrite(ins.operands[0], total & U32)
    w.scc = int(total > U32)


@define("ds_read2_b64", LDS, "PCODE {NAME} (two 8-byte reads at ADDR + 8 * OFFSET0 and ADDR + 8 * OFFSET1)")
def ds_read2_b64(w, ins, ctx):
    dst = ins.operands[0]
    base, mask = _lds_addresses(w, ins, ctx, 0), w.exec_mask.copy()
    parts = [base + DS2_B64_UNIT * ins.mods.get(f"offset{i}", 0) for i in (0, 1)]
    for addr in parts:
        _check_lds(ctx, w, ins, addr[mask], DS2_B64_UNIT)

    def complete():
        rows = np.concatenate([w.lds[np.where(mask, a, 0)[:, None] + np.arange(8)] for a in parts], axis=1)
        _write_regs(w, dst, _rows_to_regs(rows, 4), mask)
    ctx.issue(w, ins, complete)


@define("ds_write_b16 ds_write_b16_d16_hi ds_write_b8 ds_write_b8_d16_hi", LDS,
        "PCODE {NAME} (MEM[ADDR] = DATA[15:0] / DATA[7:0]; d16_hi: the same width from bit 16)")
def ds_write_narrow(w, ins, ctx):
    size = 1 if "_b8" in ins.name else 2
    addr, mask = _lds_addresses(w, ins, ctx, size), w.exec_mask.copy()
    data = w.vread(ins.operands[1])
    if ins.name.endswith("d16_hi"):
        data = data >> np.uint32(16)
    rows = data.astype(np.uint32).view(np.uint8).reshape(LANES, 4)[:, :size][mask]
    addr = addr[mask]

    def complete():
        w.lds[addr[:, None] + np.arange(size)] = rows
    ctx.issue(w, ins, complete)


memops.DWORDS["dwordx16"] = 16  # s_load's width table
define("s_load_dwordx16", SMEM, "PCODE {NAME} (address = SBASE + offset, dword aligned)")(memops.s_load)


@define("s_mul_hi_i32", SALU, "PCODE {NAME}")
def s_mul_hi_i32(w, ins, ctx):
    a, b = (i32(w.sread(op)) for op in ins.operands[1:])
    w.swrite(ins.operands[0], (a * b) >> 32 & U32)


@define("v_subrev_u32", VALU, "PCODE {NAME} (D = S1 - S0)")
def v_subrev_u32(w, ins, ctx):
    a, b = (w.vread(op).astype(np.int64) for op in ins.operands[1:3])
    w.vwrite(ins.operands[0], ((b - a) & 0xFFFFFFFF).astype(np.uint32))


@define("v_or3_b32", VALU, "PCODE {NAME}")
def v_or3_b32(w, ins, ctx):
    s0, s1, s2 = (w.vread(op) for op in ins.operands[1:4])
    w.vwrite(ins.operands[0], s0 | s1 | s2)


@define("v_bfrev_b32", VALU, "PCODE {NAME} (D[31:0] = S0[0:31])")
def v_bfrev_b32(w, ins, ctx):
    x = w.vread(ins.operands[1])
    bits = np.unpackbits(x.astype(">u4").view(np.uint8).reshape(LANES, 4), axis=1)[:, ::-1]
    w.vwrite(ins.operands[0], np.packbits(bits, axis=1).view(">u4").reshape(LANES).astype(np.uint32))


@define("v_bitop3_b32", VALU, "PCODE {NAME} (bit i of the bitop3 table selects the minterm of S0, S1, S2 with value i)")
def v_bitop3_b32(w, ins, ctx):
    table = ins.mods.get("bitop3", 0)
    s0, s1, s2 = (w.vread(op) for op in ins.operands[1:4])
    out = np.zeros(LANES, dtype=np.uint32)
    for minterm in range(8):
        if table >> minterm & 1:
            a = s0 if minterm & 4 else ~s0
            b = s1 if minterm & 2 else ~s1
            c = s2 if minterm & 1 else ~s2
            out |= a & b & c
    w.vwrite(ins.operands[0], out)


@define("v_add3_u32", VALU, "PCODE {NAME}")
def v_add3_u32(w, ins, ctx):
    total = sum(w.vread(op).astype(np.uint64) for op in ins.operands[1:4])
    w.vwrite(ins.operands[0], (total & LOW32).astype(np.uint32))


# 16-bit VOP2 integer ops: D0.u16 = f(S0.u16, S1.u16); gfx9 writes the high 16 bits as zero (LLVM relies on it:
# the result feeds 32-bit adds unmasked).
LOW16 = np.uint32(0xFFFF)
_U16_OPS = {
    "v_sub_u16": lambda a, b: a - b,
    "v_mul_lo_u16": lambda a, b: a * b,
    "v_lshlrev_b16": lambda a, b: b << (a & np.uint32(15)),  # PCODE: S1.u16 << S0[3:0]
}
for _name, _fn in _U16_OPS.items():
    @define(_name, VALU, "PCODE {NAME} (high 16 bits zero)")
    def _u16(w, ins, ctx, fn=_fn):
        a, b = (w.vread(op) & LOW16 for op in ins.operands[1:3])
        w.vwrite(ins.operands[0], fn(a, b) & LOW16)


@define("v_mul_hi_u32", VALU, "PCODE {NAME}")
def v_mul_hi_u32(w, ins, ctx):
    a, b = (w.vread(op).astype(np.uint64) for op in ins.operands[1:3])
    w.vwrite(ins.operands[0], ((a * b) >> np.uint64(32)).astype(np.uint32))


# SOPK comparisons of an SGPR with a zero-extended 16-bit constant.
_CMPK_U32 = {"eq": lambda a, b: a == b, "lg": lambda a, b: a != b, "gt": lambda a, b: a > b,
             "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b}
for _cond, _test in _CMPK_U32.items():
    @define(f"s_cmpk_{_cond}_u32", SALU, "PCODE {NAME} (SCC = S0.u32 <op> 32'U(S1.u16))")
    def _cmpk(w, ins, ctx, test=_test):
        w.scc = int(test(w.sread(ins.operands[0]), ins.operands[1].index & 0xFFFF))


def _i32(x: int) -> int:
    return x - (1 << 32) if x & 0x80000000 else x


# The signed forms: an SGPR as i32 against the sign-extended 16-bit constant.
for _cond, _test in _CMPK_U32.items():
    @define(f"s_cmpk_{_cond}_i32", SALU, "PCODE {NAME} (SCC = S0.i32 <op> 32'I(signext(S1.i16)))")
    def _cmpk_i32(w, ins, ctx, test=_test):
        k = ins.operands[1].index & 0xFFFF
        w.scc = int(test(_i32(w.sread(ins.operands[0])), k - (1 << 16) if k & 0x8000 else k))


@define("v_writelane_b32", VALU, "PCODE {NAME} (VGPR[S1[5:0]][VDST] = S0, whatever EXEC holds)")
def v_writelane_b32(w, ins, ctx):
    d, value, lane = ins.operands
    if d.kind != "v":
        raise SimError(f"{ins.addr:#x}: {ins.name} writes a VGPR")
    w.v[d.index][w.sread(lane) & (LANES - 1)] = w.sread(value)
