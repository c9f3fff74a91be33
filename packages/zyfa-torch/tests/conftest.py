"""Shared helpers of the zyfa API tests: fp64 attention on decoded inputs and small input factories."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
# Relative RMS error bounds vs fp64 on the same decoded inputs, valid for the numerics model (about 2e-3..4e-3
# for BF16, up to ~3e-2 for FP8 with lean P).
OUT_RTOL = {BF16: 1e-2, FP8: 6e-2}
# Largest lse error. BF16 sums unrounded FP32 probabilities. FP8 sums the rounded ones: exact P rounds each within
# 2**-4 relatively; lean P's code is within 1/16 binade of 2**y and the e4m3 value of a code exceeds its
# log-linear reading by up to a factor (1 + t) / 2**t <= 1.0614 (t = 1/ln 2 - 1), so the sum lies within a factor
# 1.0614 * 2**(1/16) ~= 1.108 of the exact one: |lse error| <= ln(1.108) ~= 0.103 (lean P's lse is biased high).
LSE_ATOL = {BF16: 1e-3, FP8: 0.11}


def attention_fp64(q, k, v, *, softmax_scale=None, descales=(1.0, 1.0, 1.0), layout="bshd"):
    """Causal attention in float64 on the decoded inputs; returns out (q's layout) and lse (batch, heads, seqlen).

    descales: floats or tensors broadcastable to (batch, heads_k).
    """
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    b, s, h, d = q.shape
    hk = k.shape[2]
    scale = d**-0.5 if softmax_scale is None else softmax_scale

    def decoded(t, descale):
        descale = torch.as_tensor(descale, dtype=torch.float64).expand(b, hk)
        return t.double() * descale.repeat_interleave(t.shape[2] // hk, dim=1)[:, None, :, None]

    qd, kd, vd = (decoded(t, dsc) for t, dsc in zip((q, k, v), descales, strict=True))
    kd, vd = (t.repeat_interleave(h // hk, dim=2) for t in (kd, vd))
    scores = torch.einsum("bihd,bjhd->bhij", qd, kd) * scale
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhij,bjhd->bihd", torch.softmax(scores, dim=-1), vd)
    return (out.transpose(1, 2) if layout == "bhsd" else out), lse


def relative_rms(x: torch.Tensor, reference: torch.Tensor) -> float:
    return ((x.double() - reference).norm() / reference.norm()).item()


def make_inputs(batch=1, seqlen=64, heads=2, heads_k=2, d_qk=128, d_v=128, dtype=BF16, layout="bshd", seed=0):
    """Gaussian q, k, v in `layout`; FP8 inputs come with fp8_quantize's descales, else descales are None."""
    from zyfa import fp8_quantize

    g = torch.Generator().manual_seed(seed)

    def tensor(h, d):
        t = torch.randn(batch, seqlen, h, d, generator=g)
        return t.transpose(1, 2).contiguous() if layout == "bhsd" else t

    q, k, v = tensor(heads, d_qk), tensor(heads_k, d_qk), tensor(heads_k, d_v)
    if dtype == BF16:
        return (q.to(BF16), k.to(BF16), v.to(BF16)), {}
    (q8, qd), (k8, kd), (v8, vd) = (fp8_quantize(t) for t in (q, k, v))
    return (q8, k8, v8), {"q_descale": qd, "k_descale": kd, "v_descale": vd}


@pytest.fixture(scope="session")
def helpers():
    """The helpers above, for test modules (pytest's importlib mode does not make conftest importable)."""
    return SimpleNamespace(
        attention_fp64=attention_fp64, relative_rms=relative_rms, make_inputs=make_inputs,
        OUT_RTOL=OUT_RTOL, LSE_ATOL=LSE_ATOL,
    )
