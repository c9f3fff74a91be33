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
TMA_BOX_BYTES = 128  # bytes per row of a TMA box: the widest the 128-byte swizzle allows (64 BF16, 128 e4m3)
TMA_ALIGN = 16  # bytes: TMA needs 16-byte aligned global addresses and strides
SWIZZLE = 128  # bytes: the 128-byte swizzle the kernels' shared-memory layout assumes
VT_KEY_GROUP = 16  # FP8 V^T: keys permuted within groups of 16 (asmgen/sm90a/softmax_fp8.cuh, pack_p)
DESCALES = ("q_descale", "k_descale", "v_descale")
# Per-call arguments: fresh outputs each call; FP8 descales wherever the caller keeps them, each read at
# batch * stride_b + head_k * stride_h (element strides; (0, 0) for a one-element descale).
DESCALE_ARGS = (*DESCALES, *(f"{name}_stride_{dim}" for name in DESCALES for dim in "bh"))
POINTERS = ("out", "lse", *DESCALE_ARGS)
INT32_MAX = 2**31 - 1
MAPS_PER_LAUNCH = 64  # encoded tensor maps a prepared launch keeps (by operand and address)
GRID_YZ_MAX = 65535  # CUDA's limit on a grid's y and z sizes


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


def tensor_map_spec(name: str, x: Operand, dtype: str, rows: int, box_cols: int | None = None) -> TensorMapSpec:
    """A 4-d map of x's (dim, seqlen, heads, batch) in boxes of `rows` by 128 bytes (box_cols elements); a dim
    that is not a multiple of the box reads its last box's columns past the end as zeros."""
    b, s, h, d = x.shape
    box_cols = box_cols or TMA_BOX_BYTES // x.element_bytes
    if x.strides[3] != 1:
        raise ValueError(f"sm90a: {name} must have a contiguous last dimension (stride {x.strides[3]})")
    if d % 64:
        raise ValueError(f"sm90a: {name} head dim {d} must be a multiple of 64")
    strides_bytes = tuple(st * x.element_bytes for st in (x.strides[1], x.strides[2], x.strides[0]))
    if not readable(x.ptr, strides_bytes):
        raise ValueError(f"sm90a: {name} address and strides must be multiples of {TMA_ALIGN} bytes "
                         f"(address {x.ptr:#x}, strides {strides_bytes})")
    return TensorMapSpec(dtype, x.ptr, (d, s, h, b), strides_bytes, (box_cols, rows, 1, 1))


def vt_map_spec(vt: torch.Tensor, kernel) -> TensorMapSpec:
    """V^T (batch, heads_k, d_v, keys) in boxes of 128 keys by d_v rows."""
    b, h, d, s = vt.shape
    strides_bytes = (vt.stride(2), vt.stride(1), vt.stride(0))  # one byte per element
    return TensorMapSpec(kernel.dtype, vt.data_ptr(), (s, d, h, b), strides_bytes, (kernel.tile_n, d, 1, 1))


def transposed_v(v: torch.Tensor, layout: str) -> torch.Tensor:
    """FP8 V as the kernels read it: (batch, heads_k, d_v, keys), keys contiguous, zero-padded to a multiple of 16
    and permuted within each 16 (position 4t + 2a + b holds key 8a + 2t + b: the P operand's order, so that the
    kernel's P needs no exchange between lanes). On a GPU one launch of the manifest's transpose_v kernel on the
    current stream (graph-safe; its launch prepared once per shape and strides), elsewhere transposed_v_reference;
    the two are bitwise equal (ci/gpu_check.py)."""
    if not dev.on_gpu(v):
        return transposed_v_reference(v, layout)
    vb = v if layout == "bshd" else v.transpose(1, 2)  # (batch, seqlen, heads_k, d_v)
    if vb.data_ptr() % TMA_ALIGN:
        vb = vb.contiguous()
    key = (vb.shape, vb.stride(), vb.get_device())
    launch = _transposes.get(key)
    if launch is None:
        if vb.stride(3) != 1 or any(st % TMA_ALIGN for st in vb.stride()[:3]):  # 16-byte rows the kernel loads
            return transposed_v(vb.contiguous(), "bshd")
        launch = _TransposeLaunch(vb)
        _transposes.put(key, launch)
    return launch.run(vb)


class _TransposeLaunch:
    """The transpose_v launch of one V shape and strides (16-byte aligned rows): its prepared launch and V^T's
    shape. The attention launch of an FP8 shape holds one, so its calls skip transposed_v's lookup."""

    __slots__ = ("launch", "device", "shape")

    def __init__(self, vb: torch.Tensor):
        kernel = transpose_kernel(vb.shape[3])
        grid, args = transpose_plan(kernel, tuple(vb.shape), tuple(vb.stride()))
        self.device = dev.device_index(vb)
        self.launch = dev.Prepared(loader().launcher(kernel, self.device, grid), None, None, args, ("v", "vt")).launch
        batch, _, heads_k, d_v = vb.shape
        self.shape = (batch, heads_k, d_v, args["keys"])

    def run(self, vb: torch.Tensor, stream: int | None = None) -> torch.Tensor:
        """V^T of vb (of this launch's shape and strides, 16-byte aligned) on `stream` (None: the current one)."""
        vt = torch.empty(self.shape, dtype=vb.dtype, device=vb.device)
        self.launch(dev.current_stream(self.device) if stream is None else stream, (vb.data_ptr(), vt.data_ptr()))
        return vt


_transposes = dev.LRU(dev.PREPARED)  # (shape, strides, device) of V -> its _TransposeLaunch


@functools.lru_cache(maxsize=8)
def transpose_kernel(d_v: int):
    """The manifest's V^T pre-pass for head dim d_v."""
    return dispatch.manifest().find(TARGET, kind="transpose_v", dtype="fp8e4m3", d_v=d_v)


def transpose_plan(kernel, shape: tuple[int, int, int, int], strides: tuple[int, ...]):
    """(grid, arguments) of the transpose_v kernel on V (batch, seqlen, heads_k, d_v) with these element strides:
    one CTA per tile of tile_keys keys, kv head and batch; V^T rows of seqlen rounded up to key_group keys."""
    batch, seqlen, heads_k, d_v = shape
    if d_v != kernel.d_v or strides[3] != 1:
        raise ValueError(f"sm90a: {kernel.name} takes V with head dim {kernel.d_v}, contiguous (got {d_v}, stride "
                         f"{strides[3]})")
    keys = -(-seqlen // kernel.key_group) * kernel.key_group
    if batch > GRID_YZ_MAX or heads_k > GRID_YZ_MAX:
        raise ValueError(f"sm90a: {kernel.name} takes at most {GRID_YZ_MAX} batches and kv heads (grid y and z), "
                         f"got batch {batch}, heads_k {heads_k}")
    args = {"seqlen": seqlen, "keys": keys, "v_stride_b": strides[0], "v_stride_s": strides[1],
            "v_stride_h": strides[2]}
    return (-(-keys // kernel.tile_keys), heads_k, batch), args


def transposed_v_reference(v: torch.Tensor, layout: str) -> torch.Tensor:
    """transposed_v in torch operations (pad, permute, copy): the CPU path and the GPU check's oracle."""
    vb = v if layout == "bshd" else v.transpose(1, 2)  # (batch, seqlen, heads_k, d_v)
    batch, seqlen, heads_k, d_v = vb.shape
    pad = -seqlen % VT_KEY_GROUP
    if pad:
        vb = torch.nn.functional.pad(vb.view(torch.uint8), (0, 0, 0, 0, 0, pad)).view(v.dtype)
    groups = (seqlen + pad) // VT_KEY_GROUP
    # keys 16 g + 8 a + 2 t + b -> (g, a, t, b) -> positions (g, t, a, b)
    return (vb.reshape(batch, groups, 2, 4, 2, heads_k, d_v).permute(0, 5, 6, 1, 3, 2, 4)
            .reshape(batch, heads_k, d_v, seqlen + pad))


def readable(address: int, strides_bytes) -> bool:
    """Whether TMA can read a view at `address` with these byte strides (16-byte aligned)."""
    return not (address % TMA_ALIGN or any(st % TMA_ALIGN for st in strides_bytes))


def plan(kernel, q: Operand, k: Operand, v: Operand, out: Operand, lse_ptr: int, jobs_ptr: int, num_jobs: int,
         grid: int, softmax_scale: float, *, vt: torch.Tensor | None = None,
         descales: tuple[int, ...] | None = None) -> Plan:
    """Kernel arguments for one call. q, k, v, out are (batch, seqlen, heads, dim) views; seqlen is padded to the
    tiles unless the kernel masks its last tiles itself (masks_tail). FP8 kernels take V^T (transposed_v) and the
    descale arguments (descale_args: the float32 descales' addresses, then their (stride_b, stride_h)) instead of v."""
    batch, seqlen, heads, _ = q.shape
    heads_k = k.shape[2]
    if not kernel.fields.get("masks_tail") and (seqlen % kernel.tile_m or seqlen % kernel.tile_n):
        raise ValueError(f"sm90a: seqlen {seqlen} must be a multiple of the tiles ({kernel.tile_m}, {kernel.tile_n})")
    if heads % heads_k:
        raise ValueError(f"sm90a: heads {heads} must be a multiple of heads_k {heads_k}")
    maps = {
        "q": tensor_map_spec("q", q, kernel.dtype, kernel.tile_m),
        "k": tensor_map_spec("k", k, kernel.dtype, kernel.tile_n),
    }
    extra = {}
    if kernel.fields.get("v_transposed"):
        if vt is None or descales is None:
            raise ValueError(f"sm90a: {kernel.name} takes V^T and the descales")
        maps["vt"] = vt_map_spec(vt, kernel)
        extra = dict(zip(DESCALE_ARGS, descales, strict=True))
    else:
        maps["v"] = tensor_map_spec("v", v, kernel.dtype, kernel.tile_n)
    args = {
        **extra,
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
    """Interface of every backend: inputs in `layout` -> (out BF16 contiguous in `layout`, lse float32). FP8
    descales are float32 tensors on the device of one element or of shape (batch, heads_k), any strides
    (checks.descales), BF16's None."""
    descales = (q_descale, k_descale, v_descale)
    key = (q.dtype, p_mode, layout, softmax_scale, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
           q.get_device())
    prepared = _prepared.get(key)  # the call's kernel and launch, after the first call of its kind
    if prepared is not None and not (q.data_ptr() | k.data_ptr() | v.data_ptr()) % TMA_ALIGN:
        return prepared.run(q, k, v, descales)
    seqlen = q.shape[1] if layout == "bshd" else q.shape[2]
    kernel = find_kernel(q.dtype, q.shape[-1], v.shape[-1], seqlen, p_mode)
    return _first_run(key, kernel, q, k, v, softmax_scale, layout, True, descales, None)


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


def run(kernel, q, k, v, softmax_scale: float, layout: str, *, balanced: bool = True, descales=(None, None, None),
        vt=None):
    """One launch of `kernel` (a manifest entry; the benchmark also passes variants) on the current stream, on
    q, k, v of any length and strides: padded to the tiles unless the kernel masks its last tile, copied where TMA
    cannot read them. balanced=False walks the plain paired table (for the benchmark's comparison). FP8 kernels
    (v_transposed) also take the float32 descales (one element or (batch, heads_k), any strides) and read V^T:
    transposed_v(v, layout), made here unless given (the benchmark's kernel-only timing passes it).

    A call whose shapes, strides and scale were seen before with aligned addresses reuses that call's prepared
    launch: then only the outputs (and V^T) are allocated and the pointers filled in."""
    key = (kernel, balanced, layout, softmax_scale, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
           q.get_device())
    prepared = _prepared.get(key)
    if prepared is None or (q.data_ptr() | k.data_ptr() | v.data_ptr()) % TMA_ALIGN:
        return _first_run(key, kernel, q, k, v, softmax_scale, layout, balanced, descales, vt)
    return prepared.run(q, k, v, descales, vt)


def _first_run(key, kernel, q, k, v, softmax_scale, layout, balanced, descales, vt):
    """run() without a prepared launch (or with misaligned addresses): prepare, cache and run."""
    seq_dim = 1 if layout == "bshd" else 2
    seqlen = q.shape[seq_dim]
    length = seqlen
    if not kernel.masks_tail:
        tile = math.lcm(kernel.tile_m, kernel.tile_n)
        length = -(-seqlen // tile) * tile
    copies = tuple(_tma_view(t) is not t for t in (q, k, v))
    operands = tuple(_operand_view(t, seq_dim, length) for t in (q, k, v))
    if kernel.fields.get("v_transposed") and vt is None:
        vt = transposed_v(operands[2], layout)  # made once: the plan's tensor map and this call's launch share it
    prepared = _Prepared.make(kernel, *operands, softmax_scale, layout, balanced, seq_dim, seqlen, length, copies,
                              descales, vt)
    if not (q.data_ptr() | k.data_ptr() | v.data_ptr()) % TMA_ALIGN:
        _prepared.put(key, prepared)
    return prepared.run(q, k, v, descales, vt)


def _operand_view(t: torch.Tensor, seq_dim: int, length: int) -> torch.Tensor:
    """What the kernel reads for t: t, its contiguous copy, or its padded copy."""
    if length != t.shape[seq_dim]:
        return dev.padded(t, seq_dim, length)
    return _tma_view(t)


def descale_args(descales) -> tuple[int, ...]:
    """The kernel's descale arguments: the three addresses, then each descale's (stride_b, stride_h) in elements,
    (0, 0) for one element. Nothing is copied unless a stride exceeds int32 (a view into a huge tensor)."""
    strides = []
    for d in descales:
        if d.numel() == 1:
            strides += (0, 0)
        else:
            strides += d.stride()
    if max(strides) > INT32_MAX:
        return descale_args(tuple(d.contiguous() for d in descales))
    return (descales[0].data_ptr(), descales[1].data_ptr(), descales[2].data_ptr(), *strides)


def _descale_args(kernel, descales) -> tuple[int, ...] | None:
    if not kernel.fields.get("v_transposed"):
        return None
    if any(d is None for d in descales):
        raise ValueError(f"sm90a: {kernel.name} takes q_descale, k_descale and v_descale (FP8 inputs)")
    return descale_args(descales)


class _Prepared(dev.Prepared):
    """A prepared sm90a launch: also each operand's tensor map template and what each call copies (padding to
    `length` rows, or a contiguous copy of a view TMA cannot read; V^T for FP8)."""

    __slots__ = ("_maps", "_encoded", "_transpose", "_seq_dim", "_seqlen", "_length", "_copies", "_layout", "_heads",
                 "_d_v", "_fp8")

    @classmethod
    def make(cls, kernel, q, k, v, softmax_scale, layout, balanced, seq_dim, seqlen, length, copies,
             descales, vt=None) -> _Prepared:
        """Plan the launch for operands q, k, v as the kernel reads them (copied or padded already)."""
        device = dev.device_index(q)
        qo, ko, vo = (Operand.of(t, layout) for t in (q, k, v))
        batch, _, heads, _ = qo.shape
        build_args = (batch, heads, math.ceil(length / kernel.tile_m), multiprocessors(device), balanced)
        table = dev.job_table(host_job_table, *build_args, device=device)
        out, lse = dev.outputs(q, batch, length, heads, kernel.d_v, layout)
        rounds, grid, _ = table.device.shape
        pointers = _descale_args(kernel, descales)
        fp8 = {} if pointers is None else {"vt": transposed_v(v, layout) if vt is None else vt, "descales": pointers}
        p = plan(kernel, qo, ko, vo, Operand.of(out, layout), lse.data_ptr(), table.device.data_ptr(),
                 rounds * grid, grid, softmax_scale, **fp8)
        self = cls(loader().launcher(kernel, device, p.grid), p, table, p.args,
                   [n for n in POINTERS if n in p.args] + list(p.tensor_maps))
        self._maps = dict(p.tensor_maps)
        self._encoded = {(name, spec.address): encode(spec) for name, spec in p.tensor_maps.items()}
        self._seq_dim, self._seqlen, self._length, self._copies = seq_dim, seqlen, length, copies
        self._layout, self._heads, self._d_v, self._fp8 = layout, heads, kernel.d_v, pointers is not None
        self._transpose = None  # V^T through transposed_v, or straight through this shape's transpose launch:
        vb = v if layout == "bshd" else v.transpose(1, 2)
        if self._fp8 and dev.on_gpu(v) and vb.stride(3) == 1 and not any(st % TMA_ALIGN for st in vb.stride()[:3]):
            self._transpose = _TransposeLaunch(vb)
        return self

    def map(self, name: str, address: int) -> bytes:
        """The tensor map of operand `name` at `address`, encoded once per address (a caching allocator hands the
        same blocks back; at most MAPS_PER_LAUNCH kept per launch, emptied when full)."""
        encoded = self._encoded.get((name, address))
        if encoded is None:
            encoded = encode(dataclasses.replace(self._maps[name], address=address))
            if len(self._encoded) >= MAPS_PER_LAUNCH:
                self._encoded.clear()  # bounded, and safe under threads: start over
            self._encoded[(name, address)] = encoded
        return encoded

    def run(self, q, k, v, descales=(None, None, None), vt=None):
        if self._length != self._seqlen:
            q, k, v = (dev.padded(t, self._seq_dim, self._length) for t in (q, k, v))
        elif True in self._copies:
            q, k, v = (t.contiguous() if copy else t for t, copy in zip((q, k, v), self._copies, strict=True))
        device = self.launcher.device
        stream = dev.current_stream(device)
        out, lse = dev.outputs(q, q.shape[0], self._length, self._heads, self._d_v, self._layout)
        self.table.used_on(stream)
        if self._fp8:
            if vt is None:  # v's strides are the prepared ones and its address 16-byte aligned (forward checks)
                vt = (transposed_v(v, self._layout) if self._transpose is None
                      else self._transpose.run(v if self._layout == "bshd" else v.transpose(1, 2), stream))
            per_call = (out.data_ptr(), lse.data_ptr(), *descale_args(descales), self.map("q", q.data_ptr()),
                        self.map("k", k.data_ptr()), self.map("vt", vt.data_ptr()))
        else:
            per_call = (out.data_ptr(), lse.data_ptr(), self.map("q", q.data_ptr()), self.map("k", k.data_ptr()),
                        self.map("v", v.data_ptr()))
        self.launch(stream, per_call)
        if self._length != self._seqlen:
            out = out.narrow(self._seq_dim, 0, self._seqlen).contiguous()
            lse = lse[:, :, :self._seqlen].contiguous()
        return out, lse
