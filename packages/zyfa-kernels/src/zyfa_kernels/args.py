"""Kernel argument buffers: the manifest's ordered argument list packed the way the GPU driver copies it.

Each argument sits at its natural alignment (a 128-byte tensor map at 64 bytes) unless the manifest records the
offset the code object itself declares (`"offset"` in the argument's entry): compilers may place parameters
differently, e.g. nvcc aligns a tensor map's address in the parameter bank, not its offset in the buffer. The
buffer ends with the last argument (CUDA refuses a buffer longer than the kernel's parameters with
CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, measured on an H200), unless the code object declares the size of its
argument segment (gfx950 kernel descriptors do): then it is zero-padded to that size.
"""

from __future__ import annotations

import math
import numbers
import operator
import struct
from dataclasses import dataclass

TENSOR_MAP_BYTES = 128
FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class ArgType:
    code: str  # struct module format
    size: int
    align: int


ARG_TYPES = {
    "ptr": ArgType("Q", 8, 8),
    "i32": ArgType("i", 4, 4),
    "u32": ArgType("I", 4, 4),
    "i64": ArgType("q", 8, 8),
    "f32": ArgType("f", 4, 4),
    "tmap": ArgType(f"{TENSOR_MAP_BYTES}s", TENSOR_MAP_BYTES, 64),
}
INTEGER_RANGES = {
    "ptr": (0, 2**64 - 1),
    "i32": (-(2**31), 2**31 - 1),
    "u32": (0, 2**32 - 1),
    "i64": (-(2**63), 2**63 - 1),
}


@dataclass(frozen=True)
class ArgLayout:
    """Where each argument of one kernel goes in its argument buffer."""

    names: tuple[str, ...]
    types: tuple[str, ...]
    offsets: tuple[int, ...]
    size: int
    packer: struct.Struct
    tmap_positions: tuple[int, ...] = ()  # indices of the tensor maps in `names`

    @classmethod
    def from_manifest(cls, args: list[dict], kernel: str = "kernel", size: int | None = None) -> ArgLayout:
        """The layout of the manifest's `args`; `size` is the argument segment size the object declares."""
        names, types, offsets = [], [], []
        fmt, end = "<", 0
        for index, arg in enumerate(args):
            name, kind = arg.get("name"), arg.get("type")
            if not isinstance(name, str) or not name:
                raise ValueError(f"{kernel}: args[{index}] needs a non-empty string 'name', got {arg!r}")
            if kind not in ARG_TYPES:
                raise ValueError(f"{kernel}: argument {name!r} has type {kind!r}; the types are {sorted(ARG_TYPES)}")
            if name in names:
                raise ValueError(f"{kernel}: argument {name!r} appears twice")
            spec = ARG_TYPES[kind]
            offset = arg.get("offset", math.ceil(end / spec.align) * spec.align)
            if not isinstance(offset, int) or offset < end:
                raise ValueError(f"{kernel}: argument {name!r} has offset {offset!r}; offsets must be integers that "
                                 f"follow the previous argument's end ({end})")
            fmt += "x" * (offset - end) + spec.code
            end = offset + spec.size
            names.append(name)
            types.append(kind)
            offsets.append(offset)
        if size is None:
            size = end
        if not isinstance(size, int) or size < end:
            raise ValueError(f"{kernel}: the declared argument size {size!r} is smaller than the arguments ({end} "
                             f"bytes)")
        fmt += "x" * (size - end)
        return cls(tuple(names), tuple(types), tuple(offsets), size, struct.Struct(fmt),
                   tuple(i for i, kind in enumerate(types) if kind == "tmap"))

    def pack(self, values: dict, kernel: str = "kernel") -> bytes:
        if len(values) != len(self.names) or any(name not in values for name in self.names):
            missing = [name for name in self.names if name not in values]
            extra = sorted(set(values) - set(self.names))
            raise ValueError(f"{kernel}: arguments missing {missing} and unexpected {extra}; "
                             f"it takes exactly {list(self.names)}")
        return self.pack_ordered([values[name] for name in self.names], kernel)

    def pack_ordered(self, ordered, kernel: str = "kernel") -> bytes:
        """The buffer of the values in `names` order (the launch path's form: no dict to build)."""
        # Launches sit on the hot path: let struct do the range and type checks, and explain only a failure.
        # struct would accept what _checked refuses: bools for numbers, and bytes of any length for a tensor map.
        if (len(ordered) == len(self.names) and bool not in map(type, ordered)
                and all(_tensor_map_length(ordered[i]) == TENSOR_MAP_BYTES for i in self.tmap_positions)):
            try:
                return self.packer.pack(*ordered)
            except (struct.error, OverflowError, TypeError):
                pass
        if len(ordered) != len(self.names):
            raise ValueError(f"{kernel}: {len(ordered)} argument values for the {len(self.names)} arguments "
                             f"{list(self.names)}")
        return self.packer.pack(*(_checked(kernel, name, kind, value)
                                  for name, kind, value in zip(self.names, self.types, ordered, strict=True)))


def _tensor_map_length(value) -> int:
    return len(value) if isinstance(value, (bytes, bytearray, memoryview)) else -1


def _checked(kernel: str, name: str, kind: str, value):
    """The value as struct packs it, after the checks struct would do less clearly (or not at all)."""
    if kind == "tmap":
        if not isinstance(value, (bytes, bytearray, memoryview)) or len(value) != TENSOR_MAP_BYTES:
            raise TypeError(f"{kernel}: argument {name!r} (tmap) must be {TENSOR_MAP_BYTES} bytes, as "
                            f"encode_tensor_map returns, got {type(value).__name__}")
        return bytes(value)
    if isinstance(value, bool):
        raise TypeError(f"{kernel}: argument {name!r} ({kind}) must be a number, not bool")
    if kind == "f32":
        if not isinstance(value, numbers.Real):
            raise TypeError(f"{kernel}: argument {name!r} (f32) must be a float, got {type(value).__name__}")
        value = float(value)
        if math.isfinite(value) and abs(value) > FLOAT32_MAX:
            raise ValueError(f"{kernel}: argument {name!r} = {value} overflows f32")
        return value
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{kernel}: argument {name!r} ({kind}) must be an int, got {type(value).__name__}") from None
    low, high = INTEGER_RANGES[kind]
    if not low <= value <= high:
        raise ValueError(f"{kernel}: argument {name!r} = {value} is outside the {kind} range [{low}, {high}]")
    return value
