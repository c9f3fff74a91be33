// The producer: one thread of warpgroup 0 walks the CTA's query tiles and loads, with TMA, each tile's Q and then
// every key tile's K and V (V^T for FP8) into the ring, each completing on its "full" mbarrier once its "empty" one
// says the consumers are done with the slot.
#pragma once

#include "pipeline.cuh"
#include "ptx.cuh"
#include "tile_scheduler.cuh"

namespace zyfa {

template <class C, class Params>
__device__ void produce(const TensorMap* tq, const TensorMap* tk, const TensorMap* tv, uint8_t* smem,
                        const Barriers& bars, const Params& p) {
  using L = SharedLayout<C>;
  const uint32_t base = smem_u32(smem);
  const int group = p.heads / p.heads_k;
  RingPos<C::kStages> ring;
  uint32_t q_parity = 0;
  for_each_job(p.jobs, p.num_jobs, [&](const Job& job) {
    const int head_k = job.head / group;
    for_each_tile(job, [&](int tile) {
      // C::kKFirst: the tile's first K before its Q, whose buffer frees only at the previous tile's last QK^T
      bool k_loaded = false;
      if constexpr (C::kKFirst) {
        mbar_wait(bars.k_empty(ring.slot), ring.parity ^ 1);
        mbar_arrive_expect_tx(bars.k_full(ring.slot), L::kKBytes);
#pragma unroll
        for (int b = 0; b < L::kQBoxes; ++b)
          tma_load_4d(base + L::kK + ring.slot * L::kKBytes + b * C::kBoxBytes, tk, bars.k_full(ring.slot),
                      b * C::kBoxCols, 0, head_k, job.batch);
        k_loaded = true;
      }
      mbar_wait(bars.q_empty(), q_parity ^ 1);
      mbar_arrive_expect_tx(bars.q_full(), L::kQBytes);
#pragma unroll
      for (int b = 0; b < L::kQBoxes; ++b)
        tma_load_4d(base + L::kQ + b * C::kBoxBytes, tq, bars.q_full(), b * C::kBoxCols, tile * kTileM, job.head,
                    job.batch);
      q_parity ^= 1;
      for (int kt = 0; kt <= tile; ++kt) {
        if (!k_loaded) {
          mbar_wait(bars.k_empty(ring.slot), ring.parity ^ 1);
          mbar_arrive_expect_tx(bars.k_full(ring.slot), L::kKBytes);
#pragma unroll
          for (int b = 0; b < L::kQBoxes; ++b)
            tma_load_4d(base + L::kK + ring.slot * L::kKBytes + b * C::kBoxBytes, tk, bars.k_full(ring.slot),
                        b * C::kBoxCols, kt * kTileN, head_k, job.batch);
        }
        k_loaded = false;
        mbar_wait(bars.v_empty(ring.slot), ring.parity ^ 1);
        if constexpr (C::kVTransposed) {
          // V^T is (batch, heads_k, d_v, keys): one box of 128 keys by d_v rows.
          mbar_arrive_expect_tx(bars.v_full(ring.slot), L::kVBytes);
          tma_load_4d(base + L::kV + ring.slot * L::kVBytes, tv, bars.v_full(ring.slot), kt * kTileN, 0, head_k,
                      job.batch);
        } else {
          mbar_arrive_expect_tx(bars.v_full(ring.slot), L::kVBytes);
#pragma unroll
          for (int b = 0; b < C::kDV / C::kBoxCols; ++b)
            tma_load_4d(base + L::kV + ring.slot * L::kVBytes + b * C::kBoxBytes, tv, bars.v_full(ring.slot),
                        b * C::kBoxCols, kt * kTileN, head_k, job.batch);
        }
        ring.advance();
      }
    });
  });
}

}  // namespace zyfa
