"""Rotations are orthogonal, seeded, and leave q k^T unchanged."""

from __future__ import annotations

import pytest
import torch

from zyfa_tools.rotation import dct_hadamard, dct_matrix, random_hadamard, rotation_matrix


@pytest.mark.parametrize("make, d", [(random_hadamard, 64), (random_hadamard, 128), (dct_hadamard, 192)])
def test_orthogonal_and_seeded(make, d):
    r = make(d).double()
    assert r.dtype == torch.float64 and r.shape == (d, d)
    torch.testing.assert_close(r @ r.T, torch.eye(d, dtype=torch.float64), atol=1e-6, rtol=0)
    assert torch.equal(make(d, seed=3), make(d, seed=3))
    assert not torch.equal(make(d, seed=3), make(d, seed=4))


def test_hadamard_entries_and_dct_mixing():
    r = random_hadamard(128)
    assert torch.equal(r.abs(), torch.full((128, 128), 128**-0.5))
    c = dct_matrix(3).double()
    torch.testing.assert_close(c @ c.T, torch.eye(3, dtype=torch.float64), atol=1e-7, rtol=0)
    m = dct_hadamard(192)
    spread = (m.abs() > 1e-6).sum(dim=1)  # each input channel goes to 192 outputs, or 128 (the DCT's one zero)
    assert spread.min() == 128 and (spread == 192).sum() == 128
    assert m.abs()[m.abs() > 1e-6].min() > (6 * 64) ** -0.5 - 1e-6


@pytest.mark.parametrize("d", [128, 192])
def test_scores_unchanged(d):
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 50, d, generator=gen, dtype=torch.float64), torch.randn(2, 60, d, dtype=torch.float64)
    r = rotation_matrix(d).double()
    # r's entries are float32 roundings: orthogonal to about 1e-7
    torch.testing.assert_close((q @ r) @ (k @ r).transpose(-1, -2), q @ k.transpose(-1, -2), atol=1e-5, rtol=0)


def test_rotation_spreads_an_outlier_channel():
    x = torch.ones(1000, 128) * 0.1
    x[:, 5] = 20.0
    assert (x @ random_hadamard(128)).abs().max() < x.abs().max() / 5


@pytest.mark.parametrize("call, message", [
    (lambda: random_hadamard(96), "power of two"),
    (lambda: dct_hadamard(128), "3 \\* 2\\^k"),
    (lambda: rotation_matrix(80), "rotations exist for d"),
])
def test_bad_dimensions(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_device_argument():
    assert random_hadamard(64, device="cpu").device.type == "cpu"
    assert dct_hadamard(192, device=torch.device("cpu")).device.type == "cpu"
