"""Loading a code object and launching its kernels: workgroups in sequence, the waves of one workgroup interleaved.

Per wave the machine keeps the vmcnt / lgkmcnt queues of memory operations in flight (they complete at s_waitcnt,
after `latency` further instructions of the wave if set, or when a counter would overflow) and the MFMA results in
flight (a read fewer wait states after the MFMA than gfx950 requires raises HazardError).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from . import hazards, isa
from .codeobject import Elf, Instruction, KernelDescriptor, decode_code_object
from .errors import DeadlockError, SimError
from .memory import Memory
from .wave import LANES, Pending, Wave

VMCNT_MAX = 63  # the wave stalls (here: the oldest completes) rather than exceed its counters
LGKMCNT_MAX = 15
KERNARG_ALIGN = 64
WORKITEM_ID_BITS = 10  # gfx90a-class packed work-item ids in v0: x | y << 10 | z << 20
DEFAULT_MAX_INSTRUCTIONS = 200_000_000
SCHEDULES = ("round_robin", "greedy", "random")
RANDOM_QUANTUM = 16
USER_SGPRS_MODELLED = {"kernarg_segment_ptr", "dispatch_ptr"}


@dataclass
class LaunchStats:
    workgroups: int = 0
    instructions: int = 0
    by_unit: dict[str, int] = field(default_factory=dict)


class Context:
    """What instruction semantics see beyond their wave: memory, branch targets, the memory-completion rules."""

    def __init__(self, program: Program, memory: Memory, latency: int | None) -> None:
        self.memory = memory
        self._program = program
        self.latency = latency

    def index_of(self, addr: int, ins: Instruction) -> int:
        try:
            return self._program.index[addr]
        except KeyError:
            raise SimError(f"{ins.addr:#x} {ins.text}: branch target {addr:#x} is not an instruction") from None

    def issue(self, w: Wave, ins: Instruction, complete: Callable[[], None]) -> None:
        unit = isa.INSTRUCTIONS[ins.name].unit
        smem = unit == isa.SMEM
        queue, limit = (w.lgkm, LGKMCNT_MAX) if unit in (isa.SMEM, isa.LDS) else (w.vm, VMCNT_MAX)
        if len(queue) >= limit:
            queue.popleft().complete()
        queue.append(Pending(complete, w.issued, smem))

    def wait(self, w: Wave, vmcnt: int, lgkmcnt: int) -> None:
        while len(w.vm) > vmcnt:
            w.vm.popleft().complete()
        while len(w.lgkm) > lgkmcnt:
            # SMEM returns out of order: with a nonzero target the youngest SMEM load completes first.
            smem = [i for i, p in enumerate(w.lgkm) if p.smem] if lgkmcnt else []
            if smem:
                pending = w.lgkm[smem[-1]]
                del w.lgkm[smem[-1]]
            else:
                pending = w.lgkm.popleft()
            pending.complete()

    def retire_due(self, w: Wave) -> None:
        for queue in (w.vm, w.lgkm):
            while queue and w.issued - queue[0].issued_at >= self.latency:
                queue.popleft().complete()

    def drain(self, w: Wave) -> None:
        self.wait(w, 0, 0)


class Program:
    """A decoded code object. Launch its kernels with `launch`."""

    def __init__(self, data: bytes) -> None:
        self.elf: Elf
        self.elf, self.code = decode_code_object(data)
        self.index = {ins.addr: i for i, ins in enumerate(self.code)}
        self.semantics = [isa.INSTRUCTIONS.get(ins.name) for ins in self.code]
        self.facts = [hazards.facts_of(ins, s.unit) if s else None
                      for ins, s in zip(self.code, self.semantics, strict=True)]
        self.windows = [hazards.window(f) if f else 0 for f in self.facts]

    @property
    def symbols(self) -> list[str]:
        return sorted(name[:-3] for name in self.elf.symbols if name.endswith(".kd"))

    def descriptor(self, symbol: str) -> KernelDescriptor:
        if f"{symbol}.kd" not in self.elf.symbols:
            raise SimError(f"kernel {symbol!r} not in the code object (kernels: {self.symbols})")
        return KernelDescriptor.parse(self.elf.read(self.elf.symbols[f"{symbol}.kd"], 64))

    def unsupported(self) -> list[str]:
        return sorted({ins.name for ins, s in zip(self.code, self.semantics, strict=True) if s is None})

    def _validate(self, kd: KernelDescriptor) -> None:
        missing = self.unsupported()
        if missing:
            raise SimError(f"instructions not modelled by the simulator: {', '.join(missing)}")
        limits = {"v": kd.accum_offset, "a": kd.vgpr_count - kd.accum_offset}
        for ins in self.code:
            for op in ins.operands:
                if op.kind in limits and op.index + op.count > limits[op.kind]:
                    raise SimError(f"{ins.addr:#x} {ins.text}: {op.kind}{op.index + op.count - 1} is beyond the "
                                   f"{limits[op.kind]} {op.kind.upper()}GPRs the kernel descriptor allocates "
                                   f"(vgpr_count {kd.vgpr_count}, accum_offset {kd.accum_offset})")
        if kd.private_segment_size:
            raise SimError("scratch memory (private segment) is not modelled")
        extra = [name for name, _ in kd.user_sgprs if name not in USER_SGPRS_MODELLED]
        if extra:
            raise SimError(f"user SGPRs {extra} are not modelled (only {sorted(USER_SGPRS_MODELLED)})")

    def launch(self, symbol: str, grid: tuple[int, int, int], block: tuple[int, int, int], kernarg: bytes,
               memory: Memory, *, lds_bytes: int = 0, schedule: str = "round_robin", seed: int = 0,
               latency: int | None = None, workgroups: Iterable[tuple[int, int, int]] | None = None,
               progress: Callable[[int, int], None] | None = None,
               max_instructions: int = DEFAULT_MAX_INSTRUCTIONS,
               trace: Callable[[int, int], None] | None = None) -> LaunchStats:
        """Run `symbol` over `grid` workgroups of `block` threads; kernarg is copied into `memory`.

        lds_bytes: dynamic LDS added to the descriptor's group segment. schedule: "round_robin" (one instruction
        per wave in turn), "greedy" (a wave picked at random, seeded, runs until it waits at a barrier or ends) or
        "random" (seeded random wave and burst length). latency: instructions of the issuing wave after which a
        memory operation completes on its own (None: only at s_waitcnt, s_endpgm or counter overflow).
        workgroups: a subset of the grid to run. trace: called as trace(wave, index) before each instruction a
        wave executes (index into the program's instruction list; waves numbered within their workgroup).
        """
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        kd = self.descriptor(symbol)
        self._validate(kd)
        entry = self.elf.symbols[f"{symbol}.kd"] + kd.entry_offset
        if entry not in self.index:
            raise SimError(f"kernel entry {entry:#x} is not an instruction")
        padded = bytes(kernarg).ljust(kd.kernarg_size, b"\0")
        kernarg_addr = memory.put(padded or b"\0", align=KERNARG_ALIGN)
        dispatch_addr = memory.put(_dispatch_packet(grid, block, kd, kernarg_addr))
        ctx = Context(self, memory, latency)
        rng = random.Random(seed)
        stats = LaunchStats()
        ids = list(workgroups) if workgroups is not None else [
            (x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
        for n, wg in enumerate(ids):
            self._run_workgroup(kd, self.index[entry], wg, block, kernarg_addr, dispatch_addr, lds_bytes, ctx,
                                schedule, rng, stats, max_instructions, trace)
            stats.workgroups += 1
            if progress:
                progress(n + 1, len(ids))
        return stats

    def _run_workgroup(self, kd, entry, wg, block, kernarg_addr, dispatch_addr, lds_bytes, ctx, schedule, rng,
                       stats, max_instructions, trace) -> None:
        lds = np.zeros(kd.group_segment_size + lds_bytes, dtype=np.uint8)
        threads = block[0] * block[1] * block[2]
        waves = [self._start_wave(i, kd, entry, wg, block, threads, kernarg_addr, dispatch_addr, lds)
                 for i in range(-(-threads // LANES))]
        rr = 0
        while True:
            ready = [w for w in waves if not w.done and not w.at_barrier]
            if not ready:
                if all(w.done for w in waves):
                    return
                for w in waves:  # every live wave has arrived: the barrier opens
                    w.at_barrier = False
                continue
            if schedule == "round_robin":
                rr = (rr + 1) % len(waves)
                while waves[rr].done or waves[rr].at_barrier:
                    rr = (rr + 1) % len(waves)
                wave, quantum = waves[rr], 1
            elif schedule == "greedy":
                wave, quantum = rng.choice(ready), max_instructions
            else:
                wave, quantum = rng.choice(ready), rng.randint(1, RANDOM_QUANTUM)
            self._step(wave, quantum, ctx, stats, trace)
            if stats.instructions > max_instructions:
                raise DeadlockError(f"more than {max_instructions} instructions: a wave does not terminate")

    def _start_wave(self, i, kd, entry, wg, block, threads, kernarg_addr, dispatch_addr, lds) -> Wave:
        w = Wave(i, kd, lds)
        w.pc = entry
        sgpr = 0
        for name, count in kd.user_sgprs:
            value = kernarg_addr if name == "kernarg_segment_ptr" else dispatch_addr
            w.s[sgpr], w.s[sgpr + 1] = value & 0xFFFFFFFF, value >> 32
            sgpr += count
        sgpr = kd.user_sgpr_count
        for enabled, value in zip(kd.workgroup_id_sgprs, wg, strict=True):
            if enabled:
                w.s[sgpr] = value
                sgpr += 1
        tid = i * LANES + np.arange(LANES)
        x, y, z = tid % block[0], (tid // block[0]) % block[1], tid // (block[0] * block[1])
        w.v[0] = (x | y << WORKITEM_ID_BITS | z << 2 * WORKITEM_ID_BITS).astype(np.uint32)
        live = int(min(LANES, threads - i * LANES))
        exec_ = (1 << live) - 1
        w.s[126], w.s[127] = exec_ & 0xFFFFFFFF, exec_ >> 32
        return w

    def _step(self, w: Wave, quantum: int, ctx: Context, stats: LaunchStats, trace=None) -> None:
        code, semantics, facts, windows = self.code, self.semantics, self.facts, self.windows
        by_unit = stats.by_unit
        for _ in range(quantum):
            pc = w.pc
            if pc >= len(code):
                raise SimError(f"wave {w.id} ran past the end of the code")
            ins, sem = code[pc], semantics[pc]
            if trace is not None:
                trace(w.id, pc)
            if w.recent:
                hazards.check(ins, facts[pc], w.recent, w.wait_states)
            w.pc = pc + 1
            sem.fn(w, ins, ctx)
            # (s_nop N adds its N extra wait states in its semantics) drop producers whose windows have passed
            if w.recent:
                w.recent = [r for r in w.recent if w.wait_states - r[0] < r[3]]
            if windows[pc]:
                w.recent.append((w.wait_states, facts[pc], ins, windows[pc]))
            w.wait_states += 1
            w.issued += 1
            by_unit[sem.unit] = by_unit.get(sem.unit, 0) + 1
            stats.instructions += 1
            if ctx.latency is not None:
                ctx.retire_due(w)
            if w.done or w.at_barrier:
                return


def _dispatch_packet(grid, block, kd: KernelDescriptor, kernarg_addr: int) -> bytes:
    """A 64-byte HSA kernel dispatch packet with the sizes filled in (for kernels that read the dispatch ptr)."""
    packet = np.zeros(16, dtype=np.uint32)
    packet[1] = block[0] | block[1] << 16
    packet[2] = block[2]
    packet[3:6] = [g * b for g, b in zip(grid, block, strict=True)]
    packet[7] = kd.group_segment_size
    packet[10], packet[11] = kernarg_addr & 0xFFFFFFFF, kernarg_addr >> 32
    return packet.tobytes()


def load(code_object: bytes) -> Program:
    """Decode a gfx950 code object (the bytes of a .co file)."""
    return Program(code_object)
