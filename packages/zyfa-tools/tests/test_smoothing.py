"""K smoothing subtracts each KV head's mean key and leaves the softmax unchanged."""

from __future__ import annotations

import pytest
import torch

from zyfa_tools.reference import attention_fp64
from zyfa_tools.smoothing import smooth_keys


def _k(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(2, 40, 3, 128, generator=gen) + torch.linspace(-5, 5, 128)  # a per-channel offset
    return k.to(dtype)


def test_per_head_mean_over_the_sequence():
    k = _k()
    smoothed, mean = smooth_keys(k)
    assert mean.shape == (2, 1, 3, 128) and mean.dtype == torch.float32
    torch.testing.assert_close(mean, k.mean(dim=1, keepdim=True))
    torch.testing.assert_close(smoothed.mean(dim=1), torch.zeros(2, 3, 128), atol=1e-5, rtol=0)
    assert smoothed.abs().max() < k.abs().max() / 1.5


def test_given_mean_used_as_is():
    k = _k(torch.bfloat16)
    fixed = torch.randn(3, 128)
    smoothed, mean = smooth_keys(k, fixed)
    assert mean is fixed and smoothed.dtype == torch.bfloat16
    torch.testing.assert_close(smoothed, (k.float() - fixed).bfloat16(), atol=0, rtol=0)
    # chunked prefill: two halves smoothed with the same fixed mean equal the whole
    a, _ = smooth_keys(k[:, :20], fixed)
    b, _ = smooth_keys(k[:, 20:], fixed)
    assert torch.equal(torch.cat([a, b], dim=1), smoothed)


def test_attention_unchanged():
    gen = torch.Generator().manual_seed(1)
    q, v = torch.randn(1, 64, 4, 128, generator=gen), torch.randn(1, 64, 2, 128, generator=gen)
    k = torch.randn(1, 64, 2, 128, generator=gen) + 3.0
    smoothed, _ = smooth_keys(k.double())
    torch.testing.assert_close(attention_fp64(q, smoothed, v), attention_fp64(q, k, v), atol=1e-10, rtol=0)


@pytest.mark.parametrize("k, mean, error, message", [
    (torch.zeros(2, 3, 4), None, ValueError, "4 \\(batch, seqlen, heads_k, d\\)"),
    (torch.zeros(1, 4, 2, 8).to(torch.float8_e4m3fn), None, TypeError, "before quantizing"),
    (torch.zeros(1, 4, 2, 8), torch.zeros(3, 8), ValueError, "one mean key per KV head"),
    (torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8), ValueError, "one mean key per KV head"),
    (torch.zeros(1, 4, 2, 8), [0.0], TypeError, "mean must be a torch.Tensor"),
])
def test_bad_input(k, mean, error, message):
    with pytest.raises(error, match=message):
        smooth_keys(k, mean)
