"""Number formats of the gfx950 data path, vectorised over numpy arrays.

Every conversion rounds to nearest even, as the pseudocode's f32_to_bf16 / f32_to_fp8 under
ROUND_MODE = ROUND_NEAREST_EVEN (V_CVT_PK_BF16_F32, V_CVT_PK_FP8_F32).
"""

from __future__ import annotations

import numpy as np

F32_MIN_NORMAL = np.float32(2.0**-126)
BF16_QUIET_NAN = np.uint32(0x7FC0)
E4M3_NAN = 0x7F  # S.1111.111 (OCP e4m3fn has no infinities)
E8M0_NAN = 0xFF
E8M0_BIAS = 127


def f32(bits: np.ndarray) -> np.ndarray:
    """Reinterpret uint32 lanes as float32 (no copy)."""
    return bits.view(np.float32)


def bits(values: np.ndarray) -> np.ndarray:
    """Reinterpret float32 lanes as uint32 (no copy)."""
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)


def flush_denormals(x: np.ndarray) -> np.ndarray:
    """Results below the smallest normal become zero of the same sign (the transcendental unit's rule)."""
    return np.where(np.abs(x) < F32_MIN_NORMAL, np.copysign(np.float32(0), x), x).astype(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint32 holding 16 bits), round to nearest even, NaN kept quiet."""
    u = bits(x).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)
    nan = np.isnan(x)
    return np.where(nan, (u >> 16).astype(np.uint32) | BF16_QUIET_NAN, rounded).astype(np.uint32)


def _fp8_table(exponent_bits: int, mantissa_bits: int, nan_codes: set[int]) -> np.ndarray:
    """Decode all 256 codes of an fp8 format (bias 2^(e-1)-1, subnormals) to float64."""
    bias = 2 ** (exponent_bits - 1) - 1
    out = np.empty(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> mantissa_bits) & ((1 << exponent_bits) - 1)
        m = code & ((1 << mantissa_bits) - 1)
        if (code & 0x7F) in nan_codes:
            out[code] = np.nan
        elif e == 0:
            out[code] = sign * m * 2.0 ** (1 - bias - mantissa_bits)
        else:
            out[code] = sign * (1 + m / 2**mantissa_bits) * 2.0 ** (e - bias)
    return out


E4M3_VALUES = _fp8_table(4, 3, {E4M3_NAN})
E5M2_VALUES = _fp8_table(5, 2, {0x7C, 0x7D, 0x7E, 0x7F})  # e5m2 keeps IEEE-style inf (0x7C) and NaNs
E5M2_VALUES[0x7C], E5M2_VALUES[0xFC] = np.inf, -np.inf
E4M3_MAX = float(np.nanmax(E4M3_VALUES))
E4M3_MAX_HALF_ULP = 16.0

# Positive finite e4m3 codes 0..0x7E in increasing order of value: code == index.
_E4M3_POSITIVE = E4M3_VALUES[:E4M3_NAN]


def f32_to_e4m3(x: np.ndarray, saturate: bool = False) -> np.ndarray:
    """float32 -> e4m3fn codes (uint32 holding 8 bits), round to nearest even on the code (even mantissa).

    Magnitudes that round above the largest finite value (448) become NaN unless `saturate`, which clamps to 448.
    """
    x = np.asarray(x, dtype=np.float32)
    mag = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(_E4M3_POSITIVE, mag, side="left"), 0, E4M3_NAN - 1)
    lo = np.maximum(hi - 1, 0)
    d_lo = mag - _E4M3_POSITIVE[lo]
    d_hi = _E4M3_POSITIVE[hi] - mag
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(take_hi, hi, lo)
    # Above 448 + half its ulp (464; the tie rounds to 448, whose mantissa is even) no finite code is nearest.
    overflow = mag > E4M3_MAX + E4M3_MAX_HALF_ULP
    code = np.where(overflow & saturate, E4M3_NAN - 1, code)
    code = np.where((overflow & (not saturate)) | np.isnan(x), E4M3_NAN, code)
    sign = np.signbit(x).astype(np.uint32) << 7
    return (code.astype(np.uint32) | sign).astype(np.uint32)


def decode_fp8(codes: np.ndarray, fmt: int) -> np.ndarray:
    """fp8 codes -> float64 values for the MFMA format selector (cbsz / blgp): 0 = e4m3, 1 = e5m2."""
    if fmt == 0:
        return E4M3_VALUES[codes]
    if fmt == 1:
        return E5M2_VALUES[codes]
    raise NotImplementedError(f"MFMA source format {fmt} (only 0 = fp8 e4m3 and 1 = bf8 e5m2 are modelled)")


def e8m0_to_f64(codes: np.ndarray) -> np.ndarray:
    """E8M0 scale bytes -> 2^(e-127); 0xFF is NaN."""
    codes = np.asarray(codes, dtype=np.int64)
    return np.where(codes == E8M0_NAN, np.nan, np.ldexp(1.0, codes - E8M0_BIAS))
