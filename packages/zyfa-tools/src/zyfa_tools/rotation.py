"""Orthogonal rotations of the head dimension, applied to q and k after RoPE (never to v).

For an orthogonal R, (q R)(k R)^T = q R R^T k^T = q k^T: the scores do not change, only FP8 rounding does. A
rotation spreads the few large channels of real keys and queries (the outliers that set the FP8 scale) over
all channels, so the other channels keep more of e4m3's three mantissa bits.

- `random_hadamard(d)`: diag(s) H / sqrt(d) with Sylvester's Hadamard matrix H and random signs s, d a power
  of two (d_qk = 128).
- `dct_hadamard(d)`: for d = 3 * 2^k (d_qk = 192 = 3 * 64), the Kronecker product of the orthonormal 3-point
  DCT-II with a 2^k-point Hadamard matrix, with random signs; no Hadamard matrix of order 192 is built from
  Sylvester's construction, and the DCT's rows mix the three 64-channel blocks as evenly as three rows can.
- `rotation_matrix(d)`: the one of the two that fits d.
Matrices are float32, seeded (the same seed gives the same matrix on every device).
"""

from __future__ import annotations

import math

import torch


def _is_power_of_two(n: int) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1 and n & (n - 1) == 0


def _signs(d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (d,), generator=gen).float() * 2 - 1


def sylvester_hadamard(d: int) -> torch.Tensor:
    """The d x d Hadamard matrix of entries +-1 (Sylvester's construction), d a power of two."""
    if not _is_power_of_two(d):
        raise ValueError(f"d={d!r}: a Sylvester Hadamard matrix needs d to be a power of two")
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h


def random_hadamard(d: int, device=None, seed: int = 0) -> torch.Tensor:
    """The orthogonal float32 matrix diag(s) H / sqrt(d), s random signs from `seed`, d a power of two."""
    h = sylvester_hadamard(d)
    return (_signs(d, seed)[:, None] * h / math.sqrt(d)).to(device)


def dct_matrix(n: int) -> torch.Tensor:
    """The orthonormal n-point DCT-II matrix (rows are frequencies), float32."""
    j = torch.arange(n, dtype=torch.float64)
    c = torch.cos(math.pi * (j[None, :] + 0.5) * j[:, None] / n) * math.sqrt(2.0 / n)
    c[0] /= math.sqrt(2.0)
    return c.float()


def dct_hadamard(d: int, device=None, seed: int = 0) -> torch.Tensor:
    """The orthogonal float32 matrix diag(s) (C3 kron H / sqrt(d / 3)) for d = 3 * 2^k (d = 192: k = 6)."""
    if not (isinstance(d, int) and d % 3 == 0 and _is_power_of_two(d // 3)):
        raise ValueError(f"d={d!r}: dct_hadamard needs d = 3 * 2^k (192 for d_qk = 192)")
    n = d // 3
    m = torch.kron(dct_matrix(3).T.contiguous(), sylvester_hadamard(n) / math.sqrt(n))
    return (_signs(d, seed)[:, None] * m).to(device)


def rotation_matrix(d: int, device=None, seed: int = 0) -> torch.Tensor:
    """random_hadamard for a power of two d, dct_hadamard for d = 3 * 2^k; other d are refused."""
    if _is_power_of_two(d):
        return random_hadamard(d, device, seed)
    if isinstance(d, int) and d % 3 == 0 and _is_power_of_two(d // 3):
        return dct_hadamard(d, device, seed)
    raise ValueError(f"d={d!r}: rotations exist for d a power of two or 3 * 2^k (ZYFA's d_qk: 128, 192)")
