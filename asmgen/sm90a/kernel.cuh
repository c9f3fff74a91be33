// One CTA of the persistent grid: warpgroup 0 the producer (producer.cuh), warpgroups 1 and 2 the consumers (the
// element type's main loop: mainloop_bf16.cuh, mainloop_fp8.cuh), meeting in the shared-memory ring (pipeline.cuh).
#pragma once

#include "config.cuh"
#include "pipeline.cuh"
#include "producer.cuh"
#include "ptx.cuh"

namespace zyfa {

// A consumer warpgroup (0 or 1), defined by the kernel's main loop.
template <class C, class Params>
__device__ void consume(uint8_t* smem, const Barriers& bars, const Params& p, int consumer);

template <class C, class Params>
__device__ void attention_fwd(const TensorMap* tq, const TensorMap* tk, const TensorMap* tv, const Params& p) {
  using L = SharedLayout<C>;
  static_assert(L::kBytes + kAtomBytes == C::kDynamicSharedBytes, "shared memory layout and manifest disagree");
  extern __shared__ uint8_t smem_raw[];
  // The 128-byte swizzle repeats every 1024 bytes; TMA and wgmma both assume boxes start on that boundary.
  uint8_t* smem = smem_raw + ((kAtomBytes - smem_u32(smem_raw) % kAtomBytes) % kAtomBytes);
  const Barriers bars{smem_u32(smem) + L::kBarriers};
  // Broadcast from lane 0, ptxas knows the index is warp-uniform, and the consumers' shared-memory addresses and
  // wgmma descriptors derived from it live in uniform registers (no R2UR before every wgmma).
  const int warpgroup = __shfl_sync(0xffffffff, threadIdx.x / kThreadsPerWarpgroup, 0);

  if (threadIdx.x == 0) {
    tma_prefetch_map(tq);
    tma_prefetch_map(tk);
    tma_prefetch_map(tv);
    mbar_init(bars.q_full(), 1);
    mbar_init(bars.q_empty(), kConsumerWarps);
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(bars.k_full(s), 1);
      mbar_init(bars.v_full(s), 1);
      mbar_init(bars.k_empty(s), kConsumerWarps);
      mbar_init(bars.v_empty(s), kConsumerWarps);
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    regs_release<kProducerRegs>();
    if (threadIdx.x == 0) produce<C>(tq, tk, tv, smem, bars, p);
  } else {
    regs_claim<kConsumerRegs>();
    consume<C>(smem, bars, p, warpgroup - 1);
    // the last tile's rows stored before the CTA's shared memory goes
    if constexpr (C::kStore == Store::kBulk) bulk_wait();
  }
}

}  // namespace zyfa
