"""Reference backend: the numerics model in torch, for CPU tensors and ZYFA_BACKEND=reference.

PLACEHOLDER until zyfa.numerics lands: exact float32 attention on the decoded inputs.
"""

from __future__ import annotations

import math

import torch


def forward(q, k, v, q_descale, k_descale, v_descale, softmax_scale: float, layout: str):
    """q, k, v: padded (seqlen % 256 == 0), contiguous in `layout`; descales: float32 (batch, heads_k) or None.

    Returns out (BF16, same layout as q) and lse (float32, (batch, heads, seqlen), natural log).
    """
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    b, s, h, d = q.shape
    hk = k.shape[2]
    qf, kf, vf = (t.float() for t in (q, k, v))
    if q_descale is not None:
        qf = qf * q_descale.float().repeat_interleave(h // hk, dim=1)[:, None, :, None]
        kf = kf * k_descale.float()[:, None, :, None]
        vf = vf * v_descale.float()[:, None, :, None]
    kf = kf.repeat_interleave(h // hk, dim=2)
    vf = vf.repeat_interleave(h // hk, dim=2)
    scores = torch.einsum("bihd,bjhd->bhij", qf, kf) * softmax_scale
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(mask, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhij,bjhd->bihd", torch.softmax(scores, dim=-1), vf).to(torch.bfloat16)
    if layout == "bhsd":
        out = out.transpose(1, 2).contiguous()
    return out, lse.float()
