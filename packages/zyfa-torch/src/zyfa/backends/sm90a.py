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
TMA_BOX_COLS = 64  # BF16 columns per TMA box: 128 bytes, the widest the 128-byte swizzle allows
TMA_ALIGN = 16  # bytes: TMA needs 16-byte aligned global addresses and strides
SWIZZLE = 128  # bytes: the 128-byte swizzle the kernels' shared-memory layout assumes
DTYPES = {torch.bfloat16: "bf16"}
# d_qk -> the padded length from which the consumer warpgroups issue independently instead of in ping-pong
# (measured on the H200, docs/sm90a.md; at 4K the independent kernels led at both head dims, by 0.5-4%).
INDEPENDENT_FROM_SEQLEN = {128: 4096, 192: 4096}


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
    if x.ptr % TMA_ALIGN or any(st % TMA_ALIGN for st in strides_bytes):
        raise ValueError(f"sm90a: {name} address and strides must be multiples of {TMA_ALIGN} bytes "
                         f"(address {x.ptr:#x}, strides {strides_bytes})")
    return TensorMapSpec(dtype, x.ptr, (d, s, h, b), strides_bytes, (TMA_BOX_COLS, rows, 1, 1))


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


def schedule(d_qk: int, seqlen: int) -> str:
    """The consumer schedule measured faster on the H200 for this head dim and (padded) sequence length."""
    return "pingpong" if seqlen < INDEPENDENT_FROM_SEQLEN.get(d_qk, 0) else "independent"


def find_kernel(dtype: torch.dtype, d_qk: int, d_v: int, seqlen: int):
    """The manifest's kernel for these inputs (dtype one of DTYPES) and the schedule for this length."""
    try:
        return loader().manifest().find(target=TARGET, dtype=DTYPES[dtype], d_qk=d_qk, d_v=d_v,
                                          schedule=schedule(d_qk, seqlen))
    except KeyError as error:
        raise ValueError(f"sm90a: no kernel for head dims d_qk={d_qk}, d_v={d_v}: {error}") from None


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
    if q.dtype not in DTYPES or q_descale is not None:
        raise ValueError(f"sm90a: {q.dtype} inputs are not supported yet: the Hopper kernels take BF16 "
                         f"(FP8 on sm90a is planned); use ZYFA_BACKEND=reference for FP8 on this GPU")
    seqlen = q.shape[1] if layout == "bshd" else q.shape[2]
    return run(find_kernel(q.dtype, q.shape[-1], v.shape[-1], seqlen), q, k, v, softmax_scale, layout)


def host_job_table(batch: int, heads: int, num_tiles: int, grid: int, balanced: bool = True):
    """(rounds, width, 4) jobs over at most `grid` CTAs: balanced (zyfa.jobs.balanced_jobs), or the plain pairs
    round-robin."""
    if balanced:
        return job_tables.balanced_jobs(batch, heads, num_tiles, grid)
    return job_tables.in_rounds(job_tables.paired_jobs(batch, heads, num_tiles), grid)


def run(kernel, q, k, v, softmax_scale: float, layout: str, *, balanced: bool = True):
    """One launch of `kernel` (a manifest entry; the benchmark also passes variants) on the current stream.
    balanced=False walks the plain paired table (for the benchmark's comparison)."""
    qo, ko, vo = (Operand.of(t, layout) for t in (q, k, v))
    batch, seqlen, heads, _ = qo.shape
    out, lse = outputs(q, batch, seqlen, heads, kernel.d_v, layout)
    device = device_index(q)
    jobs = job_table(host_job_table, batch, heads, math.ceil(seqlen / kernel.tile_m), multiprocessors(device),
                     balanced, device=device)
    rounds, grid, _ = jobs.shape
    p = plan(kernel, qo, ko, vo, Operand.of(out, layout), lse.data_ptr(), jobs.data_ptr(), rounds * grid, grid,
             softmax_scale)
    launch(p, device, current_stream(device))
    return out, lse
