"""gfx950 backend: causal forward attention on MI355X through zyfa-kernels' code objects (FP8: assembly, BF16: HIP C++).

The call path never waits for the GPU: the chiplet-ordered job table of a shape is built on the host and copied to
the device once (then cached), the descales stay on the device (the kernel reads them), and the kernel is launched
on the current stream.

`plan` is pure (shapes, strides and pointers in; kernel, grid and argument values out) so that it can be tested
without a GPU; `forward` prepares a plan once per shape (device.Prepared) and then only fills in each call's
pointers. The kernel comes from the manifest (dispatch.kernel: dtype, head dims, p_mode, offset_bits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import jobs as job_tables
from . import device as dev
from . import dispatch
from .device import Operand, loader

TARGET = "gfx950"
CHIPLETS = 8  # XCDs of an MI355X: workgroup w runs on chiplet w % 8
OFFSET_LIMIT = 2**32  # 32-bit kernels: the FP8 assembly addresses each (batch, head) slice with buffer offsets,
# the BF16 HIP kernels each whole tensor from its base
POINTERS = ("q", "k", "v", "out", "lse", "q_descale", "k_descale", "v_descale")  # per call


@dataclass(frozen=True)
class Plan:
    kernel: object  # zyfa_kernels.Kernel
    grid: tuple[int, int, int]
    args: dict[str, int | float]  # every kernel argument, by name


def span_bytes(dtype: str, shape, strides, element_bytes: int) -> int:
    """Bytes from the base a 32-bit kernel of `dtype` addresses for a (batch, seqlen, heads, dim) operand: one
    (batch, head) slice for the FP8 assembly kernels, the whole tensor for the BF16 HIP kernels."""
    b, s, h, d = shape
    if dtype == "bf16":
        return ((b - 1) * strides[0] + (s - 1) * strides[1] + (h - 1) * strides[2] + d) * element_bytes
    return ((s - 1) * strides[1] + d) * element_bytes


def _check_operand(name: str, x: Operand, kernel) -> None:
    if x.strides[3] != 1:
        raise ValueError(f"gfx950: {name} must have a contiguous last dimension (stride {x.strides[3]})")
    span = span_bytes(kernel.dtype, x.shape, x.strides, x.element_bytes)
    if kernel.offset_bits == 32 and span > OFFSET_LIMIT:
        raise ValueError(f"gfx950: {name} spans {span} bytes from its base; kernel {kernel.name} addresses at most "
                         f"{OFFSET_LIMIT} (2^32) bytes with its 32-bit offsets")


def plan(kernel, q: Operand, k: Operand, v: Operand, out: Operand, lse_ptr: int,
         descale_ptrs: tuple[int, int, int], jobs_ptr: int, num_jobs: int, softmax_scale: float) -> Plan:
    """Kernel arguments for one call. q, k, v, out are (batch, seqlen, heads, dim) views; seqlen is padded.

    descale_ptrs are the float32 (batch, heads_k) arrays of q, k and v (0 for BF16); jobs_ptr the int32 job table
    (num_jobs rows [batch, head, tile_lo, tile_hi], chiplet-ordered for the kernel's persistent grid)."""
    batch, seqlen, heads, d_qk = q.shape
    heads_k, d_v = k.shape[2], v.shape[3]
    if seqlen % kernel.tile_m:
        raise ValueError(f"gfx950: seqlen {seqlen} must be a multiple of the query tile {kernel.tile_m}")
    if heads % heads_k:
        raise ValueError(f"gfx950: heads {heads} must be a multiple of heads_k {heads_k}")
    if (d_qk, d_v) != (kernel.d_qk, kernel.d_v):
        raise ValueError(f"gfx950: kernel {kernel.name} takes d_qk={kernel.d_qk}, d_v={kernel.d_v}; "
                         f"got {d_qk}, {d_v}")
    if k.shape[:3] != v.shape[:3] or k.shape[:2] != q.shape[:2]:
        raise ValueError(f"gfx950: k {k.shape} and v {v.shape} must match q {q.shape} in batch and seqlen "
                         f"and each other in heads")
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out)):
        _check_operand(name, x, kernel)
    args = {
        "q": q.ptr, "k": k.ptr, "v": v.ptr, "out": out.ptr, "lse": lse_ptr,
        "q_descale": descale_ptrs[0], "k_descale": descale_ptrs[1], "v_descale": descale_ptrs[2],
        "jobs": jobs_ptr, "num_jobs": num_jobs, "seqlen": seqlen, "heads": heads, "heads_k": heads_k,
        "softmax_scale": float(softmax_scale),
    }
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out)):
        args.update({f"{name}_stride_b": x.strides[0], f"{name}_stride_s": x.strides[1],
                     f"{name}_stride_h": x.strides[2]})
    return Plan(kernel, (kernel.grid_size, 1, 1), args)


# ---- device-side state, cached -----------------------------------------------------------------------------------


def find_kernel(dtype: torch.dtype, d_qk: int, d_v: int, seqlen: int = 1, p_mode: str | None = None,
                span_bytes: int = 0):
    return dispatch.kernel(TARGET, dtype, d_qk, d_v, p_mode, seqlen, span_bytes)


def host_job_table(batch: int, heads: int, num_tiles: int, grid: int):
    """Paired causal jobs, remapped so each chiplet walks consecutive pairs of one head."""
    return job_tables.chiplet_order(job_tables.paired_jobs(batch, heads, num_tiles), grid, CHIPLETS)


def launch(p: Plan, device: int, stream: int) -> None:
    loader().launch(p.kernel, device=device, grid=p.grid, stream=stream, args=p.args)


def _check_descale(name: str, t, batch: int, heads_k: int, device: torch.device) -> None:
    if t is None:
        raise ValueError(f"gfx950: {name} is required for FP8 inputs (a float32 tensor of shape (batch, heads_k))")
    if t.dtype != torch.float32 or tuple(t.shape) != (batch, heads_k) or not t.is_contiguous() or t.device != device:
        raise ValueError(f"gfx950: {name} must be a contiguous float32 tensor of shape ({batch}, {heads_k}) on "
                         f"{device}; got {t.dtype} {tuple(t.shape)} on {t.device}")


_prepared = dev.LRU(dev.PREPARED, lambda prepared: dev.release(prepared.table))  # bounded


def forward(q, k, v, q_descale, k_descale, v_descale, softmax_scale: float, layout: str, p_mode: str | None = None):
    """Interface of every backend: inputs in `layout`, any length and strides -> (out BF16 contiguous in `layout`,
    lse float32). Inputs are padded to the tiles unless the kernel masks its last tile, and copied where the
    kernel cannot read the view (a last dimension that is not contiguous). A call whose shapes, strides, scale and
    p_mode were seen before reuses that call's prepared launch."""
    if q_descale is not None:  # the kernels read contiguous (batch, heads_k) descales
        shape = (q.shape[0], k.shape[2 if layout == "bshd" else 1])
        q_descale, k_descale, v_descale = (_per_kv_head(d, shape) for d in (q_descale, k_descale, v_descale))
    key = (q.dtype, layout, p_mode, softmax_scale, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
           q.get_device())
    prepared = _prepared.get(key)
    if prepared is None:
        prepared = _GfxPrepared.make(q, k, v, q_descale, k_descale, v_descale, softmax_scale, layout, p_mode)
        _prepared.put(key, prepared)
    return prepared.run(q, k, v, q_descale, k_descale, v_descale)


def _per_kv_head(d: torch.Tensor | None, shape: tuple[int, int]) -> torch.Tensor | None:
    """A descale of one element or of shape (batch, heads_k), any strides, as the contiguous (batch, heads_k)
    tensor the kernels read (copied only where it is not one already); anything else is left to _check_descale."""
    if d is None or d.is_contiguous() and tuple(d.shape) == shape:
        return d
    if d.numel() == 1:
        return d.reshape(1, 1).expand(shape).contiguous()
    return d.contiguous() if tuple(d.shape) == shape else d


def _pointers(descales) -> tuple[int, int, int]:
    return tuple(0 if d is None else d.data_ptr() for d in descales)


class _GfxPrepared(dev.Prepared):
    """A prepared gfx950 launch and what each call copies (padding to `length` rows, or contiguous copies)."""

    __slots__ = ("_seq_dim", "_seqlen", "_length", "_copies", "_layout", "_heads", "_heads_k", "_d_v")

    @classmethod
    def make(cls, q, k, v, q_descale, k_descale, v_descale, softmax_scale, layout, p_mode) -> _GfxPrepared:
        seq_dim = 1 if layout == "bshd" else 2
        seqlen = q.shape[seq_dim]
        copies = tuple(t.stride(-1) != 1 for t in (q, k, v))
        dtype = "bf16" if q.dtype == torch.bfloat16 else "fp8e4m3"
        views = [Operand.of(t.contiguous() if copy else t, layout) for t, copy in zip((q, k, v), copies, strict=True)]
        span = max(span_bytes(dtype, x.shape, x.strides, x.element_bytes) for x in views)
        kernel = find_kernel(q.dtype, q.shape[-1], v.shape[-1], seqlen, p_mode, span)
        length = seqlen if kernel.masks_tail else -(-seqlen // kernel.tile_m) * kernel.tile_m
        if length != seqlen:
            q, k, v = (dev.padded(t, seq_dim, length) for t in (q, k, v))
        else:
            q, k, v = (t.contiguous() if copy else t for t, copy in zip((q, k, v), copies, strict=True))
        batch, heads = q.shape[0], q.shape[2 if layout == "bshd" else 1]
        heads_k = k.shape[2 if layout == "bshd" else 1]
        descales = (q_descale, k_descale, v_descale)
        if kernel.dtype == "bf16":
            descales = (None, None, None)  # the BF16 kernels read no descales: null pointers
        else:
            for name, t in zip(("q_descale", "k_descale", "v_descale"), descales, strict=True):
                _check_descale(name, t, batch, heads_k, q.device)
        device = dev.device_index(q)
        table = dev.job_table(host_job_table, batch, heads, math.ceil(length / kernel.tile_m), kernel.grid_size,
                              device=device)
        out, lse = dev.outputs(q, batch, length, heads, kernel.d_v, layout)
        p = plan(kernel, Operand.of(q, layout), Operand.of(k, layout), Operand.of(v, layout), Operand.of(out, layout),
                 lse.data_ptr(), _pointers(descales),
                 table.device.data_ptr(), table.device.shape[0], softmax_scale)
        self = cls(loader().launcher(kernel, device, p.grid), p, table, p.args, POINTERS)
        self._seq_dim, self._seqlen, self._length, self._copies = seq_dim, seqlen, length, copies
        self._layout, self._heads, self._heads_k, self._d_v = layout, heads, heads_k, kernel.d_v
        return self

    def run(self, q, k, v, q_descale, k_descale, v_descale):
        if self._length != self._seqlen:
            q, k, v = (dev.padded(t, self._seq_dim, self._length) for t in (q, k, v))
        elif True in self._copies:
            q, k, v = (t.contiguous() if copy else t for t, copy in zip((q, k, v), self._copies, strict=True))
        stream = dev.current_stream(self.launcher.device)
        out, lse = dev.outputs(q, q.shape[0], self._length, self._heads, self._d_v, self._layout)
        self.table.used_on(stream)
        self.launch(stream, (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                             *_pointers((q_descale, k_descale, v_descale))))
        if self._length != self._seqlen:
            out = out.narrow(self._seq_dim, 0, self._seqlen).contiguous()
            lse = lse[:, :, :self._seqlen].contiguous()
        return out, lse
