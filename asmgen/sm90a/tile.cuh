// The wgmma accumulator's layout, seen from one thread, with the row reductions and the causal mask that work on it,
// and the online softmax's state of the thread's two rows.
#pragma once

#include <math_constants.h>

#include <cstdint>

namespace zyfa {

// Per-thread view of a 64x128 wgmma accumulator: warp w of the warpgroup holds rows 16w..16w+15; lane l holds rows
// r = 16w + l/4 and r + 8 ("half" 0 and 1), columns 8i + 2(l%4) + {0,1} in registers 4i + 2*half + {0,1}.
__device__ __forceinline__ int acc_col(int reg, int lane) { return 8 * (reg / 4) + 2 * (lane % 4) + (reg % 2); }
__device__ __forceinline__ int acc_half(int reg) { return (reg / 2) % 2; }

// The accumulator's rows times their half's factor.
__device__ __forceinline__ void scale_rows(float (&acc)[64], const float (&factor)[2]) {
#pragma unroll
  for (int r = 0; r < 64; ++r) acc[r] *= factor[acc_half(r)];
}

// Maximum over the quad of lanes that share a row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// This lane's partial maxima of its two rows over a tile's scores, as four independent chains per row (a short
// dependency chain; max is exact in any order).
__device__ __forceinline__ void partial_maxima(const float (&s)[64], float (&local)[2]) {
  constexpr int kChains = 4;
  float mx[2][kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) mx[0][c] = mx[1][c] = -CUDART_INF_F;
#pragma unroll
  for (int r = 0; r < 64; ++r) mx[acc_half(r)][(r / 4) % kChains] = fmaxf(mx[acc_half(r)][(r / 4) % kChains], s[r]);
#pragma unroll
  for (int h = 0; h < 2; ++h) local[h] = fmaxf(fmaxf(mx[h][0], mx[h][1]), fmaxf(mx[h][2], mx[h][3]));
}

// The causal mask of the diagonal key tile: keys after the row are absent.
__device__ __forceinline__ void mask_diagonal(float (&s)[64], int row0, int lane) {
#pragma unroll
  for (int r = 0; r < 64; ++r)
    if (acc_col(r, lane) > row0 + 8 * acc_half(r)) s[r] = -CUDART_INF_F;
}

// Row state of the online softmax for the thread's two rows.
struct RowState {
  float m[2];  // reference maximum, base-2 scaled units; -inf while unset
  float l[2];  // this thread's partial row sum (the quad adds its partials at the end)
};
// A query tile's row state before its first key tile.
__device__ __forceinline__ RowState no_rows() { return {{-CUDART_INF_F, -CUDART_INF_F}, {0.0f, 0.0f}}; }

// The warp's verdict of the moved-maximum test (softmax_bf16.cuh, softmax_fp8.cuh): some lane's packed P has a flag
// bit of `flags` set in `tops` (the OR of its biased P registers), or a row maximum lies outside (-max_m, max_m),
// where the test's margins are not known to hold.
__device__ __forceinline__ bool warp_may_have_moved(uint32_t tops, uint32_t flags, const RowState& st, float max_m) {
  const bool near = fabsf(st.m[0]) < max_m && fabsf(st.m[1]) < max_m;
  return __any_sync(0xffffffff, (tops & flags) != 0 || !near);
}

}  // namespace zyfa
