"""fp8_quantize: per-tensor FP8 e4m3 quantization with a power-of-two scale.

The scale is a power of two, so scaling is exact and the only rounding is the conversion to e4m3 (round to
nearest even). Everything stays on the tensor's device: nothing is read back to the host.
"""

from __future__ import annotations

import torch

E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448 = 0.875 * 2**9
E4M3_MAX_MANTISSA, E4M3_MAX_EXPONENT = 0.875, 9  # frexp(448)
SCALE_EXPONENT_LIMIT = 126  # keeps the scale and the descale normal float32 numbers


def fp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x to torch.float8_e4m3fn with one power-of-two scale 2**s chosen from the tensor's amax.

    s is the largest integer with amax * 2**s <= 448, so the largest magnitude fits e4m3. Returns (x8, descale)
    with x ~= x8 * descale; descale = 2**-s is a one-element float32 tensor on x's device. An all-zero x gets
    descale 2**-9; a non-finite amax gives a NaN descale.

    s is clamped to [-126, 126] so that the descale stays a normal float32 number, as attention requires. So a
    tensor whose amax is below 448 * 2**-126 keeps fewer significant bits, and one whose amax is below 2**-136
    (half e4m3's smallest subnormal, 2**-9, times 2**-126; float32 subnormals such as 1e-42) quantizes to zeros
    with descale 2**-126: its reconstruction error is at most its amax. Nothing is read back to raise instead.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point or x.dtype == torch.float8_e4m3fn:
        raise TypeError(f"x has dtype {x.dtype}: fp8_quantize takes a floating-point tensor that is not FP8 already")
    if x.numel() == 0:
        raise ValueError("x is empty: fp8_quantize needs at least one element to choose a scale")
    xf = x.float()
    amax = xf.abs().amax().reshape(1)
    # amax = m * 2**e with m in [0.5, 1); amax * 2**s <= 0.875 * 2**9 holds for s = 9 - e when m <= 0.875.
    mantissa, exponent = torch.frexp(amax)
    s = E4M3_MAX_EXPONENT - exponent - (mantissa > E4M3_MAX_MANTISSA).to(exponent.dtype)
    s = s.clamp(-SCALE_EXPONENT_LIMIT, SCALE_EXPONENT_LIMIT).float()
    x8 = (xf * torch.exp2(s)).to(torch.float8_e4m3fn)
    descale = torch.where(torch.isfinite(amax), torch.exp2(-s), torch.nan)
    return x8, descale
