"""Static schedule analysis of the steady-state key loop: how busy the matrix pipe is.

Model (stated so the figure can be checked and argued with):
  * the steady-state iteration is the key loop's active path for a tile below the diagonal (no causal mask) in
    which no row's maximum grows by more than tau (no lazy rescale) and every row's block exponent e is 0 (PV
    accumulates straight into O); `with_rescale=True` adds the rescale, `scaled_pv=True` takes the path where
    some e != 0 (block products, then O += 2^-e * product);
  * an MFMA occupies the SIMD's matrix pipe for passes x 4 cycles (v_mfma_f32_32x32x64_f8f6f4: 16 passes, from
    LLVM's gfx950 scheduling model) and its issue slot for one cycle;
  * a VALU instruction occupies the wave's issue for 4 cycles (wave64 on a 16-lane SIMD; v_pk_* FP32 forms do
    two elements per lane in those 4 cycles), a transcendental (v_exp/v_log/v_rcp) 16 (quarter rate);
  * SALU, SMEM, LDS, VMEM issue, s_waitcnt, s_barrier, s_setprio and branches cost 1 cycle; s_nop costs the wave
    nothing the SIMD cannot give to the partner wave; memory latency is assumed hidden by the 4-slot rings;
  * two waves share a SIMD in ping-pong: one wave's non-matrix work X runs while the other's matrix work M
    occupies the pipe, so a period of both waves' tiles lasts 2 * max(M, X) and the pipe is busy
    M / max(M, X) of the time (an upper bound that assumes perfect alternation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import hazards

MATRIX_CYCLES_PER_PASS = 4
VALU_CYCLES = 4
TRANS_CYCLES = 16
ISSUE_CYCLES = 1
LOOP_START, LOOP_BRANCH = ".Lkey_loop:", "s_cbranch_scc1 .Lkey_loop"
SKIPPED_BLOCKS = {"s_cbranch_scc1 .Lmask_done": ".Lmask_done:"}  # not taken below the diagonal
RESCALE_BLOCK = ("s_cbranch_scc0 .Lrescale_done", ".Lrescale_done:")
FAST_PV = ("s_cbranch_scc1 .Lpv_scaled", "s_branch .Lpv_end", ".Lpv_end:")  # branch, end of the fast path, join


@dataclass
class LoopSchedule:
    matrix_cycles: int = 0
    other_cycles: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def matrix_busy(self) -> float:
        return self.matrix_cycles / max(self.matrix_cycles, self.other_cycles)

    def summary(self) -> str:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        return (f"matrix {self.matrix_cycles} cycles, other {self.other_cycles} cycles per wave and tile "
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


def steady_state_body(text: str, with_rescale: bool = False, scaled_pv: bool = False) -> list[str]:
    """The instructions of one steady-state key-loop iteration, in order."""
    lines = [line.split("//")[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    start, stop = lines.index(LOOP_START), lines.index(LOOP_BRANCH)
    body, skip_until = [], None
    for line in lines[start + 1:stop + 1]:
        if skip_until:
            if line == skip_until:
                skip_until = None
            continue
        if line in SKIPPED_BLOCKS:
            skip_until = SKIPPED_BLOCKS[line]
            continue
        if line == RESCALE_BLOCK[0] and not with_rescale:
            skip_until = RESCALE_BLOCK[1]
            continue
        if line == FAST_PV[0]:
            skip_until = ".Lpv_scaled:" if scaled_pv else None
            continue
        if line == FAST_PV[1]:
            skip_until = FAST_PV[2]
            continue
        if line.endswith(":") or line.startswith("s_cbranch_scc0 .Lqk_done") or line.startswith(
                "s_cbranch_scc1 .Lpv_done"):
            continue  # labels, and the branches around inactive tiles (not taken)
        body.append(line)
    return body


def analyse(text: str, with_rescale: bool = False, scaled_pv: bool = False) -> LoopSchedule:
    result = LoopSchedule()
    for line in steady_state_body(text, with_rescale, scaled_pv):
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
    return result
