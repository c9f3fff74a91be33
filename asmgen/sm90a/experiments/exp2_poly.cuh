// An FMA-pipe exponential, measured in the BF16 kernels (a share of the softmax's exponentials) and not shipped:
// every share was slower (docs/sm90a.md, "Exponentials on the FMA pipe"). ci/gpu_exp2_poly.py checks its accuracy.
#pragma once

#include "ptx.cuh"

namespace zyfa {

// 2^x on the FMA and integer pipes, leaving the special-function (MUFU) pipe that ex2 uses to the other
// exponentials. x = j + f with j = rint(x): adding 1.5 * 2^23 rounds x to an integer held in the low mantissa bits
// (no float->int conversion, which would run on the MUFU pipe too); 2^f for f in [-0.5, 0.5] is a degree-5
// polynomial (relative minimax fit, coefficients tuned after rounding to FP32: at most 1.7e-7 relative error in
// FP32 Horner form, about ex2.approx's own); j is then added to the exponent field. x is clamped below at
// kExp2PolyMinInput so the exponent cannot wrap: inputs below it give 2^-125 instead of 2^x (callers pass no -inf).
constexpr float kExp2PolyRound = 12582912.0f;  // 1.5 * 2^23: x + this has rint(x) in its low mantissa bits
constexpr float kExp2PolyMinInput = -125.0f;   // 2^-125 times 2^f stays a normal FP32 number
constexpr int kFloatMantissaBits = 23;
constexpr int kExp2PolyDegree = 5;

__device__ __forceinline__ float exp2_poly(float x) {
  constexpr float kCoefficients[kExp2PolyDegree + 1] = {1.0f,  // c0 .. c5
                                                        0.69314694404602051f, 0.24022176861763000f,
                                                        0.055507499724626541f, 0.0096755409613251686f,
                                                        0.0013276472454890609f};
  x = fmaxf(x, kExp2PolyMinInput);
  const float shifted = x + kExp2PolyRound;  // round to nearest even: rint(x) in the low bits
  const float f = x - (shifted - kExp2PolyRound);
  float p = kCoefficients[kExp2PolyDegree];
#pragma unroll
  for (int i = kExp2PolyDegree - 1; i >= 0; --i) p = fmaf(p, f, kCoefficients[i]);
  // The shift drops the constant's own bits and keeps rint(x) (two's complement) times 2^23: the exponent step.
  return __uint_as_float(__float_as_uint(p) + (__float_as_uint(shifted) << kFloatMantissaBits));
}

}  // namespace zyfa
