"""The gfx950 BF16 matrix instructions v_mfma_f32_{32x32x16,16x16x32}_bf16 (used by the HIP kernels).

A and B: 4 VGPRs per lane = 8 bf16; lane l holds row (A) / column (B) l % M and k = 8 * (l // M) + i for element i
(the k labelling of slots is unobservable: slot s of A pairs with slot s of B). Outputs as the fp8 forms (mfma.py).
Products of bf16 values are exact in float64; each MFMA sums them in float64 and adds C, rounding once to float32.
"""

from __future__ import annotations

import numpy as np

from . import mfma
from .errors import SimError
from .isa import MFMA, define
from .wave import LANES

SOURCE_REGS = 4
ELEMENTS = 2 * SOURCE_REGS
# name -> shape; 8 passes (32x32x16) and 4 passes (16x16x32) in LLVM's gfx950 scheduling model (gfx950.md).
BF16_SHAPES = {"32x32x16": mfma.Shape(32, 16, 8, 16), "16x16x32": mfma.Shape(16, 32, 4, 4)}
mfma.SHAPES.update(BF16_SHAPES)  # the hazard distances (mfma.required_wait_states) read this table


def _source_index(shape: mfma.Shape) -> tuple[np.ndarray, np.ndarray]:
    lane, element = np.meshgrid(np.arange(LANES), np.arange(ELEMENTS), indexing="ij")
    return lane % shape.m, ELEMENTS * (lane // shape.m) + element


_INDEX = {name: (_source_index(s), s.output_index()) for name, s in BF16_SHAPES.items()}


def _bf16_values(w, op) -> np.ndarray:
    """(64 lanes, 8) float64 values of a bf16 A or B operand."""
    if op.kind not in ("v", "a") or op.count != SOURCE_REGS:
        raise SimError(f"MFMA bf16 sources are {SOURCE_REGS} VGPRs or AGPRs, got {op.kind}[{op.count}]")
    regs = np.stack([w.vread(op, i) for i in range(SOURCE_REGS)], axis=1)  # (lanes, 4) uint32
    halves = regs.view(np.uint16).reshape(LANES, ELEMENTS).astype(np.uint32) << np.uint32(16)
    return halves.view(np.float32).astype(np.float64)


def _mfma_bf16(w, ins, ctx) -> None:
    name = ins.name.split("_")[-2]
    shape = BF16_SHAPES[name]
    (row_a, k_a), (row_d, col_d) = _INDEX[name]
    if any(ins.mods.get(m) for m in ("cbsz", "abid", "blgp", "clamp")) or "op_sel" in ins.mods:
        raise SimError(f"{ins.addr:#x}: cbsz / abid / blgp / op_sel / clamp are not modelled on {ins.name}")
    d, a, b, c = ins.operands[:4]
    A = np.zeros((shape.m, shape.k))
    B = np.zeros((shape.k, shape.m))
    A[row_a, k_a] = _bf16_values(w, a)
    B[k_a, row_a] = _bf16_values(w, b)
    acc = np.stack([w.vread(c, r) for r in range(shape.out_regs)]).view(np.float32) if c.kind != "imm" else \
        np.broadcast_to(np.float32(c.value), (shape.out_regs, LANES))
    with np.errstate(all="ignore"):
        out = ((A @ B)[row_d, col_d] + acc.astype(np.float64)).astype(np.float32)
    for r in range(shape.out_regs):
        w.vwrite(d, out[r], r)


define("v_mfma_f32_32x32x16_bf16 v_mfma_f32_16x16x32_bf16", MFMA,
       "PCODE {NAME} (D = A*B + C) + gfx950.md output layouts")(_mfma_bf16)
