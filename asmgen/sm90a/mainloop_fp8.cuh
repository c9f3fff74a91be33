// The consumer main loop of the FP8 kernels: for each query tile of the walk, the key tiles 0..tile in increasing
// order, then the epilogue (epilogue.cuh, with v_descale). After the first key tile every step issues QK^T of tile
// j and P V of tile j-1 together and waits for both: the other consumer's GEMMs run under this one's softmax.
// Two-level accumulation: each key tile's P V lands in a fresh wgmma accumulator (Hopper's FP8 accumulator keeps
// about 13 mantissa bits) that is added into the FP32 registers O and l. Only the diagonal key tile is masked.
#pragma once

#include "epilogue.cuh"
#include "pipeline.cuh"
#include "ptx.cuh"
#include "softmax_fp8.cuh"
#include "tile.cuh"
#include "tile_scheduler.cuh"

#include <type_traits>

namespace zyfa {

// S (64x128) = Q K^T, e4m3.
template <class C>
__device__ __forceinline__ void issue_qk_e4m3(float (&s)[64], uint32_t q_rows, uint32_t k_tile) {
  const uint64_t q_desc = smem_desc_sw128(q_rows, 16, kAtomBytes);
  const uint64_t k_desc = smem_desc_sw128(k_tile, 16, kAtomBytes);
#pragma unroll
  for (int k = 0; k < C::kDQk / C::kMmaK; ++k) {
    // K step k lies in box k/4, at byte 32 (k%4) of each swizzled 128-byte row.
    const uint32_t offset = (k / 4) * C::kBoxBytes + (k % 4) * C::kMmaK;
    wgmma_m64n128k32_ss_e4m3(s, smem_desc_advance(q_desc, offset), smem_desc_advance(k_desc, offset), k > 0);
  }
}

// acc = P V^T-tile, a fresh accumulator.
template <class C>
__device__ __forceinline__ void issue_pv_e4m3(float (&acc)[64], const uint32_t (&pf)[16], uint32_t v_tile) {
  const uint64_t v_desc = smem_desc_sw128(v_tile, 16, kAtomBytes);
#pragma unroll
  for (int k = 0; k < kTileN / C::kMmaK; ++k) {
    const uint32_t a[4] = {pf[4 * k], pf[4 * k + 1], pf[4 * k + 2], pf[4 * k + 3]};
    wgmma_m64n128k32_rs_e4m3(acc, a, smem_desc_advance(v_desc, k * C::kMmaK), k > 0);
  }
}

template <int N>
__device__ __forceinline__ void fence_acc(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The second level of the accumulation: O += acc and l += the tile's row sums, in FP32 registers. Every factor of
// tile j's softmax applies to O and l before tile j's product is added, as in the model.
__device__ __forceinline__ void add_tile(float (&o)[64], RowState& st, const float (&acc)[64], const float (&sums)[2]) {
#pragma unroll
  for (int r = 0; r < 64; ++r) o[r] += acc[r];
  st.l[0] += sums[0];
  st.l[1] += sums[1];
}

template <class C, class Params>
__device__ void consume(uint8_t* smem, const Barriers& bars, const Params& p, int consumer) {
  using L = SharedLayout<C>;
  const uint32_t base = smem_u32(smem);
  const int thread = threadIdx.x % kThreadsPerWarpgroup;
  const int warp = thread / 32;
  const int lane = threadIdx.x % 32;
  const int group = p.heads / p.heads_k;
  const uint32_t q_rows = base + L::kQ + consumer * kRowsPerConsumer * kAtomRowBytes;
  const Turns<typename C::Schedule> turn{kPingBarrier + consumer, kPingBarrier + (consumer ^ 1), consumer == 0};
  if (consumer == 1) turn.release();

  RingPos<C::kStages> ring;
  RingPos<C::kStages> prev;
  uint32_t q_parity = 0;
  RowState st;
  float s[64], o[64], acc[64];
  uint32_t pf[16];
  float sums[2] = {0.0f, 0.0f};  // row sums of the tile whose P V is in flight

  const ConsumerRing<C> smem_ring{base, lane};
  const uint32_t stage = smem_ring.staging(consumer, warp);
  LoadProbe<C> loads;

  for_each_job(p.jobs, p.num_jobs, [&](const Job& job) {
    if (job.num_tiles() == 0) return;  // a slot that pads the table: its batch and head are -1
    const int head_k = job.head / group;
    const float qd = p.q_descale[job.batch * p.q_descale_stride_b + head_k * p.q_descale_stride_h];
    const float kd = p.k_descale[job.batch * p.k_descale_stride_b + head_k * p.k_descale_stride_h];
    const float c = __fmul_rn(__fmul_rn(p.scale_log2, qd), kd);  // the model's order
    for_each_tile(job, [&](int tile) {
      const int diag_row = consumer * kRowsPerConsumer + 16 * warp + lane / 4;
      float factor[2];
      st = no_rows();
#pragma unroll
      for (int r = 0; r < 64; ++r) o[r] = 0.0f;

      mbar_wait(bars.q_full(), q_parity);
      q_parity ^= 1;

      // Key tile 0: QK^T alone.
      mbar_wait(bars.k_full(ring.slot), ring.parity);
      turn.issue([&] {
        issue_qk_e4m3<C>(s, q_rows, smem_ring.k_tile(ring));
        wgmma_commit();
      });
      wgmma_wait<0>();
      loads.probe(bars, ring);
      fence_regs(s);
      smem_ring.release(bars.k_empty(ring.slot));
      if (tile == 0) {
        smem_ring.release(bars.q_empty());
        mask_diagonal(s, diag_row, lane);
      }
      probabilities<C>(s, st, c, factor, pf);  // m was unset: O and l are still 0, no factor needed
      tile_sums(pf, sums);
      prev = ring;
      ring.advance();

      // One key tile after the first: S of this tile and P V of the previous one in flight together.
      auto step = [&](auto diagonal) {
        if (turn.leads()) {
          loads.wait_k(bars, ring);
          loads.wait_v(bars, prev);
        }
        turn.issue([&] {
          issue_qk_e4m3<C>(s, q_rows, smem_ring.k_tile(ring));
          wgmma_commit();
          issue_pv_e4m3<C>(acc, pf, smem_ring.v_tile(prev));
          wgmma_commit();
        });
        wgmma_wait<0>();  // both: the other consumer's GEMMs run under this one's softmax
        loads.probe(bars, ring);
        fence_acc(acc);
        smem_ring.release(bars.v_empty(prev.slot));
        add_tile(o, st, acc, sums);
        fence_regs(s);
        smem_ring.release(bars.k_empty(ring.slot));
        if constexpr (decltype(diagonal)::value) {
          smem_ring.release(bars.q_empty());
          mask_diagonal(s, diag_row, lane);
        }
        probabilities<C, C::kCodeTest>(s, st, c, factor, pf);
        rescale(o, st, factor);
        tile_sums(pf, sums);
        prev = ring;
        ring.advance();
      };
      for (int kt = 1; kt < tile; ++kt) step(std::false_type{});
      if (tile > 0) step(std::true_type{});
      // The last tile's P V.
      loads.wait_v(bars, prev);
      turn.issue([&] {
        issue_pv_e4m3<C>(acc, pf, smem_ring.v_tile(prev));
        wgmma_commit();
      });
      wgmma_wait<0>();
      fence_acc(acc);
      smem_ring.release(bars.v_empty(prev.slot));
      add_tile(o, st, acc, sums);

      store_tile<C>(p, job, tile, consumer, warp, lane, o, st, [&] {
        return p.v_descale[job.batch * p.v_descale_stride_b + (job.head / group) * p.v_descale_stride_h];
      }, stage);
    });
  });
}

}  // namespace zyfa
