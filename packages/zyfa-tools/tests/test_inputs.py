"""Input generators, quantization and the block statistics."""

from __future__ import annotations

import math

import pytest
import torch

from zyfa_tools import inputs

FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize("generator", [inputs.gaussian, inputs.activation_like])
def test_generators_are_deterministic_by_seed_and_shaped_bshd(generator):
    a = generator(2, 96, 4, 2, 64, 32, seed=1)
    b = generator(2, 96, 4, 2, 64, 32, seed=1)
    c = generator(2, 96, 4, 2, 64, 32, seed=2)
    assert [t.shape for t in a] == [(2, 96, 4, 64), (2, 96, 2, 64), (2, 96, 2, 32)]
    assert all(t.dtype == torch.float32 for t in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])


def test_gaussian_has_the_requested_std():
    q, k, v = inputs.gaussian(1, 512, 4, d_qk=64, std=0.1)
    for t in (q, k, v):
        assert abs(t.std().item() - 0.1) < 0.002


def test_shape_errors_name_the_rule():
    with pytest.raises(ValueError, match="heads_k=3 must divide heads=4"):
        inputs.gaussian(1, 16, 4, 3)
    with pytest.raises(ValueError, match="d_qk=63 must be even"):
        inputs.activation_like(1, 16, 2, d_qk=63)


def test_activation_like_inputs_put_real_mass_far_below_the_row_max():
    q, k, v = inputs.activation_like(1, 1024, 2, 1, 128, 128)
    stats = inputs.block_statistics(q, k)
    assert stats["far_block_fraction"] > 0.75 and stats["far_block_mass"] > 0.05
    gauss = inputs.block_statistics(*inputs.gaussian(1, 1024, 2, 1, 128, 128)[:2])
    assert gauss == {"far_block_fraction": 0.0, "far_block_mass": 0.0}  # nearly uniform attention


@pytest.mark.parametrize("gap", [8.0, 12.0, 20.0])
def test_activation_like_has_a_sink_and_large_channels(gap):
    q, k, v = inputs.activation_like(1, 512, 2, 2, 64, 64, sink_binades=gap)
    scores = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) / math.sqrt(64) / math.log(2)
    later = scores[..., 256:, :256]  # rows far from the start: key 0 still dominates the typical key
    margin = later[..., 0] - later[..., 1:].median(dim=-1).values
    assert gap - 1 < margin.mean() < gap + 1 and margin.min() > gap - 4
    channel_amax = k.abs().amax(dim=(0, 1, 2))
    assert (channel_amax > 5 * channel_amax.median()).sum() >= 4  # a few channels dominate k's FP8 scale


def test_block_statistics_on_a_hand_made_case():
    # One head, d = 1: query i scores key j as q_i * k_j; key 0 is 20 binades up, the others 0.
    seqlen = 128
    q = torch.ones(1, seqlen, 1, 1)
    k = torch.zeros(1, seqlen, 1, 1)
    k[0, 0] = 20 * math.log(2)  # natural-log units at softmax_scale = 1
    stats = inputs.block_statistics(q, k, softmax_scale=1.0, block=64)
    # Rows 0..63 see block 0 only (not far); rows 64..127 also see block 1, which is 20 binades below.
    assert stats["far_block_fraction"] == pytest.approx(64 / (128 + 64))
    masses = [(i - 63) / (2**20 + i) for i in range(64, 128)]
    assert stats["far_block_mass"] == pytest.approx(sum(masses) / seqlen)


def test_quantize_fp8_uses_one_descale_per_batch_and_kv_head():
    q, k, v = inputs.activation_like(2, 64, 4, 2, 32, 16)
    q8, k8, v8, descales = inputs.quantize(q, k, v, FP8)
    assert all(t.dtype == FP8 for t in (q8, k8, v8))
    assert set(descales) == {"q_descale", "k_descale", "v_descale"}
    for name, t8, t in (("q", q8, q), ("k", k8, k), ("v", v8, v)):
        d = descales[f"{name}_descale"]
        assert d.shape == (2, 2) and d.dtype == torch.float32
        decoded = t8.float().reshape(2, 64, 2, -1) * d[:, None, :, None]
        grouped = t.reshape(2, 64, 2, -1)
        assert torch.equal(t8.float().reshape(2, 64, 2, -1).abs().amax(dim=(1, 3)), torch.full((2, 2), 448.0))
        big = grouped.abs() > grouped.abs().amax(dim=(1, 3), keepdim=True) / 64  # normal e4m3 range
        assert ((decoded - grouped).abs() <= grouped.abs() / 16 + 1e-12)[big].all()  # 3 mantissa bits, RNE
    qb, kb, vb, none = inputs.quantize(q, k, v, torch.bfloat16)
    assert none == {} and qb.dtype == torch.bfloat16 and torch.equal(qb, q.to(torch.bfloat16))
    with pytest.raises(ValueError, match="dtype must be"):
        inputs.quantize(q, k, v, torch.float16)
