"""Reference backend: the numerics model (zyfa.numerics), for CPU tensors and ZYFA_BACKEND=reference.

It runs the kernels' numerics for the configuration (p_mode by dtype and d_qk, the contract's tau) with the
key tile below, so CPU results are what a kernel computes up to FP32 summation order.
"""

from __future__ import annotations

import torch

from .. import numerics

KEY_TILE = 128  # keys per tile of the reference path (the sm90a kernels' tile)
LAYOUTS = ("bshd", "bhsd")


def forward(q, k, v, q_descale, k_descale, v_descale, softmax_scale: float, layout: str):
    """q, k, v: padded (seqlen % 256 == 0), contiguous in `layout`; descales: float32 (batch, heads_k) or None.

    Returns out (BF16, same layout as q) and lse (float32, (batch, heads, seqlen), natural log).
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
    out, lse = numerics.attention(q, k, v, softmax_scale=softmax_scale, key_tile=KEY_TILE, return_lse=True,
                                  **descales)
    if layout == "bhsd":
        out = out.transpose(1, 2).contiguous()
    return out, lse
