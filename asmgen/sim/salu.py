"""Scalar ALU and program-control instructions (SOP1, SOP2, SOPK, SOPC, SOPP)."""

from __future__ import annotations

from .isa import BRANCH, SALU, SYNC, define
from .wave import EXEC_LO, U32

U64 = (1 << 64) - 1
SIGN32 = 1 << 31


def i32(x: int) -> int:
    x &= U32
    return x - (1 << 32) if x & SIGN32 else x


def sext16(x: int) -> int:
    x &= 0xFFFF
    return x - 0x10000 if x & 0x8000 else x


def _sources(w, ins, width=32):
    return [w.sread(op, width) for op in ins.operands[1:]]


# --- moves and selects -------------------------------------------------------------------------------------------
@define("s_mov_b32", SALU, "PCODE S_MOV_B32")
def s_mov_b32(w, ins, ctx):
    w.swrite(ins.operands[0], w.sread(ins.operands[1]))


@define("s_mov_b64", SALU, "PCODE S_MOV_B64")
def s_mov_b64(w, ins, ctx):
    w.swrite(ins.operands[0], w.sread(ins.operands[1], 64), 64)


@define("s_movk_i32", SALU, "PCODE S_MOVK_I32")
def s_movk_i32(w, ins, ctx):
    w.swrite(ins.operands[0], sext16(ins.operands[1].index))


@define("s_cselect_b32", SALU, "PCODE S_CSELECT_B32")
def s_cselect_b32(w, ins, ctx):
    a, b = _sources(w, ins)
    w.swrite(ins.operands[0], a if w.scc else b)


@define("s_cselect_b64", SALU, "PCODE S_CSELECT_B64")
def s_cselect_b64(w, ins, ctx):
    a, b = _sources(w, ins, 64)
    w.swrite(ins.operands[0], a if w.scc else b, 64)


# --- integer arithmetic ------------------------------------------------------------------------------------------
def _arith(name, fn):
    """fn(a, b, scc) -> (result, scc or None to leave SCC alone)."""
    @define(name, SALU, "PCODE {NAME}")
    def op(w, ins, ctx):
        a, b = _sources(w, ins)
        result, scc = fn(a, b, w.scc)
        w.swrite(ins.operands[0], result)
        if scc is not None:
            w.scc = int(scc)


def _fits_i32(x: int) -> bool:
    return -SIGN32 <= x < SIGN32


_arith("s_add_u32", lambda a, b, c: (a + b, (a + b) >> 32))
_arith("s_addc_u32", lambda a, b, c: (a + b + c, (a + b + c) >> 32))
_arith("s_sub_u32", lambda a, b, c: (a - b, b > a))
_arith("s_subb_u32", lambda a, b, c: (a - b - c, b + c > a))
_arith("s_add_i32", lambda a, b, c: (a + b, not _fits_i32(i32(a) + i32(b))))
_arith("s_sub_i32", lambda a, b, c: (a - b, not _fits_i32(i32(a) - i32(b))))
_arith("s_mul_i32", lambda a, b, c: (i32(a) * i32(b), None))
_arith("s_mul_hi_u32", lambda a, b, c: ((a * b) >> 32, None))
_arith("s_min_u32", lambda a, b, c: (a if a < b else b, a < b))
_arith("s_max_u32", lambda a, b, c: (a if a > b else b, a > b))
_arith("s_min_i32", lambda a, b, c: (a if i32(a) < i32(b) else b, i32(a) < i32(b)))
_arith("s_max_i32", lambda a, b, c: (a if i32(a) > i32(b) else b, i32(a) > i32(b)))
_arith("s_lshl_b32", lambda a, b, c: ((a << (b & 31)) & U32, (a << (b & 31)) & U32 != 0))
_arith("s_lshr_b32", lambda a, b, c: (a >> (b & 31), a >> (b & 31) != 0))
_arith("s_ashr_i32", lambda a, b, c: (i32(a) >> (b & 31), i32(a) >> (b & 31) != 0))
_arith("s_bfe_u32", lambda a, b, c: ((a >> (b & 31)) & ((1 << ((b >> 16) & 0x7F)) - 1),
                                     (a >> (b & 31)) & ((1 << ((b >> 16) & 0x7F)) - 1) != 0))
for _name, _fn in (("and", lambda a, b: a & b), ("or", lambda a, b: a | b), ("xor", lambda a, b: a ^ b),
                   ("andn2", lambda a, b: a & ~b)):
    _arith(f"s_{_name}_b32", lambda a, b, c, f=_fn: (f(a, b) & U32, f(a, b) & U32 != 0))

    @define(f"s_{_name}_b64", SALU, "PCODE {NAME}")
    def _logic64(w, ins, ctx, f=_fn):
        a, b = _sources(w, ins, 64)
        result = f(a, b) & U64
        w.swrite(ins.operands[0], result, 64)
        w.scc = int(result != 0)


@define("s_lshl_b64", SALU, "PCODE S_LSHL_B64")
def s_lshl_b64(w, ins, ctx):
    a, b = w.sread(ins.operands[1], 64), w.sread(ins.operands[2])
    result = (a << (b & 63)) & U64
    w.swrite(ins.operands[0], result, 64)
    w.scc = int(result != 0)


@define("s_addk_i32", SALU, "PCODE S_ADDK_I32")
def s_addk_i32(w, ins, ctx):
    d, k = i32(w.sread(ins.operands[0])), sext16(ins.operands[1].index)
    w.swrite(ins.operands[0], d + k)
    w.scc = int(not _fits_i32(d + k))


@define("s_mulk_i32", SALU, "PCODE S_MULK_I32")
def s_mulk_i32(w, ins, ctx):
    w.swrite(ins.operands[0], i32(w.sread(ins.operands[0])) * sext16(ins.operands[1].index))


# --- comparisons -------------------------------------------------------------------------------------------------
_COMPARE = {"eq": lambda a, b: a == b, "lg": lambda a, b: a != b, "lt": lambda a, b: a < b,
            "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}
for _cond, _fn in _COMPARE.items():
    for _type, _cast in (("u32", lambda x: x), ("i32", i32)):
        @define(f"s_cmp_{_cond}_{_type}", SALU, "PCODE {NAME}")
        def _cmp(w, ins, ctx, f=_fn, cast=_cast):
            a, b = (w.sread(op) for op in ins.operands)
            w.scc = int(f(cast(a), cast(b)))


@define("s_and_saveexec_b64", SALU, "PCODE S_AND_SAVEEXEC_B64")
def s_and_saveexec_b64(w, ins, ctx):
    saved = w.exec
    new = w.sread(ins.operands[1], 64) & saved
    w.s[EXEC_LO], w.s[EXEC_LO + 1] = new & U32, new >> 32
    w.swrite(ins.operands[0], saved, 64)
    w.scc = int(new != 0)


# --- program control (SOPP) --------------------------------------------------------------------------------------
def simm16(ins) -> int:
    return sext16(ins.words[0] & 0xFFFF)


def branch_target(ins) -> int:
    """Byte address a SOPP branch jumps to: PC of the next instruction + 4 * simm16."""
    return ins.addr + 4 + 4 * simm16(ins)


@define("s_branch", BRANCH, "PCODE S_BRANCH")
def s_branch(w, ins, ctx):
    w.pc = ctx.index_of(branch_target(ins), ins)


_CONDITIONS = {
    "scc0": lambda w: w.scc == 0, "scc1": lambda w: w.scc == 1,
    "vccz": lambda w: w.vcc == 0, "vccnz": lambda w: w.vcc != 0,
    "execz": lambda w: w.exec == 0, "execnz": lambda w: w.exec != 0,
}
for _cond, _test in _CONDITIONS.items():
    @define(f"s_cbranch_{_cond}", BRANCH, "PCODE {NAME}")
    def _cbranch(w, ins, ctx, test=_test):
        if test(w):
            w.pc = ctx.index_of(branch_target(ins), ins)


@define("s_endpgm", SYNC, "ISA guide (s_endpgm: the wave ends; its outstanding stores complete)")
def s_endpgm(w, ins, ctx):
    ctx.drain(w)
    w.done = True


@define("s_barrier", SYNC, "ISA guide (s_barrier: all waves of the workgroup arrive before any continues)")
def s_barrier(w, ins, ctx):
    w.at_barrier = True


@define("s_nop", SYNC, "PCODE S_NOP (N+1 wait states)")
def s_nop(w, ins, ctx):
    w.wait_states += ins.operands[0].index  # the issue itself adds the last one


@define("s_setprio", SYNC, "ISA guide (s_setprio: a scheduling priority; no functional effect)")
def s_setprio(w, ins, ctx):
    pass


# s_waitcnt simm16 fields (gfx9): vmcnt [3:0] and [15:14], expcnt [6:4], lgkmcnt [11:8].
def waitcnt_fields(ins) -> tuple[int, int]:
    imm = ins.words[0] & 0xFFFF
    return (imm & 0xF) | ((imm >> 14) & 3) << 4, (imm >> 8) & 0xF


@define("s_waitcnt", SYNC, "PCODE S_WAITCNT + ISA guide (VMEM in order, LDS in order, SMEM out of order)")
def s_waitcnt(w, ins, ctx):
    vmcnt, lgkmcnt = waitcnt_fields(ins)
    ctx.wait(w, vmcnt, lgkmcnt)

