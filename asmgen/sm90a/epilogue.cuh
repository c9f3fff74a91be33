// The epilogue of a query tile: the thread's two rows of O / l to BF16 in the output, and the FP32 log-sum-exp
// lse = ln2 (m - p_shift + log2 l), with log2 l = -log2(1/l) (one division per row; O * (1/l) is within an FP32
// ulp of O / l), or with C::kLeanEpilogue lg2.approx(l) (absolute error about 2^-22, the rows finished under the
// last P V). Rows past seqlen (the last tile's, which TMA read as zeros) are not stored.
//
// C::kStore: the accumulator's layout gives a warp's 4-byte store (Store::kDirect) 8 rows of 16 bytes, i.e. 8 L1
// wavefronts for 512 bytes. Store::kStaged: each warp passes its 16 rows through its own 2 KiB of shared memory, 64
// columns at a time: stmatrix writes the accumulator's 8x8 blocks in row order, each lane reads back 16 contiguous
// bytes, and each 16-byte store of the warp writes 4 whole 128-byte rows (4 wavefronts for 512 bytes, a quarter of
// the stores). Store::kBulk: each warp writes its 16 whole rows into its staging the same way and hands each row to
// the TMA engine as one bulk copy, so the stores leave the warp's instruction stream; the next query tile's epilogue
// waits until the copies have read the staging, and the CTA until they are done (kernel.cuh).
#pragma once

#include "pipeline.cuh"
#include "ptx.cuh"
#include "tile.cuh"
#include "tile_scheduler.cuh"

namespace zyfa {

// 16-byte chunks of a staging row (8 BF16 columns, an 8x8 matrix's row), XOR-swizzled by the row's index mod 8 so
// that the 8 rows of a matrix (stmatrix) and the 8 chunks of a row (the read-back) each fall in distinct banks.
constexpr int kChunkBytes = 16;
constexpr int kChunkCols = kChunkBytes / 2;
__device__ __forceinline__ uint32_t stage_chunk(uint32_t stage, int row, int chunk) {
  return stage + row * kAtomRowBytes + kChunkBytes * (chunk ^ (row % 8));
}

// This thread's two rows' factors on O (1 / l times `out_scale()`) into `scale`, and their log-sum-exp into lse;
// rows past seqlen are not stored. `warp_row`: the first of the warp's 16 rows in the sequence.
template <class C, class Params, class OutScale>
__device__ __forceinline__ void finish_rows(const Params& p, const Job& job, int warp_row, int lane,
                                            const RowState& rows, OutScale&& out_scale, float (&scale)[2]) {
  const int head_row = job.batch * p.heads + job.head;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = quad_sum(rows.l[h]);
    const float inv_l = 1.0f / l;
    scale[h] = inv_l * out_scale();
    const int q = warp_row + lane / 4 + 8 * h;
    // C::kLeanEpilogue: log2 l by the MUFU unit (~4 instructions against ~30 of the software log2f of 1/l)
    const float log2_l = C::kLeanEpilogue ? lg2(l) : -log2f(inv_l);
    if (q < p.seqlen && lane % 4 == 0)
      p.lse[static_cast<long long>(head_row) * p.seqlen + q] = kLn2 * (rows.m[h] - C::kPShift + log2_l);
  }
}

// stmatrix x4 of the warp's 16 rows, column blocks c and c + 1 (8 columns each) of O, scaled and packed to BF16:
// matrix j (addresses from lanes 8j..8j+7) is row half j%2 of block c + j/2. `at(row, block)`: the staging address
// of a row's 16-byte chunk of a block, for the row and block this lane addresses.
template <class At>
__device__ __forceinline__ void stage_block_pair(const float (&o)[64], const float (&scale)[2], int c, int lane,
                                                 At&& at) {
  uint32_t m[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int h = j % 2, r = 4 * (c + j / 2) + 2 * h;
    m[j] = pack_bf16x2(o[r] * scale[h], o[r + 1] * scale[h]);
  }
  const int j = lane / 8;
  stmatrix_x4(at(8 * (j % 2) + lane % 8, j / 2), m[0], m[1], m[2], m[3]);
}

// The staged store (Store::kStaged) of a warp's 16 rows from `warp_row` on, O times this thread's rows' `scale`.
template <class C, class Params>
__device__ __forceinline__ void store_staged(const Params& p, const Job& job, int warp_row, int lane,
                                             const float (&o)[64], const float (&scale)[2], uint32_t stage) {
  uint16_t* const out = p.out + job.batch * p.out_stride_b + job.head * p.out_stride_h;
  static_assert(C::kDV % kStageCols == 0, "the staged epilogue writes passes of 64 columns");
  constexpr int kReads = 16 * kAtomRowBytes / (32 * kChunkBytes);  // 16-byte reads per lane and pass
  // Lane l reads back chunk l%8 of rows 4y + l/8 of the warp's 16.
  uint16_t* dst[kReads];
  bool in_seq[kReads];
  if constexpr (C::kLeanEpilogue) {  // one row address, the others 4 rows apart; the row test apart from it
    uint16_t* const first = out + (warp_row + lane / 8) * p.out_stride_s + kChunkCols * (lane % 8);
#pragma unroll
    for (int y = 0; y < kReads; ++y) {
      dst[y] = first + 4 * y * p.out_stride_s;
      in_seq[y] = warp_row + 4 * y + lane / 8 < p.seqlen;
    }
  } else {
#pragma unroll
    for (int y = 0; y < kReads; ++y) {
      const int q = warp_row + 4 * y + lane / 8;
      dst[y] = q < p.seqlen ? out + q * p.out_stride_s + kChunkCols * (lane % 8) : nullptr;
      in_seq[y] = dst[y] != nullptr;
    }
  }
#pragma unroll
  for (int pass = 0; pass < C::kDV / kStageCols; ++pass) {
    __syncwarp();  // the previous pass's (or query tile's) reads of the staging are done
#pragma unroll
    for (int x = 0; x < kStageCols / kChunkCols / 2; ++x) {
      stage_block_pair(o, scale, kStageCols / kChunkCols * pass + 2 * x, lane,
                       [&](int row, int block) { return stage_chunk(stage, row, 2 * x + block); });
    }
    __syncwarp();  // the warp's blocks are in the staging
#pragma unroll
    for (int y = 0; y < kReads; ++y) {
      const uint4 v = lds128(stage_chunk(stage, 4 * y + lane / 8, lane % 8));
      if constexpr (C::kLeanEpilogue) {
        if (in_seq[y]) stg128(dst[y] + kStageCols * pass, v);
      } else if (in_seq[y]) {
        *reinterpret_cast<uint4*>(dst[y] + kStageCols * pass) = v;
      }
    }
  }
}

// O times this thread's rows' `scale` (finish_rows) to BF16 in the output, by C::kStore: the warp's 16 rows from
// `warp_row` on; `stage`: this warp's staging (Store::kStaged, Store::kBulk).
template <class C, class Params>
__device__ __forceinline__ void store_rows(const Params& p, const Job& job, int warp_row, int lane,
                                           const float (&o)[64], const float (&scale)[2], uint32_t stage) {
  if constexpr (C::kStore == Store::kDirect) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int q = warp_row + lane / 4 + 8 * h;
      if (q >= p.seqlen) continue;
      uint16_t* out = p.out + job.batch * p.out_stride_b + q * p.out_stride_s + job.head * p.out_stride_h;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int r = 4 * i + 2 * h;
        *reinterpret_cast<uint32_t*>(out + acc_col(r, lane)) = pack_bf16x2(o[r] * scale[h], o[r + 1] * scale[h]);
      }
    }
  } else if constexpr (C::kStore == Store::kStaged) {
    store_staged<C>(p, job, warp_row, lane, o, scale, stage);
  } else {
    // The warp's 16 rows into its staging in row order (stmatrix), then lanes 0..15 each hand one whole row to the
    // TMA engine (a 256-byte bulk copy) and the warp goes on; the next tile waits until the copies have read it.
    static_assert(C::kDV * 2 == kBulkRowBytes, "bulk rows are 128 BF16 columns");
    bulk_wait_read();
    __syncwarp();  // the previous tile's copies have read the staging
#pragma unroll
    for (int x = 0; x < C::kDV / kChunkCols / 2; ++x) {
      stage_block_pair(o, scale, 2 * x, lane,
                       [&](int row, int block) { return stage + row * kBulkRowPitch + kChunkBytes * (2 * x + block); });
    }
    fence_proxy_async_shared();
    __syncwarp();
    const int q = warp_row + lane;
    if (lane < 16 && q < p.seqlen) {
      bulk_store(p.out + job.batch * p.out_stride_b + q * p.out_stride_s + job.head * p.out_stride_h,
                 stage + lane * kBulkRowPitch, kBulkRowBytes);
      bulk_commit();
    }
  }
}

// The epilogue of the rows of consumer warpgroup `consumer`'s warp `warp`, lane `lane`. `out_scale()` is a factor on
// O / l (the FP8 kernels' v_descale, loaded here: a register fewer through the key loop). Each lane holds a quarter
// of its rows' sums; the quad adds them.
template <class C, class Params, class OutScale>
__device__ __forceinline__ void store_tile(const Params& p, const Job& job, int tile, int consumer, int warp, int lane,
                                           const float (&o)[64], const RowState& rows, OutScale&& out_scale,
                                           uint32_t stage) {
  const int warp_row = tile * kTileM + consumer * kRowsPerConsumer + 16 * warp;
  float scale[2];
  finish_rows<C>(p, job, warp_row, lane, rows, out_scale, scale);
  store_rows<C>(p, job, warp_row, lane, o, scale, stage);
}

}  // namespace zyfa
