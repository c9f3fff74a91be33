"""What the GPU backends share: operand views, output allocation, bounded caches of job tables and prepared
launches, the copies a kernel needs, the loader.

The call path after the first call of a shape: look up the prepared launch of (kernel, device, shapes, strides,
scale), allocate out and lse, fill in the per-call pointers and launch. Nothing is re-derived that a cache holds,
and every cache is bounded (LRU).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

LAYOUTS = ("bshd", "bhsd")
JOB_TABLES = 64  # job tables kept per process (a pinned host and a device copy each, 16 bytes per job)
PREPARED = 256  # prepared launches kept per backend


@dataclass(frozen=True)
class Operand:
    """A (batch, seqlen, heads, dim) view of a tensor in device memory: base address and strides in elements."""

    ptr: int
    shape: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]
    element_bytes: int

    @classmethod
    def of(cls, t: torch.Tensor, layout: str) -> Operand:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        shape, strides = tuple(t.shape), tuple(t.stride())
        if layout == "bhsd":  # (batch, heads, seqlen, dim) -> (batch, seqlen, heads, dim)
            shape = (shape[0], shape[2], shape[1], shape[3])
            strides = (strides[0], strides[2], strides[1], strides[3])
        return cls(t.data_ptr(), shape, strides, t.element_size())


def loader():
    """zyfa_kernels, imported on first use so that the CPU path never loads the native extension."""
    import zyfa_kernels

    return zyfa_kernels


def device_index(t: torch.Tensor) -> int:
    index = t.get_device()  # no torch.device object: -1 for CPU tensors
    return index if index >= 0 else torch.cuda.current_device()


def on_gpu(t: torch.Tensor) -> bool:
    """Whether t lives where the GPU kernels run (a CUDA / ROCm device; the fake device of the host benchmark
    says so for CPU tensors)."""
    return t.is_cuda


def current_stream(device: int) -> int:
    """The raw current stream of `device` (as torch's compiled code reads it: no Stream object is made)."""
    return torch._C._cuda_getCurrentRawStream(device)


def capturing() -> bool:
    """Whether the current stream is capturing a CUDA graph (then what a launch reads must outlive the graph)."""
    return torch._C._cuda_isCurrentStreamCapturing()


def outputs(q: torch.Tensor, batch: int, seqlen: int, heads: int, d_v: int, layout: str):
    """Uninitialised out (BF16, in `layout`) and lse (float32, (batch, heads, seqlen)) on q's device."""
    out_shape = (batch, seqlen, heads, d_v) if layout == "bshd" else (batch, heads, seqlen, d_v)
    out = torch.empty(out_shape, dtype=torch.bfloat16, device=q.device)
    return out, torch.empty((batch, heads, seqlen), dtype=torch.float32, device=q.device)


def padded(t: torch.Tensor, seq_dim: int, length: int) -> torch.Tensor:
    """t zero-padded along seq_dim to `length` rows, contiguous (for kernels that do not mask their last tile).

    Zero padding is exact for causal attention: padded keys come after every real query, so the mask removes
    them, and padded query rows are cut from the results."""
    shape = list(t.shape)
    shape[seq_dim] = length
    out = t.new_zeros(shape)
    out.narrow(seq_dim, 0, t.shape[seq_dim]).copy_(t)
    return out


class LRU:
    """A bounded mapping that drops its least recently used entry; `on_evict(value)` sees each value dropped."""

    def __init__(self, size: int, on_evict: Callable[[object], None] | None = None):
        self.size, self._items, self._on_evict = size, OrderedDict(), on_evict

    def get(self, key: Hashable):
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: Hashable, value) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            _, dropped = self._items.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(dropped)

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()


@dataclass
class JobTable:
    """One job table: the pinned host copy (the asynchronous upload reads it), the device copy, the streams that
    launched with it (so that an evicted table is not reused before their work is done) and whether a CUDA graph
    holds it (then it is never evicted)."""

    host: torch.Tensor
    device: torch.Tensor
    streams: set[int]
    captured: bool = False

    def used_on(self, stream: int) -> None:
        """Record a launch that reads this table on `stream` (per call: a set insert and a capture query)."""
        self.streams.add(stream)
        if not self.captured and capturing():
            self.captured = True
            _captured_tables.append(self)


def release(table: JobTable) -> None:
    """Before the cache drops `table`: keep its memory from reuse until the streams that read it are done."""
    if table.device.is_cuda:
        for stream in table.streams:
            table.device.record_stream(torch.cuda.ExternalStream(stream, device=table.device.device))


def upload(host: np.ndarray, device: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pinned host copy, device copy) of a job table; the copy is asynchronous."""
    pinned = torch.from_numpy(host).pin_memory()
    return pinned, pinned.to(torch.device("cuda", device), non_blocking=True)


_job_tables = LRU(JOB_TABLES, lambda table: release(table))
_captured_tables: list[JobTable] = []  # tables a CUDA graph reads: kept for the life of the process


def job_table(build: Callable[..., np.ndarray], *args, device: int) -> JobTable:
    """The int32 job table build(*args) on `device`, built and uploaded once per (build, args, device) while it
    stays among the JOB_TABLES most recently used. The upload does not wait for the device (graph capture and the
    hot path never synchronise)."""
    key = (build, args, device)
    table = _job_tables.get(key)
    if table is None:
        table = JobTable(*upload(build(*args), device), set())
        _job_tables.put(key, table)
    return table


class Prepared:
    """One kernel's launch for one shape: its Launcher, its job table (None for a pre-pass) and its argument buffer,
    packed once, with the slots of the per-call values (pointers of fresh outputs, descale strides, tensor maps of
    new addresses) that the extension patches in at each launch."""

    __slots__ = ("launcher", "plan", "table", "launch")

    def __init__(self, launcher, plan, table: JobTable, args: dict, per_call: Sequence[str]):
        layout = launcher.kernel.layout
        self.launcher, self.plan, self.table = launcher, plan, table
        slots = [layout.names.index(name) for name in per_call]
        values = [args.get(name) for name in layout.names]
        for slot in slots:  # placeholders of the per-call values' types, packed into the template buffer
            values[slot] = bytes(128) if layout.types[slot] == "tmap" else 0
        self.launch = launcher.prepare(values, slots).launch  # launch(stream, per-call values in per_call's order)
