// The shared memory the producer fills and the consumers drain: one Q tile, a ring of `kStages` K and V tiles, and
// their mbarriers; positions in the ring. Every buffer has a "full" barrier (TMA transaction bytes) and an "empty"
// one (an arrival per consumer warp).
#pragma once

#include "config.cuh"
#include "ptx.cuh"

#include <cstdint>

namespace zyfa {

// The epilogue's staging per consumer warp (epilogue.cuh). Store::kStaged: its 16 rows of one pass of 64 BF16 output
// columns (a 128-byte row), 2 KiB. Store::kBulk: its 16 whole rows (d_v = 128 BF16 columns, 256 bytes), pitched 272
// bytes apart so that the 8 rows of an 8x8 stmatrix block fall in distinct banks, 4.25 KiB.
constexpr int kStageCols = 64;
constexpr int kStageBytes = 16 * kAtomRowBytes;
constexpr int kBulkRowBytes = 256;
constexpr int kBulkRowPitch = kBulkRowBytes + 16;
constexpr int kBulkStageBytes = 16 * kBulkRowPitch;

template <class C>
struct SharedLayout {
  static constexpr int kQBoxes = (C::kDQk + C::kBoxCols - 1) / C::kBoxCols;  // TMA boxes of a Q (or K) tile
  static constexpr int kQBytes = C::tile_bytes(C::kDQk);  // a 128-row Q tile; a K tile has the same shape
  static constexpr int kKBytes = kQBytes;
  static constexpr int kVBytes = C::v_tile_bytes(C::kDV);  // a V (FP8: V^T) slot
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + C::kStages * kKBytes;
  static constexpr int kStaging = kV + C::kStages * kVBytes;  // the epilogue's, if any
  static constexpr int kWarpStagingBytes =
      C::kStore == Store::kBulk ? kBulkStageBytes : C::kStore == Store::kStaged ? kStageBytes : 0;
  static constexpr int kBarriers = kStaging + kConsumerWarps * kWarpStagingBytes;
  static constexpr int kNumBarriers = 2 + 4 * C::kStages;  // q_full, q_empty, then per slot K and V full and empty
  static constexpr int kBytes = kBarriers + kNumBarriers * 8;
};

struct Barriers {
  uint32_t base;
  __device__ uint32_t q_full() const { return base; }
  __device__ uint32_t q_empty() const { return base + 8; }
  __device__ uint32_t k_full(int s) const { return base + 16 + 32 * s; }
  __device__ uint32_t v_full(int s) const { return base + 24 + 32 * s; }
  // K and V of a slot are released separately: K once QK^T has read it, V once P V has, so the next K load
  // starts a whole tile earlier than if the slot waited for both.
  __device__ uint32_t k_empty(int s) const { return base + 32 + 32 * s; }
  __device__ uint32_t v_empty(int s) const { return base + 40 + 32 * s; }
};

// A position in the ring: slot and the parity of the round the slot is in.
template <int STAGES>
struct RingPos {
  int slot = 0;
  uint32_t parity = 0;
  __device__ void advance() {
    if (++slot == STAGES) {
      slot = 0;
      parity ^= 1;
    }
  }
};

// C::kProbeRing: right after a step's GEMM wait, a consumer probes whether the next step's K (the slot after `at`)
// and V (slot `at`) have landed (mbar_test, no waiting); the next step skips the waits found done. The barrier
// checks' latency then hides under the softmax instead of standing before the next GEMM issue.
template <class C>
struct LoadProbe {
  bool k_loaded = false, v_loaded = false;
  __device__ __forceinline__ void probe(const Barriers& bars, const RingPos<C::kStages>& at) {
    if constexpr (C::kProbeRing) {
      RingPos<C::kStages> next = at;
      next.advance();
      k_loaded = mbar_test(bars.k_full(next.slot), next.parity);
      v_loaded = mbar_test(bars.v_full(at.slot), at.parity);
    }
  }
  // probe(), with barrier addresses that depend on `pin` by a select never taken (pin is never ~0u), so that it
  // stands after the work `pin` comes from (C::kFirstPair).
  __device__ __forceinline__ void probe_pinned(const Barriers& bars, const RingPos<C::kStages>& at, uint32_t pin) {
    const uint32_t never = pin == ~0u ? 8u : 0u;
    RingPos<C::kStages> next = at;
    next.advance();
    const bool k = mbar_test(bars.k_full(next.slot) + never, next.parity);
    const bool v = mbar_test(bars.v_full(at.slot) + never, at.parity);
    if constexpr (C::kProbeRing) {
      k_loaded = k;
      v_loaded = v;
    }
  }
  __device__ __forceinline__ void wait_k(const Barriers& bars, const RingPos<C::kStages>& at) const {
    if (!k_loaded) mbar_wait(bars.k_full(at.slot), at.parity);
  }
  __device__ __forceinline__ void wait_v(const Barriers& bars, const RingPos<C::kStages>& at) const {
    if (!v_loaded) mbar_wait(bars.v_full(at.slot), at.parity);
  }
};

// A consumer warp's view of the ring: the K and V tiles of a slot, the release of a buffer (one arrival per warp on
// its "empty" barrier, once the warp's lanes are done with it), and the warp's staging for the epilogue.
template <class C>
struct ConsumerRing {
  using L = SharedLayout<C>;
  uint32_t base;  // the layout's shared-memory address
  int lane;
  __device__ uint32_t k_tile(const RingPos<C::kStages>& at) const { return base + L::kK + at.slot * L::kKBytes; }
  __device__ uint32_t v_tile(const RingPos<C::kStages>& at) const { return base + L::kV + at.slot * L::kVBytes; }
  // The epilogue's staging of consumer warpgroup `consumer`'s warp `warp` (Store::kStaged, Store::kBulk).
  __device__ uint32_t staging(int consumer, int warp) const {
    return base + L::kStaging + (consumer * kThreadsPerWarpgroup / 32 + warp) * L::kWarpStagingBytes;
  }
  __device__ void release(uint32_t bar) const {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  }
};

}  // namespace zyfa
