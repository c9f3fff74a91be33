"""State of one wave64: register files, EXEC/VCC/SCC/M0, outstanding memory operations and MFMA results in flight."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .codeobject import KernelDescriptor, Operand
from .errors import SimError
from .formats import flush_denormals

LANES = 64
SGPR_SLOTS = 128  # operand encoding space: s0..s101, flat_scratch, vcc, ttmp, m0, exec
VCC_LO, M0, EXEC_LO = 106, 124, 126
U32 = 0xFFFFFFFF
ALL_LANES = (1 << LANES) - 1
LANE_BITS = np.uint64(1) << np.arange(LANES, dtype=np.uint64)


@dataclass
class Pending:
    """An issued memory operation whose effect lands when it completes."""
    complete: Callable[[], None]
    issued_at: int  # the wave's instruction count at issue
    smem: bool = False


def mask_to_int(mask: np.ndarray) -> int:
    return int(np.bitwise_or.reduce(np.where(mask, LANE_BITS, np.uint64(0))))


def int_to_mask(value: int) -> np.ndarray:
    return (np.uint64(value) & LANE_BITS) != 0


class Wave:
    def __init__(self, wave_id: int, kd: KernelDescriptor, lds: np.ndarray) -> None:
        self.id = wave_id
        self.v = np.zeros((kd.accum_offset, LANES), dtype=np.uint32)
        self.a = np.zeros((max(kd.vgpr_count - kd.accum_offset, 0), LANES), dtype=np.uint32)
        self.s = [0] * SGPR_SLOTS
        self.scc = 0
        self.lds = lds
        self.pc = 0  # index into the program's instruction list
        self.done = False
        self.at_barrier = False
        self.issued = 0  # instructions issued (drives load latency)
        self.wait_states = 0  # issue slots elapsed (s_nop N counts N+1): drives the hazard check
        self.vm: deque[Pending] = deque()
        self.lgkm: deque[Pending] = deque()
        self.flush_inputs, self.flush_results = kd.flush_f32_inputs, kd.flush_f32_results  # FP32 denormal mode
        self.recent: list = []  # (wait_states at issue, hazard facts, instruction, window) still inside its window
        self._exec_cache = (-1, None)

    # --- scalar state -------------------------------------------------------------------------------------------
    @property
    def exec(self) -> int:
        return self.s[EXEC_LO] | self.s[EXEC_LO + 1] << 32

    @property
    def exec_mask(self) -> np.ndarray:
        value = self.exec
        if self._exec_cache[0] != value:
            self._exec_cache = (value, int_to_mask(value))
        return self._exec_cache[1]

    @property
    def vcc(self) -> int:
        return self.s[VCC_LO] | self.s[VCC_LO + 1] << 32

    def sread(self, op: Operand, width: int = 32) -> int:
        """A scalar source as an unsigned int of `width` bits (64-bit immediates are sign-extended)."""
        if op.kind == "s":
            if width == 64:
                return self.s[op.index] | self.s[op.index + 1] << 32
            return self.s[op.index]
        if op.kind == "imm":
            if width == 64:
                return int(op.value) & (1 << 64) - 1 if not op.is_float else _f64_bits(op.value)
            return op.index
        if op.kind == "scc":
            return self.scc
        raise SimError(f"operand kind {op.kind} is not a scalar source")

    def swrite(self, op: Operand, value: int, width: int = 32) -> None:
        if op.kind != "s":
            raise SimError(f"scalar destination must be an SGPR, got {op.kind}")
        self.s[op.index] = value & U32
        if width == 64:
            self.s[op.index + 1] = (value >> 32) & U32

    # --- vector operands ----------------------------------------------------------------------------------------
    def vread(self, op: Operand, offset: int = 0) -> np.ndarray:
        """32 bits per lane of a vector source (register `offset` within a range); scalars broadcast."""
        if op.kind == "v":
            return self.v[op.index + offset]
        if op.kind == "a":
            return self.a[op.index + offset]
        if op.kind == "s":
            return np.full(LANES, self.s[op.index + offset], dtype=np.uint32)
        if op.kind == "imm":
            return np.full(LANES, op.index if offset == 0 else 0, dtype=np.uint32)
        if op.kind == "scc":
            return np.full(LANES, self.scc, dtype=np.uint32)
        raise SimError(f"operand kind {op.kind} is not a vector source")

    def fread(self, op: Operand, offset: int = 0, arithmetic: bool = True) -> np.ndarray:
        """A float32 source with its abs / neg input modifiers applied; an arithmetic source is flushed to zero
        if denormal where the kernel descriptor's FP32 denormal mode flushes inputs."""
        x = self.vread(op, offset).view(np.float32)
        if arithmetic and self.flush_inputs:
            x = flush_denormals(x)
        if op.abs:
            x = np.abs(x)
        if op.neg:
            x = -x
        return x

    def vwrite(self, op: Operand, values: np.ndarray, offset: int = 0, mask: np.ndarray | None = None) -> None:
        """Write lanes enabled in EXEC (or `mask`) of one 32-bit vector destination."""
        files = {"v": self.v, "a": self.a}
        if op.kind not in files:
            raise SimError(f"vector destination must be a VGPR or AGPR, got {op.kind}")
        row = files[op.kind][op.index + offset]
        values = np.asarray(values)
        if values.dtype != np.uint32:
            values = values.astype(np.float32).view(np.uint32) if values.dtype.kind == "f" else \
                values.astype(np.uint32)
        enabled = self.exec_mask if mask is None else mask
        if self.exec == ALL_LANES and mask is None:
            row[:] = values
        else:
            row[enabled] = values[enabled] if values.shape else values


def _f64_bits(value: float) -> int:
    return int(np.array([value], dtype=np.float64).view(np.uint64)[0])
