"""Software-managed hazards of gfx950 that the kernels must pad with s_nop (the hardware does not interlock them).

Wait states are counted as LLVM's GCNHazardRecognizer counts them: every issued instruction is one, `s_nop N`
is N+1. Rules (producer -> consumer: wait states), from the gfx950 reference notes and LLVM 22:
  MFMA with P passes writes a VGPR -> any non-MFMA instruction, or an MFMA's A/B operand, reads it:
      16 passes: 20, 8 passes: 12, 4 passes: 8. An MFMA accumulating into exactly the same C/D needs none.
  VALU writes a VGPR -> an MFMA reads it: 2.
  transcendental (v_exp/v_log/v_rcp) writes a VGPR -> a VALU reads it: 1.
  VALU writes a VGPR -> v_permlane{16,32}_swap reads it: 2.
  SALU writes M0 -> a direct-to-LDS buffer load: 1.
Violations do not fault on the hardware: they read stale data, so this is checked statically.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_NOP = 16  # wait states of the longest s_nop (s_nop 15)
MFMA_PASSES = {"v_mfma_f32_32x32x64_f8f6f4": 16, "v_mfma_f32_16x16x128_f8f6f4": 8,
               "v_mfma_scale_f32_32x32x64_f8f6f4": 16, "v_mfma_scale_f32_16x16x128_f8f6f4": 8}
MFMA_RESULT_WAIT = {16: 20, 8: 12, 4: 8}
VALU_TO_MFMA_WAIT = 2
TRANS_TO_VALU_WAIT = 1
VALU_TO_PERMLANE_WAIT = 2
M0_TO_LDS_DMA_WAIT = 1
TRANS_OPS = ("v_exp_f32", "v_log_f32", "v_rcp_f32")
# Instructions whose first operand is also read (read-modify-write of the destination).
DEST_ALSO_READ = ("v_fmac_f32", "v_permlane32_swap_b32", "v_permlane16_swap_b32")

_REG = re.compile(r"^(v|s|a)(?:(\d+)|\[(\d+):(\d+)\])$")


def split_operands(text: str) -> tuple[str, list[str]]:
    text = text.split("//")[0].strip()
    mnemonic, _, rest = text.partition(" ")
    ops = [o.strip() for o in rest.split(",")] if rest.strip() else []
    if ops:  # modifiers (offen, offset:..., op_sel:[...], lds) follow the last operand after a space
        ops[-1] = ops[-1].split(" ")[0]
    return mnemonic, ops


def regs_of(operand: str, file: str = "v") -> set[int]:
    m = _REG.match(operand)
    if not m or m.group(1) != file:
        return set()
    if m.group(2) is not None:
        return {int(m.group(2))}
    return set(range(int(m.group(3)), int(m.group(4)) + 1))


def _writes_reads(text: str) -> tuple[str, set[int], set[int], list[str]]:
    mnemonic, ops = split_operands(text)
    if mnemonic.startswith(("buffer_store", "global_store", "ds_write")) or mnemonic.startswith("s_"):
        writes, read_ops = set(), ops
    elif mnemonic.startswith(("v_", "ds_read", "buffer_load", "global_load", "ds_bpermute")):
        writes, read_ops = (regs_of(ops[0]) if ops else set()), ops[1:]
        if " lds" in text:  # direct-to-LDS load: no VGPR destination, the first operand is the address
            writes, read_ops = set(), ops
    else:
        writes, read_ops = set(), ops
    reads = set().union(*(regs_of(o) for o in read_ops)) if read_ops else set()
    if mnemonic in DEST_ALSO_READ or (mnemonic == "v_cvt_pk_fp8_f32"):
        reads |= writes  # the packed fp8 conversion keeps the other half of its destination
    return mnemonic, writes, reads, ops


@dataclass
class _Pending:
    regs: set[int]
    wait: int
    kind: str  # "mfma", "valu", "trans", "m0"
    mfma_dst: str = ""
    elapsed: int = 0


class Tracker:
    """Producers still inside their hazard window, and the padding a new instruction needs."""

    def __init__(self) -> None:
        self.pending: list[_Pending] = []

    def _needed(self, text: str) -> int:
        mnemonic, _, reads, ops = _writes_reads(text)
        is_mfma = mnemonic in MFMA_PASSES
        need = 0
        for p in self.pending:
            left = p.wait - p.elapsed
            if left <= 0:
                continue
            if p.kind == "m0":
                if " lds" in text:
                    need = max(need, left)
                continue
            if p.kind == "mfma":
                if is_mfma:
                    ab = regs_of(ops[1]) | regs_of(ops[2])
                    c_same = ops[3] == p.mfma_dst
                    c_overlap = bool(regs_of(ops[3]) & p.regs) and not c_same
                    if (ab & p.regs) or c_overlap:
                        need = max(need, left)
                elif reads & p.regs:
                    need = max(need, left)
                continue
            if not reads & p.regs:
                continue
            if p.kind == "valu" and (is_mfma or mnemonic.startswith("v_permlane")):
                need = max(need, left)
            elif p.kind == "trans" and mnemonic.startswith("v_"):
                need = max(need, left)
        return need

    def padding_before(self, text: str) -> list[int]:
        """s_nop wait-state counts (each at most MAX_NOP) to emit before `text`."""
        need = self._needed(text)
        pads = []
        while need > 0:
            pads.append(min(need, MAX_NOP))
            need -= pads[-1]
        return pads

    def issue(self, text: str) -> None:
        mnemonic, writes, _, ops = _writes_reads(text)
        states = int(ops[0], 0) + 1 if mnemonic == "s_nop" else 1
        for p in self.pending:
            p.elapsed += states
        self.pending = [p for p in self.pending if p.elapsed < p.wait]
        if mnemonic in MFMA_PASSES:
            self.pending.append(_Pending(writes, MFMA_RESULT_WAIT[MFMA_PASSES[mnemonic]], "mfma", ops[0]))
        elif mnemonic in TRANS_OPS:
            self.pending.append(_Pending(writes, max(TRANS_TO_VALU_WAIT, VALU_TO_MFMA_WAIT), "trans"))
            self.pending.append(_Pending(writes, VALU_TO_MFMA_WAIT, "valu"))
        elif mnemonic.startswith("v_") and writes:
            self.pending.append(_Pending(writes, max(VALU_TO_MFMA_WAIT, VALU_TO_PERMLANE_WAIT), "valu"))
        elif mnemonic.startswith("s_") and ops and ops[0] == "m0":
            self.pending.append(_Pending(set(), M0_TO_LDS_DMA_WAIT, "m0"))

    def drain(self) -> int:
        """Wait states still owed to the longest open window (padded before labels and branches)."""
        return max((p.wait - p.elapsed for p in self.pending), default=0)


def check(text: str) -> list[str]:
    """Re-verify assembly text: every hazard window is padded. Labels and branches reset the tracking, which is
    sound because the emitter pads every open window before them. Returns one message per violation."""
    problems = []
    tracker = Tracker()
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("//")[0].strip()
        if not code or code.startswith("."):
            continue
        if code.endswith(":"):
            if tracker.drain() > 0:
                problems.append(f"line {number}: label {code} reached with an open hazard window")
            tracker = Tracker()
            continue
        need = tracker._needed(code)
        if need > 0:
            problems.append(f"line {number}: `{code}` needs {need} more wait state(s)")
        tracker.issue(code)
        if code.startswith(("s_branch", "s_cbranch", "s_endpgm")):
            if tracker.drain() > 0:
                problems.append(f"line {number}: branch with an open hazard window")
            tracker = Tracker()
    return problems
