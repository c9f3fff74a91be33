"""sm90a backend: causal forward attention on Hopper (compute capability 9.0) through zyfa-kernels' cubins.

The call path never waits for the GPU: the job table of a shape is built on the host and copied to the device once
(asynchronously, then cached), tensor maps are encoded on the host (cached per address), and the kernel is launched
on the current stream. After the first call of a shape a call can therefore be captured in a CUDA graph.

`plan` is pure (shapes, strides and pointers in; kernel, grid and argument values out) so that it can be tested
without a GPU; `run` prepares a plan once per shape (device.Prepared) and then only fills in each call's pointers.
The kernel comes from the manifest (dispatch.kernel: dtype, head dims, p_mode, the schedule's seqlen range).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch

from .. import jobs as job_tables
from ..numerics import LOG2E, fp32
from . import device as dev
from . import dispatch
from .device import Operand, loader

TARGET = "sm90a"
TMA_BOX_COLS = 64  # BF16 columns per TMA box: 128 bytes, the widest the 128-byte swizzle allows
TMA_ALIGN = 16  # bytes: TMA needs 16-byte aligned global addresses and strides
SWIZZLE = 128  # bytes: the 128-byte swizzle the kernels' shared-memory layout assumes
MAPS = ("q", "k", "v")  # the operands read through tensor maps
# Per-call pointer arguments: fresh outputs each call, descales (FP8) wherever the caller keeps them.
POINTERS = ("out", "lse", "q_descale", "k_descale", "v_descale")


@dataclass(frozen=True)
class TensorMapSpec:
    """Arguments of zyfa_kernels.encode_tensor_map, innermost dimension first: (dim, seqlen, heads, batch)."""

    dtype: str
    address: int
    dims: tuple[int, ...]
    strides_bytes: tuple[int, ...]
    box_dims: tuple[int, ...]
    swizzle: int = SWIZZLE


@dataclass(frozen=True)
class Plan:
    kernel: object  # zyfa_kernels.Kernel
    grid: tuple[int, int, int]
    tensor_maps: dict[str, TensorMapSpec]  # kernel argument name -> tensor map to encode
    args: dict[str, int | float]  # the other kernel arguments


def tensor_map_spec(name: str, x: Operand, dtype: str, rows: int) -> TensorMapSpec:
    b, s, h, d = x.shape
    if x.strides[3] != 1:
        raise ValueError(f"sm90a: {name} must have a contiguous last dimension (stride {x.strides[3]})")
    if d % TMA_BOX_COLS:
        raise ValueError(f"sm90a: {name} head dim {d} must be a multiple of {TMA_BOX_COLS}")
    strides_bytes = tuple(st * x.element_bytes for st in (x.strides[1], x.strides[2], x.strides[0]))
    if not readable(x.ptr, strides_bytes):
        raise ValueError(f"sm90a: {name} address and strides must be multiples of {TMA_ALIGN} bytes "
                         f"(address {x.ptr:#x}, strides {strides_bytes})")
    return TensorMapSpec(dtype, x.ptr, (d, s, h, b), strides_bytes, (TMA_BOX_COLS, rows, 1, 1))


def readable(address: int, strides_bytes) -> bool:
    """Whether TMA can read a view at `address` with these byte strides (16-byte aligned)."""
    return not (address % TMA_ALIGN or any(st % TMA_ALIGN for st in strides_bytes))


def plan(kernel, q: Operand, k: Operand, v: Operand, out: Operand, lse_ptr: int, jobs_ptr: int, num_jobs: int,
         grid: int, softmax_scale: float) -> Plan:
    """Kernel arguments for one call. q, k, v, out are (batch, seqlen, heads, dim) views; seqlen is padded."""
    batch, seqlen, heads, _ = q.shape
    heads_k = k.shape[2]
    if seqlen % kernel.tile_m or seqlen % kernel.tile_n:
        raise ValueError(f"sm90a: seqlen {seqlen} must be a multiple of the tiles ({kernel.tile_m}, {kernel.tile_n})")
    if heads % heads_k:
        raise ValueError(f"sm90a: heads {heads} must be a multiple of heads_k {heads_k}")
    maps = {
        "q": tensor_map_spec("q", q, kernel.dtype, kernel.tile_m),
        "k": tensor_map_spec("k", k, kernel.dtype, kernel.tile_n),
        "v": tensor_map_spec("v", v, kernel.dtype, kernel.tile_n),
    }
    args = {
        "out": out.ptr,
        "lse": lse_ptr,
        "jobs": jobs_ptr,
        "num_jobs": num_jobs,
        "seqlen": seqlen,
        "heads": heads,
        "heads_k": heads_k,
        "scale_log2": fp32(softmax_scale) * LOG2E,  # rounded to FP32 once, when packed, as the model does
        "out_stride_b": out.strides[0],
        "out_stride_s": out.strides[1],
        "out_stride_h": out.strides[2],
    }
    return Plan(kernel, (min(num_jobs, grid), 1, 1), maps, args)


# ---- device-side state, cached -----------------------------------------------------------------------------------


def find_kernel(dtype: torch.dtype, d_qk: int, d_v: int, seqlen: int, p_mode: str | None = None):
    """The manifest's kernel for these inputs: dtype, head dims, p_mode (None: the default) and the schedule
    whose seqlen range holds seqlen."""
    return dispatch.kernel(TARGET, dtype, d_qk, d_v, p_mode, seqlen)


@functools.cache
def multiprocessors(device: int) -> int:
    return int(loader().device_info(TARGET, device)["multiprocessors"])


@functools.lru_cache(maxsize=1024)
def encode(spec: TensorMapSpec) -> bytes:
    return loader().encode_tensor_map(spec.dtype, spec.address, spec.dims, spec.strides_bytes, spec.box_dims,
                                        swizzle=spec.swizzle)


def launch(p: Plan, device: int, stream: int) -> None:
    args = {**p.args, **{name: encode(spec) for name, spec in p.tensor_maps.items()}}
    loader().launch(p.kernel, device=device, grid=p.grid, stream=stream, args=args)


def forward(q, k, v, q_descale, k_descale, v_descale, softmax_scale: float, layout: str, p_mode: str | None = None):
    """Interface of every backend: inputs in `layout` -> (out BF16 contiguous in `layout`, lse float32)."""
    key = (q.dtype, p_mode, layout, softmax_scale, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
           q.get_device())
    prepared = _prepared.get(key)  # the call's kernel and launch, after the first call of its kind
    if prepared is not None and not (q.data_ptr() | k.data_ptr() | v.data_ptr()) % TMA_ALIGN:
        return prepared.run(q, k, v)
    seqlen = q.shape[1] if layout == "bshd" else q.shape[2]
    kernel = find_kernel(q.dtype, q.shape[-1], v.shape[-1], seqlen, p_mode)
    if q_descale is not None:
        raise ValueError(f"sm90a: kernel {kernel.name} takes no descales: FP8 inputs need an FP8 kernel")
    return _first_run(key, kernel, q, k, v, softmax_scale, layout, True)


def host_job_table(batch: int, heads: int, num_tiles: int, grid: int, balanced: bool = True):
    """(rounds, width, 4) jobs over at most `grid` CTAs: balanced (zyfa.jobs.balanced_jobs), or the plain pairs
    round-robin."""
    if balanced:
        return job_tables.balanced_jobs(batch, heads, num_tiles, grid)
    return job_tables.in_rounds(job_tables.paired_jobs(batch, heads, num_tiles), grid)


def _tma_view(t: torch.Tensor) -> torch.Tensor:
    """t itself when TMA can read it (contiguous last dimension, 16-byte aligned address and strides), else a
    contiguous copy (e.g. a channels_last tensor, or a view of every other column)."""
    if t.stride(-1) == 1 and readable(t.data_ptr(), [st * t.element_size() for st in t.stride()[:-1]]):
        return t
    return t.contiguous()


_prepared = dev.LRU(dev.PREPARED, lambda prepared: dev.release(prepared.table))  # bounded


def run(kernel, q, k, v, softmax_scale: float, layout: str, *, balanced: bool = True):
    """One launch of `kernel` (a manifest entry; the benchmark also passes variants) on the current stream, on
    q, k, v of any length and strides: padded to the tiles unless the kernel masks its last tile, copied where TMA
    cannot read them. balanced=False walks the plain paired table (for the benchmark's comparison).

    A call whose shapes, strides and scale were seen before with aligned addresses reuses that call's prepared
    launch: then only the outputs are allocated and the pointers filled in."""
    key = (kernel, balanced, layout, softmax_scale, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
           q.get_device())
    prepared = _prepared.get(key)
    if prepared is None or (q.data_ptr() | k.data_ptr() | v.data_ptr()) % TMA_ALIGN:
        return _first_run(key, kernel, q, k, v, softmax_scale, layout, balanced)
    return prepared.run(q, k, v)


def _first_run(key, kernel, q, k, v, softmax_scale, layout, balanced):
    """run() without a prepared launch (or with misaligned addresses): prepare, cache and run."""
    seq_dim = 1 if layout == "bshd" else 2
    seqlen = q.shape[seq_dim]
    length = seqlen
    if not kernel.masks_tail:
        tile = math.lcm(kernel.tile_m, kernel.tile_n)
        length = -(-seqlen // tile) * tile
    copies = tuple(_tma_view(t) is not t for t in (q, k, v))
    prepared = _Prepared.make(kernel, *(_operand_view(t, seq_dim, length) for t in (q, k, v)), softmax_scale,
                              layout, balanced, seq_dim, seqlen, length, copies)
    if not (q.data_ptr() | k.data_ptr() | v.data_ptr()) % TMA_ALIGN:
        _prepared.put(key, prepared)
    return prepared.run(q, k, v)


def _operand_view(t: torch.Tensor, seq_dim: int, length: int) -> torch.Tensor:
    """What the kernel reads for t: t, its contiguous copy, or its padded copy."""
    if length != t.shape[seq_dim]:
        return dev.padded(t, seq_dim, length)
    return _tma_view(t)


class _Prepared(dev.Prepared):
    """A prepared sm90a launch: also each operand's tensor map template and what each call copies (padding to
    `length` rows, or a contiguous copy of a view TMA cannot read)."""

    __slots__ = ("_maps", "_seq_dim", "_seqlen", "_length", "_copies", "_layout", "_heads", "_d_v")

    @classmethod
    def make(cls, kernel, q, k, v, softmax_scale, layout, balanced, seq_dim, seqlen, length, copies) -> _Prepared:
        """Plan the launch for operands q, k, v as the kernel reads them (copied or padded already)."""
        device = dev.device_index(q)
        qo, ko, vo = (Operand.of(t, layout) for t in (q, k, v))
        batch, _, heads, _ = qo.shape
        build_args = (batch, heads, math.ceil(length / kernel.tile_m), multiprocessors(device), balanced)
        table = dev.job_table(host_job_table, *build_args, device=device)
        out, lse = dev.outputs(q, batch, length, heads, kernel.d_v, layout)
        rounds, grid, _ = table.device.shape
        p = plan(kernel, qo, ko, vo, Operand.of(out, layout), lse.data_ptr(), table.device.data_ptr(),
                 rounds * grid, grid, softmax_scale)
        self = cls(loader().launcher(kernel, device, p.grid), p, table, p.args,
                   [n for n in POINTERS if n in p.args] + list(MAPS))
        self._maps = {name: (spec, encode(spec)) for name, spec in p.tensor_maps.items()}
        self._seq_dim, self._seqlen, self._length, self._copies = seq_dim, seqlen, length, copies
        self._layout, self._heads, self._d_v = layout, heads, kernel.d_v
        return self

    def map(self, name: str, address: int) -> bytes:
        """The tensor map of operand `name` at `address` (the prepared one, or encoded and cached per address)."""
        spec, encoded = self._maps[name]
        if address == spec.address:
            return encoded
        return encode(dataclasses.replace(spec, address=address))

    def run(self, q, k, v):
        if self._length != self._seqlen:
            q, k, v = (dev.padded(t, self._seq_dim, self._length) for t in (q, k, v))
        elif True in self._copies:
            q, k, v = (t.contiguous() if copy else t for t, copy in zip((q, k, v), self._copies, strict=True))
        device = self.launcher.device
        stream = dev.current_stream(device)
        out, lse = dev.outputs(q, q.shape[0], self._length, self._heads, self._d_v, self._layout)
        self.table.used_on(stream)
        self.launch(stream, (out.data_ptr(), lse.data_ptr(), self.map("q", q.data_ptr()), self.map("k", k.data_ptr()),
                             self.map("v", v.data_ptr())))
        if self._length != self._seqlen:
            out = out.narrow(self._seq_dim, 0, self._seqlen).contiguous()
            lse = lse[:, :, :self._seqlen].contiguous()
        return out, lse
