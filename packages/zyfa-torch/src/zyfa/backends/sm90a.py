"""sm90a backend: causal forward attention on Hopper (compute capability 9.0) through zyfa-kernels' cubins.

The call path never waits for the GPU: the job table of a shape is built on the host and copied to the device once
(asynchronously, then cached), tensor maps are encoded on the host, and the kernel is launched on the current
stream. After the first call of a shape a call can therefore be captured in a CUDA graph.

`plan` is pure (shapes, strides and pointers in; kernel, grid and argument values out) so that it can be tested
without a GPU; `forward` allocates the outputs and launches the plan.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from .. import jobs as job_tables
from ..numerics import LOG2E, fp32
from .device import Operand, current_stream, device_index, job_table, loader, outputs

TARGET = "sm90a"
TMA_BOX_BYTES = 128  # bytes per row of a TMA box: the widest the 128-byte swizzle allows (64 BF16, 128 e4m3)
TMA_ALIGN = 16  # bytes: TMA needs 16-byte aligned global addresses and strides
SWIZZLE = 128  # bytes: the 128-byte swizzle the kernels' shared-memory layout assumes
DTYPES = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8e4m3"}
VT_KEY_GROUP = 16  # FP8 V^T: keys permuted within groups of 16 (attention_fwd_fp8.cu, pack_p)


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
    if x.ptr % TMA_ALIGN or any(st % TMA_ALIGN for st in strides_bytes):
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
    kernel's P needs no exchange between lanes). One pass over V, on the current stream (graph-safe)."""
    vb = v if layout == "bshd" else v.transpose(1, 2)  # (batch, seqlen, heads_k, d_v)
    batch, seqlen, heads_k, d_v = vb.shape
    pad = -seqlen % VT_KEY_GROUP
    if pad:
        vb = torch.nn.functional.pad(vb.view(torch.uint8), (0, 0, 0, 0, 0, pad)).view(v.dtype)
    groups = (seqlen + pad) // VT_KEY_GROUP
    # keys 16 g + 8 a + 2 t + b -> (g, a, t, b) -> positions (g, t, a, b)
    return (vb.reshape(batch, groups, 2, 4, 2, heads_k, d_v).permute(0, 5, 6, 1, 3, 2, 4)
            .reshape(batch, heads_k, d_v, seqlen + pad))


def plan(kernel, q: Operand, k: Operand, v: Operand, out: Operand, lse_ptr: int, jobs_ptr: int, num_jobs: int,
         grid: int, softmax_scale: float, *, vt: torch.Tensor | None = None,
         descales: tuple[int, int, int] | None = None) -> Plan:
    """Kernel arguments for one call. q, k, v, out are (batch, seqlen, heads, dim) views; seqlen is padded to the
    tiles unless the kernel masks its last tiles itself (masks_tail). FP8 kernels take V^T (transposed_v) and the
    device addresses of the (batch, heads_k) float32 descales of q, k and v instead of v."""
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
        extra = dict(zip(("q_descale", "k_descale", "v_descale"), descales, strict=True))
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


def _serves(kernel, seqlen: int) -> bool:
    low, high = kernel.fields.get("seqlen_min"), kernel.fields.get("seqlen_max")
    return (low is None or seqlen >= low) and (high is None or seqlen < high)


def find_kernel(dtype: torch.dtype, d_qk: int, d_v: int, seqlen: int):
    """The manifest's default kernel for these inputs (dtype one of DTYPES) whose [seqlen_min, seqlen_max) holds
    this length."""
    found = [k for k in loader().manifest().kernels
             if k.target == TARGET and k.dtype == DTYPES[dtype] and k.d_qk == d_qk and k.d_v == d_v
             and k.fields.get("p_mode_default", True) and _serves(k, seqlen)]
    if len(found) != 1:
        raise ValueError(f"sm90a: {len(found)} kernels for {DTYPES[dtype]} head dims d_qk={d_qk}, d_v={d_v} at "
                         f"seqlen {seqlen} (need one)")
    return found[0]


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


def forward(q, k, v, q_descale, k_descale, v_descale, softmax_scale: float, layout: str):
    """Interface of every backend: padded inputs contiguous in `layout` -> (out BF16 in `layout`, lse float32)."""
    if q.dtype not in DTYPES:
        raise ValueError(f"sm90a: {q.dtype} inputs are not supported: the Hopper kernels take BF16 or FP8 e4m3")
    seqlen = q.shape[1] if layout == "bshd" else q.shape[2]
    kernel = find_kernel(q.dtype, q.shape[-1], v.shape[-1], seqlen)
    return run(kernel, q, k, v, softmax_scale, layout, descales=(q_descale, k_descale, v_descale))


def host_job_table(batch: int, heads: int, num_tiles: int, grid: int, balanced: bool = True):
    """(rounds, width, 4) jobs over at most `grid` CTAs: balanced (zyfa.jobs.balanced_jobs), or the plain pairs
    round-robin."""
    if balanced:
        return job_tables.balanced_jobs(batch, heads, num_tiles, grid)
    return job_tables.in_rounds(job_tables.paired_jobs(batch, heads, num_tiles), grid)


def run(kernel, q, k, v, softmax_scale: float, layout: str, *, balanced: bool = True, descales=(None, None, None),
        vt=None):
    """One launch of `kernel` (a manifest entry; the benchmark also passes variants) on the current stream.
    balanced=False walks the plain paired table (for the benchmark's comparison). FP8: descales are float32
    (batch, heads_k) tensors (made contiguous here, on the device); vt: transposed_v(v, layout) if already made
    (the benchmark's kernel-only timing)."""
    qo, ko, vo = (Operand.of(t, layout) for t in (q, k, v))
    fp8 = {}
    if kernel.fields.get("v_transposed"):
        fp8["vt"] = transposed_v(v, layout) if vt is None else vt
        kept = tuple(d.contiguous() for d in descales)  # alive until the launch is queued
        fp8["descales"] = tuple(d.data_ptr() for d in kept)
    batch, seqlen, heads, _ = qo.shape
    out, lse = outputs(q, batch, seqlen, heads, kernel.d_v, layout)
    device = device_index(q)
    jobs = job_table(host_job_table, batch, heads, math.ceil(seqlen / kernel.tile_m), multiprocessors(device),
                     balanced, device=device)
    rounds, grid, _ = jobs.shape
    p = plan(kernel, qo, ko, vo, Operand.of(out, layout), lse.data_ptr(), jobs.data_ptr(), rounds * grid, grid,
             softmax_scale, **fp8)
    launch(p, device, current_stream(device))
    return out, lse
