"""The float64 causal attention every accuracy figure is measured against, and the error measures.

Inputs are decoded exactly (BF16 or e4m3 values times their descales) and attention is computed in float64
with an exact softmax, a few query rows at a time so that memory stays bounded at long sequences.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

SCORES_PER_STEP = 1 << 22  # float64 scores held at once (32 MiB)


def decode(t: torch.Tensor, descale) -> torch.Tensor:
    """t (batch, seqlen, heads_t, dim) as float64 times its descale per (batch, kv head).

    descale: a float or a tensor broadcastable to (batch, kv heads); for q (heads_t = kv heads * group) the
    descale of kv head g applies to query heads g*group .. (g+1)*group - 1, as in GQA.
    """
    out = t.double()
    if isinstance(descale, torch.Tensor):
        batch, _, heads_t, _ = t.shape
        kv_heads = descale.shape[-1] if descale.dim() else 1
        per_head = torch.broadcast_to(descale.to(t.device, torch.float64), (batch, kv_heads))
        per_head = per_head.repeat_interleave(heads_t // kv_heads, 1)
        out = out * per_head[:, None, :, None]
    elif descale != 1.0:
        out = out * float(descale)
    return out


def causal_scores(q64: torch.Tensor, k64: torch.Tensor, softmax_scale: float) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield (first row, scores) with scores (batch, heads, rows, seqlen) float64, natural-log units, masked -inf.

    q64: (batch, seqlen, heads, d) and k64: (batch, seqlen, heads_k, d) decoded float64 tensors.
    """
    batch, seqlen, heads, _ = q64.shape
    group = heads // k64.shape[2]
    kh = k64.repeat_interleave(group, dim=2).permute(0, 2, 3, 1)  # (batch, heads, d, seqlen)
    rows = max(1, SCORES_PER_STEP // (batch * heads * seqlen))
    for first in range(0, seqlen, rows):
        last = min(seqlen, first + rows)
        s = torch.matmul(q64[:, first:last].permute(0, 2, 1, 3), kh) * softmax_scale
        mask = torch.arange(seqlen, device=s.device)[None, :] > torch.arange(first, last, device=s.device)[:, None]
        yield first, s.masked_fill(mask, -math.inf)


def attention_fp64(q, k, v, *, softmax_scale=None, q_descale=1.0, k_descale=1.0, v_descale=1.0, return_lse=False):
    """Exact causal attention in float64 on (batch, seqlen, heads, dim) inputs of any dtype.

    Descales: floats or tensors broadcastable to (batch, heads_k). Returns out (batch, seqlen, heads, d_v)
    float64 and, with return_lse, lse (batch, heads, seqlen) float64 (natural log).
    """
    heads = q.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    q64, k64, v64 = (decode(t, d) for t, d in ((q, q_descale), (k, k_descale), (v, v_descale)))
    vh = v64.repeat_interleave(heads // v64.shape[2], dim=2).permute(0, 2, 1, 3)  # (batch, heads, seqlen, d_v)
    out = torch.empty(*q.shape[:3], v.shape[-1], dtype=torch.float64, device=q.device)
    lse = torch.empty(q.shape[0], heads, q.shape[1], dtype=torch.float64, device=q.device)
    for first, s in causal_scores(q64, k64, scale):
        last = first + s.shape[2]
        lse[:, :, first:last] = torch.logsumexp(s, dim=-1)
        out[:, first:last] = torch.matmul(torch.softmax(s, dim=-1), vh).permute(0, 2, 1, 3)
    return (out, lse) if return_lse else out


def relative_rms_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| over all elements, in float64."""
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm()).item()


def bf16_ulps(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|x - ref| in units of the BF16 spacing at max(|x|, |ref|, rms(ref)): the RMS floor keeps outputs that are
    near zero by cancellation from counting a tiny absolute difference as many units."""
    floor = float(ref.float().pow(2).mean().sqrt().clamp_min(torch.finfo(torch.bfloat16).tiny))
    magnitude = torch.maximum(x.float().abs(), ref.float().abs()).clamp_min(floor)
    spacing = torch.exp2(torch.floor(torch.log2(magnitude)) - 7)
    return (x.float() - ref.float()).abs() / spacing
