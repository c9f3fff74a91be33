"""Test inputs for attention: Gaussian ones (as in kernel benchmarks) and activation-like ones.

Every generator is deterministic given its seed and returns float32 (q, k, v) in (batch, seqlen, heads, dim)
layout; `quantize` turns them into the BF16 or FP8 tensors (with descales) that a kernel takes.

Gaussian inputs with std 0.1 give nearly uniform attention and hide what matters to FP8 probabilities.
`activation_like` builds scores the way post-RoPE activations of real models do (amounts in binades, base-2
units of the score at softmax_scale = 1/sqrt(d_qk)):
- an attention sink: key 0 scores `sink_binades` above the typical key for every query, carried by one large
  low-frequency channel of q (so RoPE barely rotates it) and by that channel of k at position 0 only;
- a long tail: every other key gets a Gaussian score (its random part has std `spread_binades`, the local
  content below widens it); thousands of such keys 8-14 binades below the sink still carry a real share of the
  probability mass;
- local peaks: q and k share a slowly varying (AR(1), correlation length `local_length` tokens) content vector,
  which adds up to `local_binades` to nearby keys, shaped further by RoPE;
- large channels: besides q's sink channel, `outlier_channels` channels of k carry a constant bias of
  `outlier_scale` times the typical magnitude (like the K outliers that motivate K smoothing); they hardly change
  the softmax but dominate k's FP8 scale;
- RoPE (rotate-half pairing, base `rope_base`) on q and k; v is Gaussian with the sink's value scaled by
  `sink_value` (sinks carry little value in real models, so the output is made of the tail).
`block_statistics` reports what docs/design.md tracks: the fraction of (row, 64-key block) pairs whose block maximum
lies more than 8 binades below the row maximum (real Mistral-7B layer 20: 91%) and the probability mass there.
"""

from __future__ import annotations

import math

import torch

from .reference import causal_scores, decode

LOG2E = 1.0 / math.log(2.0)
E4M3_MAX = 448.0
GAUSSIAN_STD = 0.1  # the kernel benchmarks' inputs


def _shape(batch, seqlen, heads, heads_k, d_qk, d_v):
    heads_k = heads if heads_k is None else heads_k
    d_v = d_qk if d_v is None else d_v
    if heads % heads_k:
        raise ValueError(f"heads_k={heads_k} must divide heads={heads}")
    if d_qk % 2:
        raise ValueError(f"d_qk={d_qk} must be even (RoPE rotates channel pairs)")
    return heads_k, d_v


def gaussian(batch=1, seqlen=1024, heads=8, heads_k=None, d_qk=128, d_v=None, *, std=GAUSSIAN_STD, seed=0):
    """q, k, v with independent N(0, std^2) entries (heads_k defaults to heads, d_v to d_qk)."""
    heads_k, d_v = _shape(batch, seqlen, heads, heads_k, d_qk, d_v)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen, heads, d_qk, generator=gen) * std
    k = torch.randn(batch, seqlen, heads_k, d_qk, generator=gen) * std
    v = torch.randn(batch, seqlen, heads_k, d_v, generator=gen) * std
    return q, k, v


def activation_like(batch=1, seqlen=1024, heads=8, heads_k=None, d_qk=128, d_v=None, *, seed=0,
                    sink_binades=12.0, spread_binades=0.5, local_binades=3.0, local_length=16.0,
                    outlier_channels=4, outlier_scale=20.0, rope_base=10000.0, sink_value=0.1):
    """q, k, v whose attention looks like a real model's (see the module docstring for the parameters)."""
    heads_k, d_v = _shape(batch, seqlen, heads, heads_k, d_qk, d_v)
    group, half = heads // heads_k, d_qk // 2
    if not 0 <= outlier_channels < half - 1:
        raise ValueError(f"outlier_channels={outlier_channels} must be in [0, d_qk/2 - 1) = [0, {half - 1})")
    gen = torch.Generator().manual_seed(seed)
    # A score q.k contributes (q.k) * LOG2E / sqrt(d) binades; entries of std sigma give std LOG2E * sigma^2.
    sigma = math.sqrt(spread_binades / LOG2E)
    alpha = math.sqrt(local_binades / (LOG2E * math.sqrt(d_qk)))  # alpha^2 * d / sqrt(d) * LOG2E = local
    content = _ar1(batch, seqlen, heads_k, d_qk, math.exp(-1.0 / local_length), gen) * alpha
    q = torch.randn(batch, seqlen, heads, d_qk, generator=gen) * sigma + content.repeat_interleave(group, dim=2)
    k = torch.randn(batch, seqlen, heads_k, d_qk, generator=gen) * sigma + content

    sink = half - 1  # the lowest-frequency rotary pair is (half - 1, d - 1)
    q_large = outlier_scale * sigma
    q[..., sink] = q_large
    k[..., [sink, sink + half]] = 0.0
    k[:, 0, :, sink] = sink_binades * math.sqrt(d_qk) / (LOG2E * q_large)
    for channel in range(half - 1 - outlier_channels, half - 1):  # the next lowest frequencies
        k[..., channel] += outlier_scale * sigma * (1 if channel % 2 else -1)

    q, k = _rope(q, rope_base), _rope(k, rope_base)
    v = torch.randn(batch, seqlen, heads_k, d_v, generator=gen)
    v[:, 0] *= sink_value
    return q, k, v


def _ar1(batch, seqlen, heads, dim, rho, gen):
    """Unit-variance vectors correlated along the sequence: corr(u_i, u_j) = rho^|i - j|."""
    noise = torch.randn(batch, seqlen, heads, dim, generator=gen)
    out = torch.empty_like(noise)
    out[:, 0] = noise[:, 0]
    innovation = math.sqrt(1 - rho * rho)
    for t in range(1, seqlen):
        out[:, t] = rho * out[:, t - 1] + innovation * noise[:, t]
    return out


def _rope(x, base):
    """Rotate channel pairs (i, i + d/2) of position t by t * base^(-2i/d)."""
    seqlen, dim = x.shape[1], x.shape[-1]
    half = dim // 2
    freqs = base ** (-torch.arange(half, dtype=torch.float64) * 2 / dim)
    angles = torch.arange(seqlen, dtype=torch.float64)[:, None] * freqs[None, :]
    cos, sin = (f(angles).float()[None, :, None, :] for f in (torch.cos, torch.sin))
    lo, hi = x[..., :half], x[..., half:]
    return torch.cat([lo * cos - hi * sin, lo * sin + hi * cos], dim=-1)


def quantize(q, k, v, dtype):
    """Round float inputs to `dtype` (torch.bfloat16 or torch.float8_e4m3fn).

    FP8 uses one descale per (batch, kv head) for each tensor (the flash-attn convention): amax / 448 over the
    values it covers (for q: all query heads of the group). Returns (q, k, v, descales) with descales a dict of
    float32 (batch, heads_k) tensors for FP8 and {} for BF16.
    """
    if dtype == torch.bfloat16:
        return q.to(dtype), k.to(dtype), v.to(dtype), {}
    if dtype != torch.float8_e4m3fn:
        raise ValueError(f"dtype must be torch.bfloat16 or torch.float8_e4m3fn, got {dtype}")
    batch, seqlen, heads_k = k.shape[:3]
    tensors, descales = [], {}
    for name, t in (("q", q), ("k", k), ("v", v)):
        grouped = t.float().reshape(batch, seqlen, heads_k, -1)  # a GQA group's query heads share a descale
        descale = (grouped.abs().amax(dim=(1, 3)) / E4M3_MAX).clamp_min(torch.finfo(torch.float32).tiny)
        tensors.append((grouped / descale[:, None, :, None]).reshape(t.shape).to(dtype))
        descales[f"{name}_descale"] = descale
    return (*tensors, descales)


def block_statistics(q, k, *, softmax_scale=None, q_descale=1.0, k_descale=1.0, block=64, binades=8.0):
    """How much of the attention lies in key blocks far below the row maximum.

    Returns {"far_block_fraction": share of (row, block) pairs with a visible key whose block maximum score is
    more than `binades` binades below the row maximum, "far_block_mass": mean over rows of the probability mass
    in those blocks}. Scores are exact (float64) on the decoded inputs.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    q64, k64 = decode(q, q_descale), decode(k, k_descale)
    far_pairs = visible_pairs = 0
    far_mass = 0.0
    for _, s in causal_scores(q64, k64, scale):
        pad = -s.shape[-1] % block
        s = torch.nn.functional.pad(s, (0, pad), value=-math.inf)
        p = torch.softmax(s, dim=-1).unflatten(-1, (-1, block)).sum(-1)
        block_max = s.unflatten(-1, (-1, block)).amax(-1) * LOG2E  # binades
        visible = block_max > -math.inf
        far = visible & (block_max.amax(-1, keepdim=True) - block_max > binades)
        far_pairs += int(far.sum())
        visible_pairs += int(visible.sum())
        far_mass += float((p * far).sum())
    rows = q.shape[0] * q.shape[2] * q.shape[1]
    return {"far_block_fraction": far_pairs / visible_pairs, "far_block_mass": far_mass / rows}
