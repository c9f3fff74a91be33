// The online softmax of the FP8 kernels, on a consumer thread's two rows of a 64x128 score tile: a lazily rescaled row
// maximum (tau 0.125; after a query tile's first key tile found only when P's codes, written against m as it stands,
// show that it may have moved), then P as the P V product's e4m3 A fragments, either exact, P8 = e4m3(2^(x - m + 8))
// (p_mode "exact"), or as lean codes, the e4m3 value whose bit pattern is max(0, rne(8 (x - m) + 120)) (p_mode "lean":
// two FMA-pipe instructions per score, no MUFU). Numerics: zyfa.numerics with p_shift 8.
#pragma once

#include "config.cuh"
#include "ptx.cuh"
#include "tile.cuh"

namespace zyfa {

// Lean P's code of 2^y is 8 y + 56 (e4m3: 3 mantissa bits, 1.0 is code 56), so 8 (x - m) + 56 + 8 p_shift.
constexpr float kLeanCodeOffset = 56.0f + 8.0f * E4m3::kPShift;  // 120: the code of the row maximum
// The codes are formed in [0, 1] as (8 (x - m) + 120) / 128 by a saturating FMA (the clamp at code 0 for free;
// codes stay <= 121 by the P range guard), then an FMA by 128 plus 1.5 * 2^23 rounds them to an integer in the
// low mantissa bits (FMA pipe only: a float->int conversion would take the MUFU pipe, which ex2 needs).
constexpr float kLeanCodeScale = 128.0f;
constexpr float kRoundToInteger = 12582912.0f;  // 1.5 * 2^23: x + this has rne(x) in its low mantissa bits

// The lazy row maximum of one key tile's scores: it moves when the tile's maximum exceeds it by more than tau, and
// factor[h] = 2^(m_old - m_new) is returned for O and l (1 where it did not move). A warp vote skips the quad
// reductions when no partial maximum exceeds m + tau (the row maximum cannot move then: the results are the same).
template <class C>
__device__ __forceinline__ void row_maxima(const float (&s)[64], RowState& st, float c, float (&factor)[2]) {
  float local[2];
  partial_maxima(s, local);
  factor[0] = factor[1] = 1.0f;
  // c > 0: the maximum of the scaled scores is the scaled maximum, with the same rounding
  if (__any_sync(0xffffffff, local[0] * c > st.m[0] + C::kTau || local[1] * c > st.m[1] + C::kTau)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float mt = quad_max(local[h]) * c;
      if (mt > st.m[h] + C::kTau) {
        factor[h] = ex2(st.m[h] - mt);
        st.m[h] = mt;
      }
    }
  }
}

// Exact P of score register r before its e4m3 rounding: 2^(x - m + 8), x - m + 8 as one FMA.
template <class C>
struct ExactP {
  float c, bias[2];
  __device__ ExactP(const RowState& st, float c) : c(c), bias{C::kPShift - st.m[0], C::kPShift - st.m[1]} {}
  __device__ __forceinline__ float operator()(float s, int r) const { return ex2(fmaf(s, c, bias[acc_half(r)])); }
};

// Exact P: scores -> 2^(x - m + 8) in place (FP32, rounded to e4m3 by pack_p).
template <class C>
__device__ __forceinline__ void exact_p(float (&s)[64], const RowState& st, float c) {
  const ExactP<C> p(st, c);
#pragma unroll
  for (int r = 0; r < 64; ++r) s[r] = p(s[r], r);
}

// Fragment register i of pack_p's order holds accumulator registers r, r + 1, r + 4, r + 5 from this r.
__device__ constexpr int fragment_reg(int i) { return 16 * (i / 4) + 8 * (i % 4 / 2) + 2 * (i % 2); }

// Lean P: scores -> e4m3 codes max(0, rne(8 (x - m) + 120)), gathered four to a register in pack_p's order.
__device__ __forceinline__ void lean_p(const float (&s)[64], const RowState& st, float c, uint32_t (&pf)[16]) {
  const float scale = c * (8.0f / kLeanCodeScale);  // exact: a power of two
  const float bias[2] = {(kLeanCodeOffset - 8.0f * st.m[0]) / kLeanCodeScale,
                         (kLeanCodeOffset - 8.0f * st.m[1]) / kLeanCodeScale};
  auto code = [&](int r) {  // FP32 whose low byte is the code
    return __float_as_uint(fmaf(fma_sat(s[r], scale, bias[acc_half(r)]), kLeanCodeScale, kRoundToInteger));
  };
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int r = fragment_reg(i);
    pf[i] = gather_low_bytes(code(r), code(r + 1), code(r + 4), code(r + 5));
  }
}

// Exact P straight into the fragments, the scores kept (for the moved-maximum test's second pass).
template <class C>
__device__ __forceinline__ void exact_codes(const float (&s)[64], const RowState& st, float c, uint32_t (&pf)[16]) {
  const ExactP<C> p(st, c);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int r = fragment_reg(i);
    pf[i] = pack_e4m3x4(p(s[r], r), p(s[r + 1], r + 1), p(s[r + 4], r + 4), p(s[r + 5], r + 5));
  }
}

// The moved-maximum test on the codes (C::kCodeTest). P written against the reference maximum as it stands is the
// model's P unless a row maximum moves, and a row maximum moves (by more than tau) only if one of its row's codes is
// 0x79 or more: exact P's 2^(x - m + 8) rounds to 0x79 (288) or more for x - m > log2(272 / 256) = 0.087, lean P's
// code 8 (x - m) + 120 is 0x79 (121) or more for x - m >= 1/16, both below tau = 1/8. Adding 7 to every byte sets its
// top bit exactly for codes 0x79 .. 0x80 (codes are at most 0x80: no carry leaves a byte), so the OR of the sums
// tells. The margins (0.038 and 0.0625 binades) stay far above the roundings of x - m while |m| < 2^14; past that,
// or on a NaN code (0x7f), the warp takes the row maxima's path.
constexpr uint32_t kMovedCodeBias = 0x07070707u;  // per byte: 0x79 + 7 = 0x80
constexpr uint32_t kByteTops = 0x80808080u;
constexpr float kCodeTestMaxM = 16384.0f;  // 2^14

__device__ __forceinline__ bool codes_may_have_moved(const uint32_t (&pf)[16], const RowState& st) {
  uint32_t tops = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) tops |= pf[i] + kMovedCodeBias;
  return warp_may_have_moved(tops, kByteTops, st, kCodeTestMaxM);
}

// P (FP32, S accumulator layout) -> e4m3 A fragments of the P V product, four k = 32 steps of four registers.
// The A operand's register j of a step holds row half j%2, k columns 4(l%4) + {0..3} (+16 for j >= 2); the
// accumulator holds key columns 2(l%4) + {0, 1, 8, 9} (+16) there. Rather than move bytes between lanes, V^T's keys
// are stored permuted (the host's pre-pass): A column 4t + 2a + b holds key 8a + 2t + b of each 16, so these
// registers are the fragments as they stand.
__device__ __forceinline__ void pack_p(const float (&s)[64], uint32_t (&pf)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int r = fragment_reg(i);  // registers r, r + 1 (keys 2t, 2t + 1), r + 4, r + 5
    pf[i] = pack_e4m3x4(s[r], s[r + 1], s[r + 4], s[r + 5]);
  }
}

// This lane's part of the row sums of a tile: the rounded P from the packed e4m3 fragments, in f16x2 (exact
// conversion, rounded additions) then FP32 (the ones columns of an N = 136 product lose the small probabilities of
// a tile with an attention sink in the tensor core's 13-bit accumulator: docs/sm90a.md). The quad's four parts are
// added at the end of the query tile.
__device__ __forceinline__ void tile_sums(const uint32_t (&pf)[16], float (&sums)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t part[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // fragment registers 4k + h and 4k + h + 2 hold row half h
      uint32_t a, b, c, d;
      unpack_e4m3x4(pf[4 * k + h], a, b);
      unpack_e4m3x4(pf[4 * k + h + 2], c, d);
      part[k] = hadd2(hadd2(a, b), hadd2(c, d));
    }
    sums[h] = f16x2_sum(hadd2(part[0], part[1])) + f16x2_sum(hadd2(part[2], part[3]));
  }
}

// O and l by the factors of a tile whose maximum moved (row_maxima).
__device__ __forceinline__ void rescale(float (&o)[64], RowState& st, const float (&factor)[2]) {
  if (factor[0] != 1.0f || factor[1] != 1.0f) {
    scale_rows(o, factor);
    st.l[0] *= factor[0];
    st.l[1] *= factor[1];
  }
}

// The softmax of one key tile: row maxima (factor for O and l), then P as e4m3 A fragments. kTestCodes (a tile after
// the first, C::kCodeTest): P first against m as it stands, kept unless the codes show that a maximum may have moved.
template <class C, bool kTestCodes = false>
__device__ __forceinline__ void probabilities(float (&s)[64], RowState& st, float c, float (&factor)[2],
                                              uint32_t (&pf)[16]) {
  if constexpr (kTestCodes) {
    if constexpr (C::kPMode == PMode::kLean) {
      lean_p(s, st, c, pf);
    } else {
      exact_codes<C>(s, st, c, pf);
    }
    if (!codes_may_have_moved(pf, st)) {
      factor[0] = factor[1] = 1.0f;
      return;
    }
  }
  row_maxima<C>(s, st, c, factor);
  if constexpr (C::kPMode == PMode::kLean) {
    lean_p(s, st, c, pf);
  } else {
    exact_p<C>(s, st, c);
    pack_p(s, pf);
  }
}

}  // namespace zyfa
