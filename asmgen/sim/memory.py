"""Flat global memory with 64-bit addresses, and the buffer resource (V#) that MUBUF instructions address through."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import MemoryFault

# Allocations start above 4 GiB so that an address truncated to 32 bits faults instead of aliasing.
MEMORY_BASE = 1 << 32
ALLOCATION_ALIGN = 256


class Memory:
    """Global memory: a bump allocator over one growing byte array; any access outside the allocations faults."""

    def __init__(self) -> None:
        self._bytes = np.zeros(0, dtype=np.uint8)
        self._end = 0  # bytes allocated so far
        self._allocations: list[tuple[int, int]] = []  # (offset, size)

    def alloc(self, size: int, align: int = ALLOCATION_ALIGN) -> int:
        """Reserve `size` zeroed bytes and return their address."""
        offset = -(-self._end // align) * align
        end = offset + size
        if end > len(self._bytes):
            grown = np.zeros(max(end, 2 * len(self._bytes)), dtype=np.uint8)
            grown[: len(self._bytes)] = self._bytes
            self._bytes = grown
        self._end = end
        self._allocations.append((offset, size))
        return MEMORY_BASE + offset

    def put(self, data: bytes | np.ndarray, align: int = ALLOCATION_ALIGN) -> int:
        """Allocate and fill with `data` (bytes or any contiguous array); return the address."""
        raw = np.frombuffer(bytes(data), dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else \
            np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        addr = self.alloc(len(raw), align)
        self._bytes[addr - MEMORY_BASE: addr - MEMORY_BASE + len(raw)] = raw
        return addr

    def read(self, addr: int, size: int) -> np.ndarray:
        """A copy of `size` bytes at `addr` as uint8."""
        offset = self._offset(np.array([addr], dtype=np.int64), size)[0]
        return self._bytes[offset: offset + size].copy()

    def write(self, addr: int, data: bytes | np.ndarray) -> None:
        raw = np.frombuffer(bytes(data), dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else \
            np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        offset = self._offset(np.array([addr], dtype=np.int64), len(raw))[0]
        self._bytes[offset: offset + len(raw)] = raw

    def check(self, addrs: np.ndarray, size: int) -> None:
        """Raise MemoryFault unless every [addr, addr+size) lies inside the allocated memory."""
        self._offset(addrs, size)

    def gather(self, addrs: np.ndarray, size: int) -> np.ndarray:
        """Bytes [addr, addr+size) for each address: uint8 array (len(addrs), size)."""
        offsets = self._offset(addrs, size)
        return self._bytes[offsets[:, None] + np.arange(size)]

    def scatter(self, addrs: np.ndarray, data: np.ndarray) -> None:
        """Write data[i] (uint8 rows) at addrs[i]; later rows win where addresses overlap (lane order)."""
        offsets = self._offset(addrs, data.shape[1])
        self._bytes[offsets[:, None] + np.arange(data.shape[1])] = data

    def _offset(self, addrs: np.ndarray, size: int) -> np.ndarray:
        offsets = np.asarray(addrs, dtype=np.int64) - MEMORY_BASE
        if len(offsets) and (offsets.min() < 0 or offsets.max() + size > self._end):
            bad = int(offsets[(offsets < 0) | (offsets + size > self._end)][0]) + MEMORY_BASE
            raise MemoryFault(f"global access of {size} bytes at {bad:#x} is outside the allocated memory "
                              f"[{MEMORY_BASE:#x}, {MEMORY_BASE + self._end:#x})")
        return offsets


@dataclass(frozen=True)
class BufferResource:
    """A 128-bit buffer resource descriptor (V#) of gfx9-class GPUs."""
    base: int
    stride: int
    num_records: int
    add_tid: bool

    @classmethod
    def from_dwords(cls, d: list[int]) -> BufferResource:
        return cls(base=d[0] | (d[1] & 0xFFFF) << 32, stride=(d[1] >> 16) & 0x3FFF, num_records=d[2],
                   add_tid=bool(d[3] >> 23 & 1))

    @staticmethod
    def dwords(base: int, num_records: int, stride: int = 0) -> list[int]:
        """The four dwords of a raw buffer over [base, base + num_records) (format fields as kernels set them)."""
        return [base & 0xFFFFFFFF, (base >> 32) & 0xFFFF | stride << 16, num_records, 0x00020000]
