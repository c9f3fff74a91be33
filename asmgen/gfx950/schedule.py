"""Static schedule analysis of the steady-state key loop: how busy the matrix pipe is.

Model (stated so the figure can be checked and argued with):
  * the steady-state iteration is the key loop's active path for a tile below the diagonal (no causal mask) in
    which no row's maximum grows by more than tau (no lazy rescale) and every row's block exponent e is 0 (y is
    x - m, and PV accumulates straight into O); `with_rescale=True` adds the rescale, `scaled_pv=True` takes the
    path where some e != 0 (2^-e, block products, then O += 2^-e * product) and `negative_e=True` the one where
    some e = -1 (lean P forms y = (x - m) + e before w = 8y + 120; with every e >= 0 one FMA does both);
  * an MFMA occupies the SIMD's matrix pipe for passes x 4 cycles (v_mfma_f32_32x32x64_f8f6f4: 16 passes, from
    LLVM's gfx950 scheduling model) and its issue slot for one cycle;
  * a VALU instruction occupies the wave's issue for 4 cycles (wave64 on a 16-lane SIMD; v_pk_* FP32 forms do
    two elements per lane in those 4 cycles), a transcendental (v_exp/v_log/v_rcp) 16 (quarter rate);
  * SALU, SMEM, LDS, VMEM issue, s_waitcnt, s_barrier, s_setprio and branches (each one the path executes,
    taken or not) cost 1 cycle; s_nop costs the wave
    nothing the SIMD cannot give to the partner wave; memory latency is assumed hidden by the 4-slot rings;
  * two waves share a SIMD in ping-pong: one wave's non-matrix work X runs while the other's matrix work M
    occupies the pipe, so a period of both waves' tiles lasts 2 * max(M, X) and the pipe is busy
    M / max(M, X) of the time (an upper bound that assumes perfect alternation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import hazards
from .kernel import KEY_LOOP_UNROLL

MATRIX_CYCLES_PER_PASS = 4
VALU_CYCLES = 4
TRANS_CYCLES = 16
ISSUE_CYCLES = 1
LOOP_START, LOOP_BRANCH = ".Lkey_loop", "s_cbranch_scc1 .Lkey_loop"
BRANCHES = ("s_branch", "s_cbranch_scc0", "s_cbranch_scc1")


def taken_branches(with_rescale: bool, scaled_pv: bool, negative_e: bool) -> dict[str, bool]:
    """Which conditional branches of the key loop are taken in a case (target label, less the suffix _c of the
    loop copy c, -> taken)."""
    return {
        ".Lqk_done": False, ".Lpv_done": False,  # the wave has keys in the tile
        ".Lmask_done": True,  # below the diagonal: no causal mask
        ".Lrescale_done": not with_rescale,  # no row's maximum grew by more than tau
        ".Lexp_zero": not scaled_pv, ".Lblock_exp_done": not scaled_pv,  # every e = 0 (lean / exact P)
        ".Lexp_negative": negative_e,  # some e = -1 (lean P: y before w)
        ".Lpv_scaled": scaled_pv,  # some e != 0: block products, then O += 2^-e * product
    }


@dataclass
class LoopSchedule:
    """Cycles and instruction counts per wave and key tile (a pass of the unrolled loop divided by its tiles)."""
    matrix_cycles: float = 0
    other_cycles: float = 0
    counts: dict[str, float] = field(default_factory=dict)

    @property
    def matrix_busy(self) -> float:
        return self.matrix_cycles / max(self.matrix_cycles, self.other_cycles)

    def summary(self) -> str:
        parts = ", ".join(f"{k} {v:g}" for k, v in sorted(self.counts.items()))
        return (f"matrix {self.matrix_cycles:g} cycles, other {self.other_cycles:g} cycles per wave and tile "
                f"({parts}); matrix pipe busy {100 * self.matrix_busy:.1f}%")


def _kind(mnemonic: str) -> str:
    if mnemonic in hazards.MFMA_PASSES:
        return "mfma"
    if mnemonic in hazards.TRANS_OPS:
        return "trans"
    if mnemonic == "s_nop":
        return "nop"
    if mnemonic.startswith("v_"):
        return "valu"
    if mnemonic.startswith("ds_"):
        return "lds"
    if mnemonic.startswith(("buffer_", "global_")):
        return "vmem"
    return "scalar"


def steady_state_body(text: str, with_rescale: bool = False, scaled_pv: bool = False,
                      negative_e: bool = False) -> list[str]:
    """The instructions one pass of the steady-state key loop executes (KEY_LOOP_UNROLL key tiles), in order,
    branches included."""
    lines = [line.split("//")[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    labels = {line[:-1]: i for i, line in enumerate(lines) if line.endswith(":")}
    taken = taken_branches(with_rescale, scaled_pv, negative_e)
    at, body = labels[LOOP_START] + 1, []
    while lines[at] != LOOP_BRANCH:
        line = lines[at]
        at += 1
        if line.endswith(":"):
            continue
        body.append(line)
        mnemonic, _, target = line.partition(" ")
        if mnemonic == "s_branch" or (mnemonic in BRANCHES and taken[re.sub(r"_\d+$", "", target)]):
            at = labels[target] + 1
    return body + [LOOP_BRANCH]


def analyse(text: str, with_rescale: bool = False, scaled_pv: bool = False, negative_e: bool = False) -> LoopSchedule:
    result = LoopSchedule()
    for line in steady_state_body(text, with_rescale, scaled_pv, negative_e):
        mnemonic, _ = hazards.split_operands(line)
        kind = _kind(mnemonic)
        result.counts[kind] = result.counts.get(kind, 0) + 1
        if kind == "mfma":
            result.matrix_cycles += hazards.MFMA_PASSES[mnemonic] * MATRIX_CYCLES_PER_PASS
            result.other_cycles += ISSUE_CYCLES
        elif kind == "valu":
            result.other_cycles += VALU_CYCLES
        elif kind == "trans":
            result.other_cycles += TRANS_CYCLES
        elif kind != "nop":
            result.other_cycles += ISSUE_CYCLES
    result.matrix_cycles /= KEY_LOOP_UNROLL
    result.other_cycles /= KEY_LOOP_UNROLL
    result.counts = {k: v / KEY_LOOP_UNROLL for k, v in result.counts.items()}
    return result
