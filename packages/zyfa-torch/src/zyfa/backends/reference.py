"""Reference backend: the numerics model (zyfa.numerics), for CPU tensors and ZYFA_BACKEND=reference.

On the CPU it computes the contract's defaults (FP8: exact P unless p_mode says otherwise). Forced onto a GPU with a
ZYFA kernel target, it computes what that target's kernel for the call computes: the numerics of its manifest
entry (numerics.config_from_kernel), so reference and kernel results differ only by FP32 summation order.
Any sequence length and any strides are taken as they are: nothing is padded or copied.
"""

from __future__ import annotations

import dataclasses

import torch

from .. import numerics
from . import dispatch

LAYOUTS = ("bshd", "bhsd")
KEY_TILE = 128  # keys per tile on the CPU (the sm90a kernels' tile; the model's default)


def numerics_options(q: torch.Tensor, d_v: int, seqlen: int, p_mode: str | None) -> dict:
    """The model's keyword options for a call on q's device (see the module docstring)."""
    target = _kernel_target(q.device)
    if target is None:
        fp8 = q.dtype == torch.float8_e4m3fn
        return {"key_tile": KEY_TILE, **({"p_mode": p_mode or dispatch.CONTRACT_P_MODE} if fp8 else {})}
    kernel = dispatch.kernel(target, q.dtype, q.shape[-1], d_v, p_mode, seqlen)
    return dataclasses.asdict(numerics.config_from_kernel(kernel.fields))


def _kernel_target(device: torch.device) -> str | None:
    if device.type == "cpu":
        return None
    from . import KERNEL_ARCHS, describe

    description = describe(device)
    return KERNEL_ARCHS.get((description.platform, description.arch))


def forward(q, k, v, q_descale, k_descale, v_descale, softmax_scale: float, layout: str, p_mode: str | None = None):
    """q, k, v in `layout`, any length and strides; descales: float32 tensors of one element or (batch, heads_k)
    (broadcast here), or None.

    Returns out (BF16, contiguous in q's layout) and lse (float32, (batch, heads, seqlen), natural log).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    descales = {}
    if q.dtype == torch.float8_e4m3fn:
        descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
        for name, value in descales.items():
            if value is None:
                raise ValueError(f"{name} is required for float8_e4m3fn inputs")
            if value.numel() == 1:
                descales[name] = value.reshape(1, 1).expand(q.shape[0], k.shape[2])
    options = numerics_options(q, v.shape[-1], q.shape[1], p_mode)
    out, lse = numerics.attention(q, k, v, softmax_scale=softmax_scale, return_lse=True, **descales, **options)
    if layout == "bhsd":
        out = out.transpose(1, 2).contiguous()
    return out, lse
