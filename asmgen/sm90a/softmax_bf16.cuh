// The online softmax of the BF16 kernels, on a consumer thread's two rows of a 64x128 score tile (the wgmma
// accumulator layout, tile.cuh): a lazily rescaled row maximum (it moves only when a tile's maximum exceeds it by
// more than tau), p = 2^(c s - m) with ex2, the row sum of unrounded p, P = bf16(p) packed as the P V product's A
// fragments. Numerics: zyfa.numerics with p_mode "bf16".
#pragma once

#include "ptx.cuh"
#include "tile.cuh"

namespace zyfa {

// p = 2^(c s - m), x - m as one FMA c s - m: one rounding fewer than the model (a last-bit difference); the model's
// two roundings measured 3-8% slower at d = 128.
__device__ __forceinline__ float prob(float s, float scale_log2, float m) { return ex2(fmaf(s, scale_log2, -m)); }

// Scores of one key tile -> probabilities in place; returns per-row factors for O (1 where m did not move).
template <class C>
__device__ __forceinline__ void softmax_tile(float (&s)[64], RowState& st, float scale_log2, float (&factor)[2]) {
  float local[2];
  partial_maxima(s, local);
  factor[0] = factor[1] = 1.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float mt = quad_max(local[h]) * scale_log2;
    if (mt > st.m[h] + C::kTau) {
      factor[h] = ex2(st.m[h] - mt);
      st.m[h] = mt;
      st.l[h] *= factor[h];
    }
  }
#pragma unroll
  for (int r = 0; r < 64; ++r) {
    const int h = acc_half(r);
    s[r] = prob(s[r], scale_log2, st.m[h]);
    st.l[h] += s[r];
  }
}

// The moved-maximum test on the packed P (C::kCodeTest, as the FP8 kernels' on their codes): P written against m as
// it stands is the tile's P unless a row maximum moves by more than tau, and then some p = 2^(x - m) exceeds 2^tau,
// so its BF16 value is at least bf16(2^tau) (rounding is monotonic). P >= 0, so its BF16 bit patterns order as
// unsigned 16-bit integers: the halves' maximum over the tile's 32 registers (16 instructions, VIMNMX3.U16x2 taking
// three; an add and an OR per register took 50) plus 0x8000 - bf16(2^tau) has a half's top bit set exactly when some
// value is bf16(2^tau) or more (no carry leaves a half, up to the NaN 0x7fff). Quiet below: x - m <= tau - 0.004 (the
// BF16 value below bf16(2^tau) and its rounding interval), far above the roundings of x - m while |m| < 2^10; past
// that, and for the first key tile, the warp takes the row maxima.
template <class C>
__host__ __device__ constexpr uint32_t bf16_of_exp2_tau() {
  static_assert(C::kTau == 0.5f || C::kTau == 8.0f, "kCodeTest: bf16(2^tau) is tabulated for tau 0.5 and 8");
  return C::kTau == 0.5f ? 0x3fb5u : 0x4380u;  // bf16(1.41421356) = 1.4140625; bf16(256)
}
constexpr uint32_t kHalfTops = 0x80008000u;
constexpr float kCodeTestMaxMBf16 = 1024.0f;  // 2^10

// P against m as it stands into `pf`, the tile's row sums added to a copy of l in the order softmax_tile adds them
// (bitwise its l when no maximum moves); true when the packed P shows that a row maximum may have moved.
template <class C>
__device__ __forceinline__ bool codes_may_have_moved(const float (&s)[64], RowState& st, float scale_log2,
                                                     uint32_t (&pf)[32]) {
  constexpr uint32_t kBias = (0x8000u - bf16_of_exp2_tau<C>()) * 0x10001u;
  float l[2] = {st.l[0], st.l[1]};
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int h = acc_half(2 * i);
    const float p0 = prob(s[2 * i], scale_log2, st.m[h]);
    const float p1 = prob(s[2 * i + 1], scale_log2, st.m[h]);
    l[h] += p0;
    l[h] += p1;
    pf[i] = pack_bf16x2(p0, p1);
  }
  uint32_t top = pf[0];  // the largest P of each half
#pragma unroll
  for (int i = 1; i < 32; ++i) top = max_u16x2(top, pf[i]);
  const bool moved = warp_may_have_moved(top + kBias, kHalfTops, st, kCodeTestMaxMBf16);
  if (!moved) {
    st.l[0] = l[0];
    st.l[1] = l[1];
  }
  return moved;
}

// P (FP32 accumulator layout) -> BF16 A fragments: the accumulator of key columns 16k..16k+15 is exactly the
// register A fragment of the k-th 16-key step.
__device__ __forceinline__ void pack_p(const float (&s)[64], uint32_t (&pf)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) pf[i] = pack_bf16x2(s[2 * i], s[2 * i + 1]);
}

// The OR of a packed P set: depends on all of it, and is never ~0u (packed P has no sign bits).
__device__ __forceinline__ uint32_t packed_or(const uint32_t (&pf)[32]) {
  uint32_t x = pf[0];
#pragma unroll
  for (int i = 1; i < 32; ++i) x |= pf[i];
  return x;
}

__device__ __forceinline__ void rescale_o(float (&o)[64], const float (&factor)[2]) {
  if (factor[0] != 1.0f || factor[1] != 1.0f) scale_rows(o, factor);
}

}  // namespace zyfa
