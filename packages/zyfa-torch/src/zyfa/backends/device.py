"""What the GPU backends share: operand views, output allocation, job tables uploaded once, the loader."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

LAYOUTS = ("bshd", "bhsd")


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
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def current_stream(device: int) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def outputs(q: torch.Tensor, batch: int, seqlen: int, heads: int, d_v: int, layout: str):
    """Uninitialised out (BF16, in `layout`) and lse (float32, (batch, heads, seqlen)) on q's device."""
    out_shape = (batch, seqlen, heads, d_v) if layout == "bshd" else (batch, heads, seqlen, d_v)
    out = torch.empty(out_shape, dtype=torch.bfloat16, device=q.device)
    return out, torch.empty((batch, heads, seqlen), dtype=torch.float32, device=q.device)


def job_table(build: Callable[..., np.ndarray], *args, device: int) -> torch.Tensor:
    """The int32 job table build(*args) on `device`, uploaded once per (build, args, device).

    The copy does not wait for the device (graph capture and the hot path never synchronise), so the pinned host
    source stays cached beside the table for as long as the copy may still read it.
    """
    return _upload(build, args, device)[0]


@functools.cache
def _upload(build, args: tuple, device: int) -> tuple[torch.Tensor, torch.Tensor]:
    host = torch.from_numpy(build(*args)).pin_memory()
    return host.to(torch.device("cuda", device), non_blocking=True), host
