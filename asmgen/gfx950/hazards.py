"""Software-managed hazards of gfx950 that the kernels must pad with s_nop (the hardware does not interlock them).

Wait states are counted as LLVM's GCNHazardRecognizer counts them: every issued instruction is one, `s_nop N`
is N+1. The rules are LLVM 22's for gfx950 (the hazard recognizer run by `llc -mcpu=gfx950`), each one an entry
of RULES; asmgen/tests/test_gfx950_hazards.py has llc-22 pad a machine-IR instance of every rule and checks that
the table asks for at least as many wait states. Producer -> consumer (wait states):
  MFMA of N passes writes a VGPR (16 passes: 20, 8: 12, 4: 8 = N + 4) -> a VALU, LDS or VMEM instruction reads it,
      or writes it (write after write), or an MFMA reads it as A/B; an MFMA reading it as C needs N + 2 (18) unless
      its C is exactly that MFMA's D (back-to-back accumulation: 0).
  MFMA of N passes reads C -> a VALU, LDS or VMEM instruction overwrites a C register: N - 1 (15).
  VALU writes a VGPR -> an MFMA reads it: 2; -> v_permlane{16,32}_swap reads it: 2; -> v_readlane /
      v_readfirstlane reads it: 1.
  VALU writes an SGPR or VCC -> a VALU reads it (v_cndmask's mask included): 2; -> a VMEM instruction reads it
      (soffset, resource): 5; -> v_readlane / v_writelane takes it as lane select: 4.
  VALU writes EXEC -> an MFMA, v_readlane, v_readfirstlane or v_writelane: 4.
  transcendental (v_exp/v_log/v_rcp/...) writes a VGPR -> a non-transcendental VALU reads it: 1.
  VALU with a destination op_sel bit, as LLVM reads the modifier (VOP3 op_sel of the destination, e.g.
      v_cvt_pk_fp8_f32 op_sel:[0,0,1]; and every VOP3P v_pk_* op whose first source has op_sel_hi = 1) writes a
      VGPR -> a VALU reads it: 1.
  SALU writes M0 -> a direct-to-LDS buffer load: 1.
  Soft clauses (the code objects allow XNACK): in a run of consecutive SMEM (or VMEM) loads no load may write a
      register another load of the run reads; a non-memory instruction breaks the run (checked, not padded).
Violations do not fault on the hardware: they read stale data, so this is checked statically (and the simulator
raises on the same rules at run time, asmgen/sim/hazards.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_NOP = 16  # wait states of the longest s_nop (s_nop 15)
MFMA_PASSES = {"v_mfma_f32_32x32x64_f8f6f4": 16, "v_mfma_f32_16x16x128_f8f6f4": 8,
               "v_mfma_scale_f32_32x32x64_f8f6f4": 16, "v_mfma_scale_f32_16x16x128_f8f6f4": 8,
               "v_mfma_f32_32x32x16_bf16": 8, "v_mfma_f32_16x16x32_bf16": 4}
TRANS_OPS = ("v_exp_f32", "v_log_f32", "v_rcp_f32", "v_rsq_f32", "v_sqrt_f32", "v_sin_f32", "v_cos_f32")
PERMLANE_SWAPS = ("v_permlane32_swap_b32", "v_permlane16_swap_b32")
READ_LANE = ("v_readlane_b32", "v_readfirstlane_b32")
WRITE_LANE = ("v_writelane_b32",)
# Instructions whose first operand is also read (read-modify-write of the destination).
DEST_ALSO_READ = ("v_fmac_f32", "v_cvt_pk_fp8_f32") + PERMLANE_SWAPS

# Wait states per rule (the names the LLVM test refers to).
RULES = {
    "mfma_write_read": lambda passes: passes + 4,  # VALU / LDS / VMEM read, VALU write, MFMA A/B read
    "mfma_write_srcc": lambda passes: passes + 2,  # MFMA C overlapping (not equal to) the earlier D
    "mfma_srcc_overwrite": lambda passes: passes - 1,  # VALU / LDS / VMEM writes a register an MFMA read as C
    "valu_vgpr_mfma": 2,
    "valu_vgpr_permlane_swap": 2,
    "valu_vgpr_readlane": 1,
    "valu_sgpr_valu": 2,
    "valu_sgpr_vmem": 5,
    "valu_sgpr_lane_select": 4,
    "valu_exec_mfma_or_lane": 4,
    "trans_valu": 1,
    "dst_sel_valu": 1,
    "salu_m0_lds_dma": 1,
}
LONGEST = RULES["mfma_write_read"](max(MFMA_PASSES.values()))
VCC, EXEC, M0 = frozenset({106, 107}), frozenset({126, 127}), frozenset({124})
_SPECIAL_SGPRS = {"vcc": VCC, "vcc_lo": {106}, "vcc_hi": {107}, "exec": EXEC, "exec_lo": {126}, "exec_hi": {127},
                  "m0": M0}
_REG = re.compile(r"^-?(v|s|a)(?:(\d+)|\[(\d+):(\d+)\])$")
NO_DESTINATION = ("s_cmp", "s_cbranch", "s_branch", "s_waitcnt", "s_nop", "s_setprio", "s_barrier", "s_endpgm")


def split_operands(text: str) -> tuple[str, list[str]]:
    text = re.sub(r"\w+:\[[^\]]*\]", "", text.split("//")[0]).strip()  # op_sel:[...] and the like hold commas
    mnemonic, _, rest = text.partition(" ")
    ops = [o.strip() for o in rest.split(",")] if rest.strip() else []
    if ops:  # modifiers (offen, offset:..., op_sel:[...], lds) follow the last operand after a space
        ops[-1] = ops[-1].split(" ")[0]
    return mnemonic, ops


def regs_of(operand: str, file: str = "v") -> set[int]:
    m = _REG.match(operand)
    if not m or m.group(1) != file:
        if file == "s" and operand.lstrip("-") in _SPECIAL_SGPRS:
            return set(_SPECIAL_SGPRS[operand.lstrip("-")])
        return set()
    if m.group(2) is not None:
        return {int(m.group(2))}
    return set(range(int(m.group(3)), int(m.group(4)) + 1))


def _modifier(text: str, name: str) -> list[int] | None:
    m = re.search(name + r":\[([\d,]+)\]", text)
    return [int(x) for x in m.group(1).split(",")] if m else None


@dataclass(frozen=True)
class Facts:
    """What one instruction writes and reads, as the hazard rules see it."""
    kind: str  # "mfma", "valu", "salu", "smem", "lds", "vmem", "lds_dma", "other"
    mnemonic: str = ""
    vdst: frozenset[int] = frozenset()
    vsrc: frozenset[int] = frozenset()  # every VGPR read (explicit sources, read-modify-write destinations)
    sdst: frozenset[int] = frozenset()  # SGPRs written (VCC 106-107, M0 124, EXEC 126-127)
    ssrc: frozenset[int] = frozenset()
    passes: int = 0  # MFMA
    mfma_ab: frozenset[int] = frozenset()
    mfma_c: frozenset[int] = frozenset()
    lane_src: frozenset[int] = frozenset()  # v_readlane / v_readfirstlane: the VGPR read
    lane_select: frozenset[int] = frozenset()  # v_readlane / v_writelane: the lane-select SGPR
    trans: bool = False
    dst_sel: bool = False

    @property
    def valu(self) -> bool:  # LLVM counts MFMAs as VALU instructions
        return self.kind in ("valu", "mfma")


def required_wait(p: Facts, c: Facts) -> tuple[int, str]:
    """(wait states consumer `c` needs after producer `p`, the rule), (0, "") if none applies."""
    found = [(0, "")]
    if p.kind == "mfma":
        raw = RULES["mfma_write_read"](p.passes)
        if c.kind == "mfma":
            if c.mfma_ab & p.vdst:
                found.append((raw, "mfma_write_read"))
            if c.mfma_c & p.vdst and c.mfma_c != p.vdst:
                found.append((RULES["mfma_write_srcc"](p.passes), "mfma_write_srcc"))
        elif c.kind in ("valu", "lds", "vmem", "lds_dma"):
            if (c.vsrc | c.vdst) & p.vdst:
                found.append((raw, "mfma_write_read"))
            if c.vdst & p.mfma_c - p.vdst:
                found.append((RULES["mfma_srcc_overwrite"](p.passes), "mfma_srcc_overwrite"))
    elif p.kind == "valu":
        if c.kind == "mfma" and c.vsrc & p.vdst:
            found.append((RULES["valu_vgpr_mfma"], "valu_vgpr_mfma"))
        if c.mnemonic in PERMLANE_SWAPS and c.vsrc & p.vdst:
            found.append((RULES["valu_vgpr_permlane_swap"], "valu_vgpr_permlane_swap"))
        if c.lane_src & p.vdst:
            found.append((RULES["valu_vgpr_readlane"], "valu_vgpr_readlane"))
        if c.valu and c.ssrc & p.sdst:
            found.append((RULES["valu_sgpr_valu"], "valu_sgpr_valu"))
        if c.kind in ("vmem", "lds_dma") and c.ssrc & p.sdst:
            found.append((RULES["valu_sgpr_vmem"], "valu_sgpr_vmem"))
        if c.lane_select & p.sdst:
            found.append((RULES["valu_sgpr_lane_select"], "valu_sgpr_lane_select"))
        if p.sdst & EXEC and (c.kind == "mfma" or c.mnemonic in READ_LANE + WRITE_LANE):
            found.append((RULES["valu_exec_mfma_or_lane"], "valu_exec_mfma_or_lane"))
        if p.trans and c.valu and not c.trans and c.vsrc & p.vdst:
            found.append((RULES["trans_valu"], "trans_valu"))
        if p.dst_sel and c.valu and c.vsrc & p.vdst:
            found.append((RULES["dst_sel_valu"], "dst_sel_valu"))
    elif p.kind == "salu" and p.sdst & M0 and c.kind == "lds_dma":
        found.append((RULES["salu_m0_lds_dma"], "salu_m0_lds_dma"))
    return max(found)


def window(p: Facts) -> int:
    """The most wait states any consumer can need after `p` (what is padded before labels and branches)."""
    if p.kind == "mfma":
        return RULES["mfma_write_read"](p.passes)
    if p.kind == "valu":
        w = max(RULES["valu_vgpr_mfma"], RULES["valu_vgpr_permlane_swap"]) if p.vdst else 0
        if p.sdst:
            w = max(w, RULES["valu_sgpr_vmem"], RULES["valu_sgpr_lane_select"])
        return w
    if p.kind == "salu" and p.sdst & M0:
        return RULES["salu_m0_lds_dma"]
    return 0


def facts(text: str) -> Facts:
    """The hazard-relevant reads and writes of one line of assembly."""
    mnemonic, ops = split_operands(text)
    v = lambda o: frozenset(regs_of(o, "v"))  # noqa: E731
    s = lambda o: frozenset(regs_of(o, "s"))  # noqa: E731
    union = lambda sets: frozenset().union(*sets)  # noqa: E731
    if mnemonic in MFMA_PASSES:
        return Facts("mfma", mnemonic, vdst=v(ops[0]), vsrc=union(v(o) for o in ops[1:4]),
                     passes=MFMA_PASSES[mnemonic], mfma_ab=v(ops[1]) | v(ops[2]), mfma_c=v(ops[3]))
    if mnemonic.startswith("s_load"):
        return Facts("smem", mnemonic, sdst=s(ops[0]), ssrc=union(s(o) for o in ops[1:]))
    if mnemonic.startswith("s_"):
        writes = s(ops[0]) if ops and not mnemonic.startswith(NO_DESTINATION) else frozenset()
        return Facts("salu", mnemonic, sdst=writes, ssrc=union(s(o) for o in ops[0 if not writes else 1:]))
    if mnemonic.startswith("ds_"):
        if mnemonic.startswith("ds_write"):
            return Facts("lds", mnemonic, vsrc=union(v(o) for o in ops))
        return Facts("lds", mnemonic, vdst=v(ops[0]), vsrc=union(v(o) for o in ops[1:]))
    if mnemonic.startswith(("buffer_", "global_")):
        if " lds" in text:  # direct-to-LDS: no VGPR destination; reads M0
            return Facts("lds_dma", mnemonic, vsrc=union(v(o) for o in ops), ssrc=union(s(o) for o in ops) | M0)
        if "store" in mnemonic:
            return Facts("vmem", mnemonic, vsrc=union(v(o) for o in ops), ssrc=union(s(o) for o in ops))
        return Facts("vmem", mnemonic, vdst=v(ops[0]), vsrc=union(v(o) for o in ops[1:]),
                     ssrc=union(s(o) for o in ops[1:]))
    if not mnemonic.startswith("v_"):
        return Facts("other", mnemonic)
    vdst, sdst = v(ops[0]), s(ops[0])
    srcs = ops[1:]
    vsrc = union(v(o) for o in srcs) | (vdst if mnemonic in DEST_ALSO_READ else frozenset())
    if mnemonic in PERMLANE_SWAPS:
        vdst = vdst | vsrc
    ssrc = union(s(o) for o in srcs)
    op_sel, op_sel_hi = _modifier(text, "op_sel"), _modifier(text, "op_sel_hi")
    if mnemonic.startswith("v_pk_"):  # LLVM reads src0's op_sel_hi bit (default 1) as a destination select
        dst_sel = op_sel_hi is None or op_sel_hi[0] == 1
    else:
        dst_sel = bool(op_sel and len(op_sel) == len(srcs) + 1 and op_sel[-1])
    lane_src = v(srcs[0]) if mnemonic in READ_LANE else frozenset()
    lane_select = s(srcs[1]) if mnemonic in ("v_readlane_b32", "v_writelane_b32") and len(srcs) > 1 else frozenset()
    return Facts("valu", mnemonic, vdst=vdst, vsrc=vsrc, sdst=sdst, ssrc=ssrc, lane_src=lane_src,
                 lane_select=lane_select, trans=mnemonic in TRANS_OPS, dst_sel=dst_sel)


@dataclass
class _Pending:
    facts: Facts
    elapsed: int = 0


@dataclass
class Tracker:
    """Producers still inside their hazard window, and the padding a new instruction needs."""
    pending: list[_Pending] = field(default_factory=list)

    def needed(self, text: str) -> tuple[int, str]:
        c = facts(text)
        need = (0, "")
        for p in self.pending:
            wait, rule = required_wait(p.facts, c)
            need = max(need, (wait - p.elapsed, rule))
        return need

    def padding_before(self, text: str) -> list[int]:
        """s_nop wait-state counts (each at most MAX_NOP) to emit before `text`."""
        need = self.needed(text)[0]
        pads = []
        while need > 0:
            pads.append(min(need, MAX_NOP))
            need -= pads[-1]
        return pads

    def issue(self, text: str) -> None:
        mnemonic, ops = split_operands(text)
        states = int(ops[0], 0) + 1 if mnemonic == "s_nop" else 1
        for p in self.pending:
            p.elapsed += states
        self.pending = [p for p in self.pending if p.elapsed < window(p.facts)]
        if mnemonic != "s_nop":
            f = facts(text)
            if window(f):
                self.pending.append(_Pending(f))

    def drain(self) -> int:
        """Wait states still owed to the longest open window (padded before labels and branches)."""
        return max((window(p.facts) - p.elapsed for p in self.pending), default=0)


def soft_clause_problems(lines: list[tuple[int, str]]) -> list[str]:
    """Runs of consecutive SMEM loads (or VMEM loads) in which one load writes a register another reads."""
    problems, run, kind = [], [], None
    for number, code in lines + [(0, "s_nop 0")]:
        f = facts(code)
        k = f.kind if f.kind == "smem" or (f.kind == "vmem" and "load" in f.mnemonic) else None
        if k != kind or k is None:
            if len(run) > 1:
                files = [(frozenset().union(*(getattr(g, w) for _, g in run)),
                          frozenset().union(*(getattr(g, r) for _, g in run))) for w, r in (("vdst", "vsrc"),
                                                                                           ("sdst", "ssrc"))]
                if any(writes & reads for writes, reads in files):
                    problems.append(f"line {run[0][0]}: a {kind} clause writes a register it reads")
            run, kind = [], k
        if k is not None:
            run.append((number, f))
    return problems


def check(text: str) -> list[str]:
    """Re-verify assembly text: every hazard window is padded, no soft clause reads its own writes. Labels and
    branches reset the tracking, which is sound because the emitter pads every open window before them. Returns
    one message per violation."""
    problems = []
    tracker = Tracker()
    code_lines = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("//")[0].strip()
        if not code or code.startswith("."):
            continue
        code_lines.append((number, code))
        if code.endswith(":"):
            if tracker.drain() > 0:
                problems.append(f"line {number}: label {code} reached with an open hazard window")
            tracker = Tracker()
            continue
        need, rule = tracker.needed(code)
        if need > 0:
            problems.append(f"line {number}: `{code}` needs {need} more wait state(s) ({rule})")
        tracker.issue(code)
        if code.startswith(("s_branch", "s_cbranch", "s_endpgm")):
            if tracker.drain() > 0:
                problems.append(f"line {number}: branch with an open hazard window")
            tracker = Tracker()
    return problems + soft_clause_problems([(n, c) for n, c in code_lines if not c.endswith(":")])
