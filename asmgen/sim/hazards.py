"""Software-managed hazards of gfx950, checked as each instruction issues.

The rules are LLVM 22's GCNHazardRecognizer for gfx950 as the kernel generator's table states them
(asmgen/gfx950/hazards.py: RULES and `required_wait`, held to llc-22 by asmgen/tests/test_gfx950_hazards.py);
this module derives each rule's inputs independently, from the decoded instruction (registers read and written,
modifiers, unit), so a generator that mis-parses its own text is still caught here. Wait states are counted per
wave: each instruction 1, `s_nop N` N+1. A violation raises HazardError naming the rule, both instructions and
the distance (on the hardware it would read stale data).
"""

from __future__ import annotations

from asmgen.gfx950.hazards import (
    DEST_ALSO_READ,
    M0,
    MFMA_PASSES,
    PERMLANE_SWAPS,
    READ_LANE,
    TRANS_OPS,
    Facts,
    required_wait,
    window,
)

from . import isa
from .codeobject import Instruction
from .errors import HazardError
from .mfma import shape_of

AGPR_BASE = 512  # AGPR n is unified-file register 512 + n in the register sets (VGPRs are 0-511)
NO_DESTINATION = ("s_cmp", "s_waitcnt", "s_nop", "s_setprio", "s_barrier", "s_endpgm")


def _vector(ops) -> frozenset[int]:
    return frozenset(r + (AGPR_BASE if op.kind == "a" else 0) for op in ops if op.kind in ("v", "a") for r in op.regs)


def _scalar(ops) -> frozenset[int]:
    return frozenset(r for op in ops if op.kind == "s" for r in op.regs)


def facts_of(ins: Instruction, unit: str) -> Facts:
    """The hazard-relevant reads and writes of a decoded instruction."""
    ops, name = ins.operands, ins.name
    if unit == isa.MFMA:
        passes = MFMA_PASSES.get(name) or shape_of(name).passes
        return Facts("mfma", name, vdst=_vector(ops[:1]), vsrc=_vector(ops[1:4]), passes=passes,
                     mfma_ab=_vector(ops[1:3]), mfma_c=_vector(ops[3:4]))
    if unit == isa.SALU:
        writes = _scalar(ops[:1]) if ops and not name.startswith(NO_DESTINATION) else frozenset()
        return Facts("salu", name, sdst=writes, ssrc=_scalar(ops[1:] if writes else ops))
    if unit == isa.SMEM:
        return Facts("smem", name, sdst=_scalar(ops[:1]), ssrc=_scalar(ops[1:]))
    if unit == isa.LDS:
        if "write" in name:
            return Facts("lds", name, vsrc=_vector(ops))
        return Facts("lds", name, vdst=_vector(ops[:1]), vsrc=_vector(ops[1:]))
    if unit == isa.VMEM_LOAD and ins.mods.get("lds"):
        return Facts("lds_dma", name, vsrc=_vector(ops), ssrc=_scalar(ops) | M0)
    if unit == isa.VMEM_STORE:
        return Facts("vmem", name, vsrc=_vector(ops), ssrc=_scalar(ops))
    if unit == isa.VMEM_LOAD:
        return Facts("vmem", name, vdst=_vector(ops[:1]), vsrc=_vector(ops[1:]), ssrc=_scalar(ops[1:]))
    if unit != isa.VALU:
        return Facts("other", name)
    dst, srcs = ops[:1], ops[1:]
    vdst, vsrc = _vector(dst), _vector(srcs)
    if name in DEST_ALSO_READ:
        vsrc |= vdst
    if name in PERMLANE_SWAPS:
        vdst |= vsrc
    if name.startswith("v_pk_"):  # LLVM reads src0's op_sel_hi bit (default 1) as a destination select
        dst_sel = ins.mods.get("op_sel_hi", (1,))[0] == 1
    else:
        op_sel = ins.mods.get("op_sel", ())
        dst_sel = len(op_sel) == len(srcs) + 1 and bool(op_sel[-1])
    return Facts("valu", name, vdst=vdst, vsrc=vsrc, sdst=_scalar(dst), ssrc=_scalar(srcs),
                 lane_src=_vector(srcs[:1]) if name in READ_LANE else frozenset(),
                 lane_select=_scalar(srcs[1:2]) if name in ("v_readlane_b32", "v_writelane_b32") else frozenset(),
                 trans=name in TRANS_OPS, dst_sel=dst_sel)


def check(ins: Instruction, consumer: Facts, recent: list[tuple[int, Facts, Instruction, int]], now: int) -> None:
    """Raise HazardError if `ins` issues too close to a producer in `recent` ((wait states at issue, facts,
    instruction, window) of the wave's instructions still inside their windows)."""
    for issued, producer, p_ins, _ in recent:
        required, rule = required_wait(producer, consumer)
        between = now - issued - 1
        if between < required:
            prefix = "MFMA hazard" if producer.kind == "mfma" else "hazard"
            raise HazardError(f"{prefix} ({rule}): {p_ins.addr:#x} `{p_ins.text}` -> {ins.addr:#x} `{ins.text}` "
                              f"after {between} wait states; {required} required")


__all__ = ["Facts", "check", "facts_of", "window"]
