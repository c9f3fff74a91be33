"""The gfx950 FP8 matrix instructions v_mfma[_scale]_f32_{32x32x64,16x16x128}_f8f6f4 (fp8 / bf8 sources).

Register layouts (gfx950.md): lane l of A holds row l % M, its 32 bytes hold k = 16*G*(b // 16) + 16*(l // M) + b % 16
with G = 64 / M lane groups; B likewise with columns. 32x32 output: lane l, register r holds row
8*(r // 4) + 4*(l // 32) + r % 4, column l % 32; 16x16 output: row 4*(l // 16) + r, column l % 16.
The products of fp8 values are exact in float64; each MFMA sums them in float64 and adds C, rounding once to float32
(the hardware's internal order and rounding are undocumented: compare kernels with tolerances, not bits).

Scaled forms: each lane's scale byte (E8M0, 2^(e-127)) multiplies the 32 source bytes that lane holds, i.e. one
scale per 32 k-values of a row of A (column of B); the byte of the scale VGPR is op_sel[i] + 2 * op_sel_hi[i]
(i = 0 for A, 1 for B). Which lane's scale covers which k block is marked "(check)" in gfx950.md: a kernel that
gives every lane of a row the same scale is unaffected by that question.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import formats
from .errors import SimError
from .isa import MFMA, define
from .wave import LANES

SOURCE_REGS = 8  # 32 fp8 bytes per lane for A and for B
BYTES_PER_LANE = 4 * SOURCE_REGS


@dataclass(frozen=True)
class Shape:
    m: int  # rows of A = columns of B = rows and columns of D
    k: int
    passes: int
    out_regs: int

    @property
    def groups(self) -> int:
        return LANES // self.m

    def source_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(row or column, k) for each (lane, byte) of an A or B operand."""
        lane, byte = np.meshgrid(np.arange(LANES), np.arange(BYTES_PER_LANE), indexing="ij")
        k = 16 * self.groups * (byte // 16) + 16 * (lane // self.m) + byte % 16
        return lane % self.m, k

    def output_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(row, column) of D for each (register, lane)."""
        reg, lane = np.meshgrid(np.arange(self.out_regs), np.arange(LANES), indexing="ij")
        if self.m == 32:
            row = 8 * (reg // 4) + 4 * (lane // 32) + reg % 4
        else:
            row = 4 * (lane // 16) + reg
        return row, lane % self.m


SHAPES = {"32x32x64": Shape(32, 64, 16, 16), "16x16x128": Shape(16, 128, 8, 4)}
_INDEX = {name: (s.source_index(), s.output_index()) for name, s in SHAPES.items()}


def shape_of(name: str) -> Shape:
    return SHAPES[name.split("_")[-2]]


def _source_values(w, op, fmt: int) -> np.ndarray:
    """(64 lanes, 32) float64 values of an fp8 A or B operand."""
    if op.kind not in ("v", "a") or op.count != SOURCE_REGS:
        raise SimError(f"MFMA fp8 sources are 8 VGPRs or AGPRs, got {op.kind}[{op.count}]")
    regs = np.stack([w.vread(op, i) for i in range(SOURCE_REGS)], axis=1)  # (lanes, 8) uint32
    return formats.decode_fp8(regs.view(np.uint8).reshape(LANES, BYTES_PER_LANE), fmt)


def _scale(w, ins, op, which: int) -> np.ndarray:
    n = 3
    byte = ins.mods.get("op_sel", (0,) * n)[which] + 2 * ins.mods.get("op_sel_hi", (0,) * n)[which]
    codes = (w.vread(op) >> np.uint32(8 * byte)) & np.uint32(0xFF)
    return formats.e8m0_to_f64(codes)


def _mfma(w, ins, ctx, scaled: bool) -> None:
    shape_name = ins.name.split("_")[-2]
    shape = SHAPES[shape_name]
    (row_a, k_a), (row_d, col_d) = _INDEX[shape_name]
    d, a, b, c = ins.operands[:4]
    a_vals = _source_values(w, a, ins.mods.get("cbsz", 0))
    b_vals = _source_values(w, b, ins.mods.get("blgp", 0))
    if scaled:
        a_vals = a_vals * _scale(w, ins, ins.operands[4], 0)[:, None]
        b_vals = b_vals * _scale(w, ins, ins.operands[5], 1)[:, None]
    elif "op_sel" in ins.mods or "abid" in ins.mods:
        raise SimError(f"{ins.addr:#x}: op_sel / abid are not modelled on {ins.name}")
    A = np.zeros((shape.m, shape.k))
    B = np.zeros((shape.k, shape.m))
    A[row_a, k_a] = a_vals
    B[k_a, row_a] = b_vals
    acc = np.stack([w.vread(c, r) for r in range(shape.out_regs)]).view(np.float32) if c.kind != "imm" else \
        np.broadcast_to(np.float32(c.value), (shape.out_regs, LANES))
    D = (A @ B)[row_d, col_d] + acc.astype(np.float64)
    if ins.mods.get("clamp"):
        raise SimError(f"{ins.addr:#x}: clamp is not modelled on {ins.name}")
    with np.errstate(all="ignore"):
        out = D.astype(np.float32)
    for r in range(shape.out_regs):
        w.vwrite(d, out[r], r)


define("v_mfma_f32_32x32x64_f8f6f4 v_mfma_f32_16x16x128_f8f6f4", MFMA,
       "PCODE {NAME} (D = A*B + C) + gfx950.md layouts")(lambda w, ins, ctx: _mfma(w, ins, ctx, False))
define("v_mfma_scale_f32_32x32x64_f8f6f4 v_mfma_scale_f32_16x16x128_f8f6f4", MFMA,
       "PCODE V_MFMA_F32_* + gfx950.md scale rule (check)")(lambda w, ins, ctx: _mfma(w, ins, ctx, True))
