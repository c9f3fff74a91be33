// The epilogue of a query tile: the thread's two rows of O / l to BF16 in the output, and the FP32 log-sum-exp
// lse = ln2 (m - p_shift + log2 l), with log2 l = -log2(1/l) (one division per row; O * (1/l) is within an FP32
// ulp of O / l). Rows past seqlen (the last tile's, which TMA read as zeros) are not stored.
#pragma once

#include "ptx.cuh"
#include "tile.cuh"
#include "tile_scheduler.cuh"

namespace zyfa {

// The rows of consumer warpgroup `consumer`'s warp `warp`, lane `lane`. `out_scale()` is a factor on O / l (the
// FP8 kernels' v_descale, loaded here: a register fewer through the key loop). Each lane holds a quarter of its
// rows' sums; the quad adds them.
template <class C, class Params, class OutScale>
__device__ __forceinline__ void store_tile(const Params& p, const Job& job, int tile, int consumer, int warp, int lane,
                                           const float (&o)[64], const RowState& rows, OutScale&& out_scale) {
  const int row = tile * kTileM + consumer * kRowsPerConsumer + 16 * warp + lane / 4;
  const int head_row = job.batch * p.heads + job.head;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv_l = 1.0f / quad_sum(rows.l[h]);
    const float scale = inv_l * out_scale();
    const int q = row + 8 * h;
    if (q >= p.seqlen) continue;
    uint16_t* out = p.out + job.batch * p.out_stride_b + q * p.out_stride_s + job.head * p.out_stride_h;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int r = 4 * i + 2 * h;
      *reinterpret_cast<uint32_t*>(out + acc_col(r, lane)) = pack_bf16x2(o[r] * scale, o[r + 1] * scale);
    }
    if (lane % 4 == 0)
      p.lse[static_cast<long long>(head_row) * p.seqlen + q] = kLn2 * (rows.m[h] - C::kPShift - log2f(inv_l));
  }
}

}  // namespace zyfa
