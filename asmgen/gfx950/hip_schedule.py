"""Static schedule model of the HIP kernels' steady-state key loop (the BF16 kernels of asmgen/hip).

The loop and its instructions come from clang's assembly of the committed object: the key loop is the first
innermost loop (LLVM's "Inner Loop Header" structure comments) that issues MFMAs, and each instruction of the text is
matched, in order, to the code object's decoded instructions (a mismatch raises). Which way its branches go in the
steady state is not guessed from the compiled branch conditions: the code object runs once in the simulator and the
path that wave 0 (group A) and wave 4 (group B, one half-iteration behind) execute through the loop is recorded.
An iteration (header to header) is steady when it is not the first (whose tile sets m from -inf), it and the next
issue the loop's full number of MFMAs (every score and PV tile it covers is visible to the wave) and runs no causal mask
(v_cndmask_b32: the mask's selects, which the loop uses nowhere else); it is a "rescale" iteration when it executes
more exponentials than the 32 per tile that p = 2^(x - m) needs (the lazy rescale's 2^(m_old - m) ran).

Cycle costs are those of asmgen.gfx950.schedule (MFMA: passes x 4 cycles of the matrix pipe and 1 issue cycle;
VALU 4; transcendental 16; LDS, VMEM, SALU, waits, barriers, branches 1; s_nop 0). The barriers pace the two waves
of a SIMD (w and w + 4, one barrier apart): between two workgroup barriers each runs its own segment, and the SIMD
needs max(M_A + M_B, V_A + V_B, X_A, X_B) cycles for the interval (M: matrix-pipe cycles, V: VALU and
transcendental cycles, both pipes shared by the two waves; X: all of one wave's issue cycles, its own instructions
in order). Over the intervals of one steady iteration the matrix pipe is busy (sum of M_A + M_B) / (sum of the
interval times): an upper bound that takes memory latency as hidden and barriers as free.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import torch

from . import hazards, schedule
from .schedule import ISSUE_CYCLES, MATRIX_CYCLES_PER_PASS, TRANS_CYCLES, VALU_CYCLES

KEYS_PER_TILE = 64
EXPS_PER_TILE = 32  # p = 2^(x - m) for a lane's 32 scores of a 64-key tile
WAVE_A, WAVE_B = 0, 4  # the two waves of SIMD 0: group A and group B
SEQLEN = 1024  # 4 query tiles: workgroup 0 runs the pair (0, 3), whose tile 3 has 12 key tiles below wave 0's rows
MASK = "v_cndmask_b32"
_LABEL = re.compile(r"^(\.LBB\d+_\d+|; %bb\.\d+):")
_HEADER = re.compile(r"Inner Loop Header: Depth=\d+")
_IN_LOOP = re.compile(r"Header=BB(\d+_\d+) Depth=")
_INSTRUCTION = re.compile(r"^\s+([a-z][a-z0-9_]*)\b")
CATEGORIES = ("mfma", "exp", "valu", "lds", "lds_wait", "vmem", "barrier", "scalar")


def _category(mnemonic: str, line: str) -> str:
    """The assembly kernels' instruction kinds (schedule._kind; its "trans" is "exp" here), plus the LDS waits and
    barriers that stage the HIP kernels' pipelines."""
    if mnemonic == "s_waitcnt" and "lgkmcnt" in line:
        return "lds_wait"
    if mnemonic == "s_barrier":
        return "barrier"
    kind = schedule._kind(mnemonic)
    return "exp" if kind == "trans" else kind


def _cycles(category: str, mnemonic: str) -> tuple[int, int]:
    """(matrix-pipe cycles, issue cycles of the wave) of one instruction."""
    if category == "mfma":
        return hazards.MFMA_PASSES[mnemonic] * MATRIX_CYCLES_PER_PASS, ISSUE_CYCLES
    return 0, {"exp": TRANS_CYCLES, "valu": VALU_CYCLES, "nop": 0}.get(category, ISSUE_CYCLES)


@dataclass
class Listing:
    """clang's assembly as instructions in code-object order, with the key loop located in it."""
    lines: list[str]  # one per instruction
    mnemonics: list[str]
    loop: frozenset[int]  # instruction indices of the key loop's blocks
    header: int  # index of the loop header's first instruction


def listing(text: str) -> Listing:
    lines, mnemonics = [], []
    blocks: list[dict] = []  # label, loop (the header it is "in Loop" of), header (it heads an innermost loop), start
    for raw in text.splitlines():
        m = _LABEL.match(raw)
        if m:
            loop = _IN_LOOP.search(raw)
            blocks.append({"label": m.group(1), "loop": loop and loop.group(1), "header": bool(_HEADER.search(raw)),
                           "start": len(lines)})
            continue
        if _HEADER.search(raw) and raw.lstrip().startswith(";") and blocks:
            blocks[-1]["header"] = True  # the comment line under the label
            continue
        m = _INSTRUCTION.match(raw)
        if m and blocks:
            lines.append(raw.split(";")[0].strip())
            mnemonics.append(re.sub(r"_e(32|64)$", "", m.group(1)))
    ends = [b["start"] for b in blocks[1:]] + [len(lines)]
    for head in (b for b in blocks if b["header"]):
        name = head["label"].removeprefix(".LBB")  # ".LBB0_19" is "BB0_19" in the structure comments
        loop = frozenset(j for b, end in zip(blocks, ends, strict=True) if b is head or b["loop"] == name
                         for j in range(b["start"], end))
        if any(mnemonics[j] in hazards.MFMA_PASSES for j in loop):
            return Listing(lines, mnemonics, loop, head["start"])
    raise ValueError("no innermost loop with MFMAs in the assembly")


@dataclass
class Iteration:
    wave: int
    index: int  # 0 for the loop's first header visit
    instructions: list[int]  # executed instruction indices, from one header visit to the next
    start: int = 0  # its position in the wave's path

    def counts(self, lst: Listing) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in self.instructions:
            c = _category(lst.mnemonics[i], lst.lines[i])
            out[c] = out.get(c, 0) + 1
        return out


@dataclass
class WaveTile:
    """Instruction counts and issue cycles of one wave per key tile, by category."""
    counts: dict[str, float] = field(default_factory=dict)
    cycles: dict[str, float] = field(default_factory=dict)
    matrix: float = 0  # matrix-pipe cycles

    def add(self, lst: Listing, indices, scale: float) -> None:
        for i in indices:
            mnemonic = lst.mnemonics[i]
            cat = _category(mnemonic, lst.lines[i])
            matrix, issue = _cycles(cat, mnemonic)
            self.matrix += matrix * scale
            self.counts[cat] = self.counts.get(cat, 0) + scale
            self.cycles[cat] = self.cycles.get(cat, 0) + issue * scale

    @property
    def other(self) -> float:
        return sum(self.cycles.values())


def _segment_cycles(lst: Listing, indices) -> tuple[int, int, int]:
    """(matrix-pipe, VALU-pipe, issue) cycles of one wave's instructions."""
    matrix = valu = issue = 0
    for i in indices:
        cat = _category(lst.mnemonics[i], lst.lines[i])
        m, c = _cycles(cat, lst.mnemonics[i])
        matrix, issue = matrix + m, issue + c
        valu += c if cat in ("valu", "exp") else 0
    return matrix, valu, issue


@dataclass
class PairSchedule:
    """One steady iteration of wave A and the barrier intervals it spans, with wave B's segments in them."""
    a: WaveTile
    b: WaveTile
    matrix_cycles: float  # both waves' matrix-pipe cycles per key tile
    interval_cycles: float  # the SIMD's cycles per key tile: sum over the intervals of their time

    @property
    def matrix_busy(self) -> float:
        return self.matrix_cycles / self.interval_cycles

    def summary(self) -> str:
        def side(name, w):
            parts = ", ".join(f"{c} {w.counts[c]:g} ({w.cycles[c]:g} cyc)" for c in CATEGORIES if c in w.counts)
            return f"wave {name}: matrix {w.matrix:g}, other {w.other:g} cycles per tile ({parts})"
        return (f"{side('A', self.a)}; {side('B', self.b)}; SIMD {self.interval_cycles:g} cycles per tile of each "
                f"wave; matrix pipe busy {100 * self.matrix_busy:.1f}%")


def _barriers(lst: Listing, path: list[int]) -> list[int]:
    return [at for at, i in enumerate(path) if lst.mnemonics[i] == "s_barrier"]


def pair_schedule(lst: Listing, paths: dict[int, list[int]], it: Iteration, tiles: int) -> PairSchedule:
    """Wave A's iteration `it` as barrier intervals: the first barrier it passes starts them, and as many follow as
    it passes (one period of the steady state whatever the loop's rotation)."""
    bars = {w: _barriers(lst, path) for w, path in paths.items()}
    end = it.start + len(it.instructions)
    mine = [k for k, at in enumerate(bars[WAVE_A]) if it.start <= at < end]
    a, b, matrix, total = WaveTile(), WaveTile(), 0.0, 0.0
    for k in range(mine[0], mine[0] + len(mine)):
        segs = {w: paths[w][bars[w][k] + 1:bars[w][k + 1] + 1] for w in (WAVE_A, WAVE_B)}
        (ma, va, xa), (mb, vb, xb) = (_segment_cycles(lst, segs[w]) for w in (WAVE_A, WAVE_B))
        matrix += ma + mb
        total += max(ma + mb, va + vb, xa, xb)
        a.add(lst, segs[WAVE_A], 1 / tiles)
        b.add(lst, segs[WAVE_B], 1 / tiles)
    return PairSchedule(a, b, matrix / tiles, total / tiles)


def trace_loop(kernel: str, inputs_kind: str = "activation", seqlen: int = SEQLEN, seed: int = 0):
    """Run the committed kernel on one head of `seqlen` keys (workgroup 0: the query tile pair (0, T - 1)) and
    return (listing, iterations of waves A and B through tile T - 1's key loop, key tiles per iteration)."""
    from zyfa_tools import inputs

    from .. import hip
    from ..sim import load
    from ..sim.attention import manifest_entry, run_attention
    entry, code = manifest_entry(kernel)
    lst = listing(hip.generate(kernel))
    program = load(code)
    decoded = [ins.name for ins in program.code]
    n = len(lst.mnemonics)
    if decoded[:n] != lst.mnemonics or set(decoded[n:]) - {"s_nop"}:  # the object pads its code with s_nop
        raise ValueError(f"{kernel}: clang's assembly does not match the committed code object instruction for "
                         f"instruction")
    make = inputs.activation_like if inputs_kind == "activation" else inputs.gaussian
    q, k, v = make(1, seqlen, 1, 1, entry["d_qk"], entry["d_v"], seed=seed)
    q, k, v, _ = inputs.quantize(q, k, v, torch.bfloat16)
    paths: dict[int, list[int]] = {WAVE_A: [], WAVE_B: []}

    def record(wave: int, index: int) -> None:
        if wave in paths:
            paths[wave].append(index)

    result = run_attention(kernel, q, k, v, entry=entry, code_object=code, workgroups=[0], trace=record)
    _, _, lo, hi = result.jobs[0].tolist()
    assert (lo, hi) == (0, seqlen // entry["tile_m"] - 1), result.jobs
    iterations = {w: _iterations(lst, w, path) for w, path in paths.items()}
    per_tile = 2 * entry["d_qk"] // 16 + 4 * entry["d_v"] // 32  # 32x32x16 MFMAs of QK and PV per 64-key tile
    tiles = max(it.counts(lst).get("mfma", 0) for it in iterations[WAVE_A]) // per_tile
    return lst, paths, iterations, tiles


def _iterations(lst: Listing, wave: int, path: list[int]) -> list[Iteration]:
    """The iterations of the first pass through the key loop (the job's first query tile), header to header."""
    out, current, inside = [], None, False
    for at, i in enumerate(path):
        if i in lst.loop:
            inside = True
            if i == lst.header:
                current = Iteration(wave, len(out), [], at)
                out.append(current)
            if current is not None:
                current.instructions.append(i)
        elif inside:
            break
    return out


def steady(lst: Listing, iterations: list[Iteration], tiles: int) -> dict[str, Iteration]:
    """The first steady iteration without and with a lazy rescale (keys "no rescale", "rescale" where found)."""
    mfmas = max(it.counts(lst).get("mfma", 0) for it in iterations)

    def full(it: Iteration) -> bool:
        return it.counts(lst).get("mfma", 0) == mfmas and not any(lst.mnemonics[i] == MASK for i in it.instructions)

    cases: dict[str, Iteration] = {}
    for it, after in zip(iterations[1:], iterations[2:], strict=False):
        if not (full(it) and full(after)):  # (its barrier intervals may reach into the next iteration)
            continue
        exps = sum(lst.mnemonics[i] == "v_exp_f32" for i in it.instructions)
        cases.setdefault("no rescale" if exps == EXPS_PER_TILE * tiles else "rescale", it)
    return cases


@dataclass
class Analysis:
    cases: dict[str, PairSchedule]  # "no rescale" and, where a steady iteration rescaled, "rescale"
    rescale: dict[str, int]  # the lazy rescale's instructions by category (one occurrence)
    rescale_cycles: int  # their issue cycles


def analyse(kernel: str, seqlen: int = SEQLEN, kinds: tuple[str, ...] = ("activation",)) -> Analysis:
    """The steady-state cases of a HIP kernel's key loop from runs on `kinds` of inputs (activation-like: a sink key
    fixes m early, so steady iterations do not rescale; "gaussian" adds unit Gaussian inputs). The rescale's own
    cost is what wave A's first iteration (whose first tile always rescales: m starts at -inf) executes beyond the
    next one."""
    cases: dict[str, PairSchedule] = {}
    rescale: dict[str, int] = {}
    cycles = 0
    for kind in kinds:
        lst, paths, iterations, tiles = trace_loop(kernel, kind, seqlen)
        for case, it in steady(lst, iterations[WAVE_A], tiles).items():
            cases.setdefault(case, pair_schedule(lst, paths, it, tiles))
        if not rescale:
            first, second = (Counter(iterations[WAVE_A][i].instructions) for i in (0, 1))
            for i, n in (first - second).items():
                cat = _category(lst.mnemonics[i], lst.lines[i])
                rescale[cat] = rescale.get(cat, 0) + n
                cycles += n * _cycles(cat, lst.mnemonics[i])[1]
    return Analysis(dict(sorted(cases.items())), rescale, cycles)
