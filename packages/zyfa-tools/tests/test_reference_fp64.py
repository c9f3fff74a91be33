"""The float64 reference attention."""

from __future__ import annotations

import math

import pytest
import torch

from zyfa_tools import reference

FP8 = torch.float8_e4m3fn


def _naive(q, k, v, scale):
    """Row by row, straight from the definition."""
    batch, seqlen, heads, _ = q.shape
    group = heads // k.shape[2]
    out = torch.zeros(batch, seqlen, heads, v.shape[-1], dtype=torch.float64)
    lse = torch.zeros(batch, heads, seqlen, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(seqlen):
                s = (k[b, : i + 1, h // group] @ q[b, i, h]) * scale
                lse[b, h, i] = math.log(sum(math.exp(x) for x in s.tolist()))
                out[b, i, h] = (torch.exp(s - lse[b, h, i])[:, None] * v[b, : i + 1, h // group]).sum(0)
    return out, lse


def test_attention_fp64_matches_the_definition_with_gqa_and_descales(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 40, 4, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 40, 2, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 40, 2, 8, generator=gen, dtype=torch.float64)
    qd, kd, vd = (torch.rand(2, 2, generator=gen, dtype=torch.float64) + 0.5 for _ in range(3))
    monkeypatch.setattr(reference, "SCORES_PER_STEP", 500)  # several row chunks
    out, lse = reference.attention_fp64(q, k, v, softmax_scale=0.7, q_descale=qd.float(), k_descale=kd.float(),
                                        v_descale=vd.float(), return_lse=True)
    qf, kf, vf = (t * d.float().double().repeat_interleave(t.shape[2] // 2, 1)[:, None, :, None]
                  for t, d in ((q, qd), (k, kd), (v, vd)))
    want_out, want_lse = _naive(qf, kf, vf, 0.7)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_decoding_is_exact_for_fp8_and_float_descales():
    x = torch.tensor([[[[448.0, -2.0**-9, 0.0, 1.125]]]]).to(FP8)
    assert reference.decode(x, 0.5).tolist() == [[[[224.0, -(2.0**-10), 0.0, 0.5625]]]]
    assert reference.decode(x, torch.tensor([[4.0]])).dtype == torch.float64


def test_relative_rms_error():
    ref = torch.tensor([3.0, 4.0])
    assert reference.relative_rms_error(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)
