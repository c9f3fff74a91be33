"""Vector ALU instructions (VOP1, VOP2, VOP3, VOP3P, VOPC), 64 lanes at a time with numpy.

Float operations run in float32 numpy arithmetic (IEEE round to nearest even, as the hardware); fused multiply-adds
are rounded once, correctly (`fma_f32`); FP32 denormal inputs and results are flushed to zero where the kernel
descriptor's FP32 denormal mode says so (the default of LLVM's assembler flushes both).
"""

from __future__ import annotations

import numpy as np

from . import formats
from .errors import SimError
from .isa import VALU, define
from .wave import LANES, int_to_mask, mask_to_int

F32_LIMITS_I32 = (-2.0**31, 2.0**31 - 1)
F32_LIMITS_U32 = (0.0, 2.0**32 - 1)
SHIFT_MASK = np.uint32(31)
OUTPUT_SCALE = {"mul": {2: 2.0, 4: 4.0}, "div": {2: 0.5}}


def _float_result(w, ins, x: np.ndarray) -> np.ndarray:
    """Apply the VOP3 output modifiers omod (mul:2, mul:4, div:2) and clamp (to [0, 1]) to a float32 result."""
    x = np.asarray(x, dtype=np.float32)
    for key, scales in OUTPUT_SCALE.items():
        if key in ins.mods:
            x = (x * np.float32(scales[ins.mods[key]])).astype(np.float32)
    if ins.mods.get("clamp"):
        x = np.clip(x, np.float32(0), np.float32(1))
    return formats.flush_denormals(x) if w.flush_results else x


def _no_int_modifiers(ins) -> None:
    if ins.mods.get("clamp") or any(op.neg or op.abs for op in ins.operands):
        raise SimError(f"{ins.addr:#x}: clamp / neg / abs are not modelled on integer operation {ins.name}")


def _float_op(name: str, fn, arity: int, source: str | None = None) -> None:
    @define(name, VALU, source or "PCODE {NAME}")
    def op(w, ins, ctx):
        srcs = [w.fread(o) for o in ins.operands[1:1 + arity]]
        with np.errstate(all="ignore"):
            w.vwrite(ins.operands[0], _float_result(w, ins, fn(*srcs)))


def fma_f32(a, b, c) -> np.ndarray:
    """fl32(a*b + c) rounded once (round to nearest even), for float32 arrays.

    a*b is exact in float64; s = fl64(a*b + c) may round, and rounding s again to float32 is wrong only where s
    lands exactly on a float32 midpoint while the exact sum is not (float64 rounding never crosses a float32
    midpoint, which float64 represents). There the exact error of s (TwoSum) says which neighbour is nearer."""
    with np.errstate(all="ignore"):
        p, c64 = a.astype(np.float64) * b.astype(np.float64), c.astype(np.float64)
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)
        r = s.astype(np.float32)
        r64 = r.astype(np.float64)
        other = np.nextafter(r, np.where(s > r64, np.float32(np.inf), np.float32(-np.inf)))
        tie = np.isfinite(s) & (s != r64) & ((r64 + other.astype(np.float64)) / 2 == s) & (err != 0)
        toward_other = np.sign(err) == np.sign(other.astype(np.float64) - r64)
        return np.where(tie & toward_other, other, r).astype(np.float32)


def _med3(a, b, c):
    # PCODE V_MED3_F32: any NaN -> min3; else drop the maximum and take the max of the other two.
    mx = np.fmax(np.fmax(a, b), c)
    med = np.where(mx == a, np.fmax(b, c), np.where(mx == b, np.fmax(a, c), np.fmax(a, b)))
    nan = np.isnan(a) | np.isnan(b) | np.isnan(c)
    return np.where(nan, np.fmin(np.fmin(a, b), c), med)


_float_op("v_add_f32", lambda a, b: a + b, 2)
_float_op("v_sub_f32", lambda a, b: a - b, 2)
_float_op("v_mul_f32", lambda a, b: a * b, 2)
_float_op("v_max_f32", np.fmax, 2, "PCODE {NAME} (non-IEEE-signalling path: a NaN operand yields the other)")
_float_op("v_min_f32", np.fmin, 2, "PCODE {NAME} (non-IEEE-signalling path: a NaN operand yields the other)")
_float_op("v_fma_f32", fma_f32, 3)
_float_op("v_max3_f32", lambda a, b, c: np.fmax(np.fmax(a, b), c), 3)
_float_op("v_med3_f32", _med3, 3)


def _rounded_from_f64(fn):
    """fn in float64, rounded once to float32: numpy's float32 transcendentals take CPU-specific SIMD paths (SVML
    on AVX-512) whose last bit differs between machines, so the simulator's results would too."""
    return lambda a: fn(a.astype(np.float64)).astype(np.float32)


_float_op("v_exp_f32", lambda a: formats.flush_denormals(_rounded_from_f64(np.exp2)(a)), 1,
          "PCODE {NAME} + gfx950.md (results below 2^-126 flush to 0)")
_float_op("v_log_f32", _rounded_from_f64(np.log2), 1)
_float_op("v_rcp_f32", lambda a: formats.flush_denormals(np.float32(1) / a), 1,
          "PCODE {NAME} (exact reciprocal rounded once; hardware is within 1 ulp)")
_float_op("v_floor_f32", np.floor, 1)
_float_op("v_rndne_f32", np.rint, 1)


@define("v_fmac_f32", VALU, "PCODE {NAME}")
def v_fmac_f32(w, ins, ctx):
    d = ins.operands[0]
    w.vwrite(d, _float_result(w, ins, fma_f32(w.fread(ins.operands[1]), w.fread(ins.operands[2]), w.fread(d))))


@define("v_ldexp_f32", VALU, "PCODE {NAME}")
def v_ldexp_f32(w, ins, ctx):
    x, e = w.fread(ins.operands[1]), w.vread(ins.operands[2]).view(np.int32)
    with np.errstate(all="ignore"):
        w.vwrite(ins.operands[0], _float_result(w, ins, np.ldexp(x, np.clip(e, -512, 512))))


# --- conversions -------------------------------------------------------------------------------------------------
def _convert(name, fn, float_source: bool):
    @define(name, VALU, "PCODE {NAME}")
    def op(w, ins, ctx):
        src = ins.operands[1]
        x = w.fread(src) if float_source else w.vread(src)
        with np.errstate(all="ignore"):
            w.vwrite(ins.operands[0], fn(x))


def _f32_to_int(x, limits, dtype):
    t = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0))
    return np.clip(t, *limits).astype(np.int64).astype(dtype).view(np.uint32)


_convert("v_cvt_f32_i32", lambda x: x.view(np.int32).astype(np.float32), float_source=False)
_convert("v_cvt_f32_u32", lambda x: x.astype(np.float32), float_source=False)
_convert("v_cvt_i32_f32", lambda x: _f32_to_int(x, F32_LIMITS_I32, np.int32), float_source=True)
_convert("v_cvt_u32_f32", lambda x: _f32_to_int(x, F32_LIMITS_U32, np.uint32), float_source=True)


@define("v_cvt_pk_bf16_f32", VALU, "PCODE {NAME}")
def v_cvt_pk_bf16_f32(w, ins, ctx):
    lo, hi = (formats.f32_to_bf16(w.fread(op)) for op in ins.operands[1:3])
    w.vwrite(ins.operands[0], lo | hi << np.uint32(16))


@define("v_cvt_pk_fp8_f32", VALU, "PCODE {NAME} (op_sel[2] writes the high half; beyond 464 -> NaN, check)")
def v_cvt_pk_fp8_f32(w, ins, ctx):
    lo, hi = (formats.f32_to_e4m3(w.fread(op)) for op in ins.operands[1:3])
    packed = lo | hi << np.uint32(8)
    old = w.vread(ins.operands[0])
    if ins.mods.get("op_sel", (0, 0, 0))[2]:
        value = (old & np.uint32(0x0000FFFF)) | packed << np.uint32(16)
    else:
        value = (old & np.uint32(0xFFFF0000)) | packed
    w.vwrite(ins.operands[0], value)


@define("v_cvt_pk_u8_f32", VALU, "PCODE {NAME} (f32_to_u8: round to nearest even, saturate to [0, 255], NaN -> 0; "
        "check)")
def v_cvt_pk_u8_f32(w, ins, ctx):
    with np.errstate(all="ignore"):
        x = w.fread(ins.operands[1])
        byte = np.where(np.isnan(x), 0, np.clip(np.rint(x), 0, 255)).astype(np.uint32)
    shift = (w.vread(ins.operands[2]) & np.uint32(3)) * np.uint32(8)
    old = w.vread(ins.operands[3])
    w.vwrite(ins.operands[0], (old & ~(np.uint32(0xFF) << shift)) | (byte << shift))


# --- integer and bitwise -----------------------------------------------------------------------------------------
def _int_op(name: str, fn, arity: int) -> None:
    @define(name, VALU, "PCODE {NAME}")
    def op(w, ins, ctx):
        _no_int_modifiers(ins)
        srcs = [w.vread(o).astype(np.uint64) for o in ins.operands[1:1 + arity]]
        w.vwrite(ins.operands[0], (fn(*srcs) & np.uint64(0xFFFFFFFF)).astype(np.uint32))


SHIFT_MASK_64 = np.uint64(31)  # shift amounts use the low 5 bits
ONE_64 = np.uint64(1)
_int_op("v_lshlrev_b32", lambda a, b: b << (a & SHIFT_MASK_64), 2)
_int_op("v_lshrrev_b32", lambda a, b: b >> (a & SHIFT_MASK_64), 2)
_int_op("v_and_b32", lambda a, b: a & b, 2)
_int_op("v_or_b32", lambda a, b: a | b, 2)
_int_op("v_xor_b32", lambda a, b: a ^ b, 2)
_int_op("v_add_u32", lambda a, b: a + b, 2)
_int_op("v_sub_u32", lambda a, b: a - b + np.uint64(1 << 32), 2)
_int_op("v_mul_lo_u32", lambda a, b: a * b, 2)
_int_op("v_mul_u32_u24", lambda a, b: (a & np.uint64(0xFFFFFF)) * (b & np.uint64(0xFFFFFF)), 2)
_int_op("v_mad_u32_u24", lambda a, b, c: (a & np.uint64(0xFFFFFF)) * (b & np.uint64(0xFFFFFF)) + c, 3)
_int_op("v_lshl_add_u32", lambda a, b, c: ((a << (b & SHIFT_MASK_64)) & np.uint64(0xFFFFFFFF)) + c, 3)
_int_op("v_add_lshl_u32", lambda a, b, c: ((a + b) & np.uint64(0xFFFFFFFF)) << (c & SHIFT_MASK_64), 3)
_int_op("v_lshl_or_b32", lambda a, b, c: (a << (b & SHIFT_MASK_64)) | c, 3)
_int_op("v_and_or_b32", lambda a, b, c: (a & b) | c, 3)
_int_op("v_bfe_u32", lambda a, b, c: (a >> (b & SHIFT_MASK_64)) & ((ONE_64 << (c & SHIFT_MASK_64)) - ONE_64), 3)


@define("v_ashrrev_i32", VALU, "PCODE {NAME}")
def v_ashrrev_i32(w, ins, ctx):
    _no_int_modifiers(ins)
    shift, x = w.vread(ins.operands[1]) & SHIFT_MASK, w.vread(ins.operands[2]).view(np.int32)
    w.vwrite(ins.operands[0], (x >> shift.astype(np.int32)).view(np.uint32))


SIGN_SOURCE_BYTES = [1, 3, 5, 7]  # selectors 8-11 replicate the sign bit of these bytes
SELECT_ONES = 13  # selector 12 gives 0x00, 13 and above 0xff


@define("v_perm_b32", VALU, "PCODE {NAME}")
def v_perm_b32(w, ins, ctx):
    s0, s1, s2 = (w.vread(o) for o in ins.operands[1:4])
    data = np.stack([s1, s0], axis=1).view(np.uint8).reshape(LANES, 8)  # {S0, S1}: S1 is the low dword
    sign = (data[:, SIGN_SOURCE_BYTES] >> 7) * np.uint8(0xFF)
    # one candidate byte per selector value 0..13: the 8 data bytes, 4 sign bytes, 0x00, 0xff
    candidates = np.concatenate([data, sign, np.zeros((LANES, 1), np.uint8), np.full((LANES, 1), 0xFF, np.uint8)],
                                axis=1)
    selectors = np.minimum(np.ascontiguousarray(s2).view(np.uint8).reshape(LANES, 4), SELECT_ONES)
    picked = candidates[np.arange(LANES)[:, None], selectors]
    w.vwrite(ins.operands[0], np.ascontiguousarray(picked).view(np.uint32)[:, 0])


@define("v_mov_b32", VALU, "PCODE {NAME}")
def v_mov_b32(w, ins, ctx):
    src = ins.operands[1]
    w.vwrite(ins.operands[0], w.fread(src, arithmetic=False).view(np.uint32) if (src.neg or src.abs) else
             w.vread(src))


@define("v_cndmask_b32", VALU, "PCODE {NAME}")
def v_cndmask_b32(w, ins, ctx):
    d, a, b, cond = ins.operands
    a_val = w.fread(a, arithmetic=False).view(np.uint32) if (a.neg or a.abs) else w.vread(a)
    b_val = w.fread(b, arithmetic=False).view(np.uint32) if (b.neg or b.abs) else w.vread(b)
    w.vwrite(d, np.where(int_to_mask(w.sread(cond, 64)), b_val, a_val))


# --- comparisons to VCC or an SGPR pair ---------------------------------------------------------------------------
_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
        "ge": np.greater_equal}
for _cond, _fn in list(_CMP.items()) + [("neq", lambda a, b: ~np.equal(a, b)), ("lg", lambda a, b: (a < b) | (a > b))]:
    for _type in ("f32", "u32", "i32"):
        if _type == "f32" and _cond == "ne" or _type != "f32" and _cond in ("neq", "lg"):
            continue  # LLVM spells float inequality v_cmp_neq_f32 (unordered) / v_cmp_lg_f32 (ordered)

        @define(f"v_cmp_{_cond}_{_type}", VALU, "PCODE {NAME} (inactive lanes write 0)")
        def _vcmp(w, ins, ctx, fn=_fn, kind=_type):
            a, b = ins.operands[1:3]
            if kind == "f32":
                x, y = w.fread(a), w.fread(b)
            else:
                _no_int_modifiers(ins)
                x, y = w.vread(a), w.vread(b)
                if kind == "i32":
                    x, y = x.view(np.int32), y.view(np.int32)
            w.swrite(ins.operands[0], mask_to_int(fn(x, y) & w.exec_mask), 64)


# --- lane access -------------------------------------------------------------------------------------------------
@define("v_readfirstlane_b32", VALU, "PCODE {NAME}")
def v_readfirstlane_b32(w, ins, ctx):
    exec_ = w.exec
    lane = (exec_ & -exec_).bit_length() - 1 if exec_ else 0
    w.swrite(ins.operands[0], int(w.vread(ins.operands[1])[lane]))


@define("v_readlane_b32", VALU, "PCODE {NAME}")
def v_readlane_b32(w, ins, ctx):
    lane = w.sread(ins.operands[2]) & (LANES - 1)
    w.swrite(ins.operands[0], int(w.vread(ins.operands[1])[lane]))


def _swap_halves(w, ins, group: int) -> None:
    """PCODE V_PERMLANE{16,32}_SWAP: the upper `group` lanes of each 2*group block of VDST trade places with the
    lower `group` lanes of SRC0 (applies to all lanes, as the pseudocode has no EXEC test)."""
    d, s = ins.operands[0], ins.operands[1]
    if d.kind != "v" or s.kind != "v":
        raise SimError(f"{ins.addr:#x}: {ins.name} takes VGPR operands")
    vd, vs = w.v[d.index].reshape(-1, 2, group), w.v[s.index].reshape(-1, 2, group)
    lower_src = vs[:, 0].copy()
    vs[:, 0] = vd[:, 1]
    vd[:, 1] = lower_src


define("v_permlane32_swap_b32", VALU, "PCODE {NAME}")(lambda w, ins, ctx: _swap_halves(w, ins, 32))
define("v_permlane16_swap_b32", VALU, "PCODE {NAME}")(lambda w, ins, ctx: _swap_halves(w, ins, 16))


@define("v_accvgpr_read_b32 v_accvgpr_write_b32", VALU,
        "ISA guide (a 32-bit move between the VGPR and AGPR files; VOP3P opcodes V_ACCVGPR_READ/WRITE, no pseudocode)")
def v_accvgpr_move(w, ins, ctx):
    w.vwrite(ins.operands[0], w.vread(ins.operands[1]))


# --- packed FP32 (VOP3P on 64-bit register pairs) ----------------------------------------------------------------
def _packed_source(w, ins, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(value for the low result, value for the high result) of source i, after op_sel / op_sel_hi / neg."""
    op = ins.operands[1 + i]
    if op.kind == "imm":
        halves = (w.vread(op), w.vread(op))  # a constant feeds both halves
    else:
        halves = (w.vread(op, 0), w.vread(op, 1))
    n = len(ins.operands) - 1
    op_sel = ins.mods.get("op_sel", (0,) * n)
    op_sel_hi = ins.mods.get("op_sel_hi", (1,) * n)
    lo, hi = halves[op_sel[i]].view(np.float32), halves[op_sel_hi[i]].view(np.float32)
    if w.flush_inputs:
        lo, hi = formats.flush_denormals(lo), formats.flush_denormals(hi)
    if ins.mods.get("neg_lo", (0,) * n)[i]:
        lo = -lo
    if ins.mods.get("neg_hi", (0,) * n)[i]:
        hi = -hi
    return lo, hi


def _packed_op(name: str, fn, arity: int) -> None:
    @define(name, VALU, "PCODE {NAME}")
    def op(w, ins, ctx):
        srcs = [_packed_source(w, ins, i) for i in range(arity)]
        d = ins.operands[0]
        with np.errstate(all="ignore"):
            lo = _float_result(w, ins, fn(*(s[0] for s in srcs)))
            hi = _float_result(w, ins, fn(*(s[1] for s in srcs)))
        w.vwrite(d, lo, 0)
        w.vwrite(d, hi, 1)


_packed_op("v_pk_mul_f32", lambda a, b: a * b, 2)
_packed_op("v_pk_add_f32", lambda a, b: a + b, 2)
_packed_op("v_pk_fma_f32", fma_f32, 3)
