"""Short software-managed hazards of gfx950 besides MFMA results, checked as each instruction issues.

From LLVM 22's GCNHazardRecognizer for gfx950 (the rules the kernel generator pads, asmgen/gfx950/hazards.py):
  a VALU writes a VGPR -> an MFMA reads it: 2 wait states;
  a VALU writes a VGPR -> v_permlane{16,32}_swap reads it: 2;
  a transcendental (v_exp / v_log / v_rcp) writes a VGPR -> a VALU reads it: 1;
  an SALU writes M0 -> a direct-to-LDS buffer load: 1.
The MFMA-result distances live in machine.py (they depend on the producer's passes).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import isa
from .codeobject import Instruction
from .errors import HazardError
from .wave import M0

VALU_TO_MFMA = 2
VALU_TO_PERMLANE = 2
TRANS_TO_VALU = 1
M0_TO_LDS_DMA = 1
WINDOW = max(VALU_TO_MFMA, VALU_TO_PERMLANE, TRANS_TO_VALU, M0_TO_LDS_DMA)
TRANSCENDENTAL = {"v_exp_f32", "v_log_f32", "v_rcp_f32"}
PERMLANE = {"v_permlane32_swap_b32", "v_permlane16_swap_b32"}


@dataclass(frozen=True)
class Producer:
    ins: Instruction
    regs: frozenset[tuple[str, int]]
    trans: bool = False
    writes_m0: bool = False


def producer(ins: Instruction, unit: str) -> Producer | None:
    """What an instruction leaves behind that a close follower may not read yet."""
    if unit == isa.VALU and ins.operands and ins.operands[0].kind in ("v", "a"):
        regs = {(op.kind, r) for op in ins.operands[:2 if ins.name in PERMLANE else 1] for r in op.regs}
        return Producer(ins, frozenset(regs), trans=ins.name in TRANSCENDENTAL)
    if unit == isa.SALU and ins.operands and ins.operands[0].kind == "s" and M0 in ins.operands[0].regs:
        return Producer(ins, frozenset(), writes_m0=True)
    return None


def consumer_rules(ins: Instruction, unit: str) -> tuple[int, int, bool]:
    """(wait states after a VALU write, after a transcendental write, after an M0 write) this instruction needs."""
    after_valu = VALU_TO_MFMA if unit == isa.MFMA else VALU_TO_PERMLANE if ins.name in PERMLANE else 0
    after_trans = TRANS_TO_VALU if unit in (isa.VALU, isa.MFMA) else 0
    return after_valu, after_trans, bool(ins.mods.get("lds"))


def check(ins: Instruction, rules: tuple[int, int, bool], reads: frozenset[tuple[str, int]],
          recent: list[tuple[int, Producer]], now: int) -> None:
    after_valu, after_trans, lds_dma = rules
    for issued, p in recent:
        between = now - issued - 1
        if p.writes_m0:
            required = M0_TO_LDS_DMA if lds_dma else 0
        elif not (p.regs & reads):
            continue
        else:
            required = max(after_valu, after_trans if p.trans else 0)
        if between < required:
            raise HazardError(f"hazard: {p.ins.addr:#x} `{p.ins.text}` -> {ins.addr:#x} `{ins.text}` after "
                              f"{between} wait states; {required} required")
