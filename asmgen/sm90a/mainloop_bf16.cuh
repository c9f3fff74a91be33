// The consumer main loop of the BF16 kernels: for each query tile of the walk, the key tiles 0..tile in increasing
// order (the numerics model's order), then the epilogue. S = Q K^T and O += P V with wgmma, the softmax in
// registers between them. After the first key tile every step issues QK^T of tile j and P V of tile j-1 together,
// waits for S only and runs tile j's softmax under the running P V, then waits for P V, rescales O if the row
// maximum moved and packs P. With the moved-maximum test (C::kCodeTest) P is packed under P V too, into the other of
// two fragment sets (the running P V reads the first), which take turns two steps per loop trip. Only the diagonal
// key tile, a separate instance of the step, is masked.
#pragma once

#include "epilogue.cuh"
#include "pipeline.cuh"
#include "ptx.cuh"
#include "softmax_bf16.cuh"
#include "tile.cuh"
#include "tile_scheduler.cuh"

#include <type_traits>

namespace zyfa {

// S (64x128) = Q K^T for this consumer's rows. Each wgmma's descriptors are a tile's base descriptor plus the
// step's offset (one 32-bit add, smem_desc_advance) rather than encoded from the address (about five integer
// instructions more per wgmma, on the GEMM-issue path that the other consumer waits behind under ping-pong).
template <class C>
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t q_rows, uint32_t k_tile) {
  const uint64_t q_desc = smem_desc_sw128(q_rows, 16, kAtomBytes);
  const uint64_t k_desc = smem_desc_sw128(k_tile, 16, kAtomBytes);
#pragma unroll
  for (int k = 0; k < C::kDQk / C::kMmaK; ++k) {
    // K step k lies in box k/4, at byte 32*(k%4) of each swizzled 128-byte row.
    const uint32_t offset = (k / 4) * C::kBoxBytes + (k % 4) * (C::kMmaK * 2);
    wgmma_m64n128k16_ss(s, smem_desc_advance(q_desc, offset), smem_desc_advance(k_desc, offset), k > 0);
  }
}

// O (64x128) += P V, P from the packed fragments.
template <class C>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pf)[32], uint32_t v_tile) {
  const uint64_t v_desc = smem_desc_sw128(v_tile, C::kBoxBytes, kAtomBytes);
#pragma unroll
  for (int k = 0; k < kTileN / C::kMmaK; ++k) {
    const uint32_t a[4] = {pf[4 * k], pf[4 * k + 1], pf[4 * k + 2], pf[4 * k + 3]};
    // 16 keys = 16 rows of 128 bytes; the next 64 columns of V are the next box.
    wgmma_m64n128k16_rs_bt(o, a, smem_desc_advance(v_desc, k * C::kMmaK * kAtomRowBytes));
  }
}

template <class C, class Params>
__device__ void consume(uint8_t* smem, const Barriers& bars, const Params& p, int consumer) {
  using L = SharedLayout<C>;
  const uint32_t base = smem_u32(smem);
  const int thread = threadIdx.x % kThreadsPerWarpgroup;
  const int warp = thread / 32;
  const int lane = threadIdx.x % 32;
  const float scale_log2 = p.scale_log2;
  const uint32_t q_rows = base + L::kQ + consumer * kRowsPerConsumer * kAtomRowBytes;  // this consumer's rows
  const Turns<typename C::Schedule> turn{kPingBarrier + consumer, kPingBarrier + (consumer ^ 1), consumer == 0};
  if (consumer == 1) turn.release();  // the first consumer goes first

  RingPos<C::kStages> ring;
  RingPos<C::kStages> prev;  // the ring slot whose V the next P V reads
  uint32_t q_parity = 0;
  RowState st;
  float s[64], o[64];
  uint32_t pf[32];  // P fragments read by the next P V
  uint32_t pf2[32];  // C::kCodeTest: the other set, written while the running P V reads `pf`

  const ConsumerRing<C> smem_ring{base, lane};
  const uint32_t stage = smem_ring.staging(consumer, warp);
  LoadProbe<C> loads;

  for_each_job(p.jobs, p.num_jobs, [&](const Job& job) {
    for_each_tile(job, [&](int tile) {
      // This thread's first row inside the tile, and so inside the diagonal key tile.
      const int row0 = consumer * kRowsPerConsumer + 16 * warp + lane / 4;
      float factor[2];
      st = no_rows();
#pragma unroll
      for (int r = 0; r < 64; ++r) o[r] = 0.0f;

      mbar_wait(bars.q_full(), q_parity);
      q_parity ^= 1;

      // Key tile 0: QK^T alone (no P V before it).
      auto first_step = [&] {
        mbar_wait(bars.k_full(ring.slot), ring.parity);
        turn.issue([&] {
          issue_qk<C>(s, q_rows, smem_ring.k_tile(ring));
          wgmma_commit();
        });
        wgmma_wait<0>();
        loads.probe(bars, ring);
        fence_regs(s);
        smem_ring.release(bars.k_empty(ring.slot));
        if (tile == 0) {
          smem_ring.release(bars.q_empty());
          mask_diagonal(s, row0, lane);
        }
        softmax_tile<C>(s, st, scale_log2, factor);
        pack_p(s, pf);
        prev = ring;
        ring.advance();
      };
      // C::kFirstPair, from the second query tile on: key tiles 0 and 1 with both QK^T in one turn, S of tile 0
      // in O's registers (O accumulates nothing before the first P V), so that tile 0's softmax runs under tile
      // 1's QK^T rather than before it; then tile 1's softmax under P V of tile 0, P of tile 1 left in `pf`.
      auto first_pair = [&] {
        RingPos<C::kStages> next = ring;
        next.advance();
        mbar_wait(bars.k_full(ring.slot), ring.parity);
        mbar_wait(bars.k_full(next.slot), next.parity);
        turn.issue([&] {
          issue_qk<C>(o, q_rows, smem_ring.k_tile(ring));
          wgmma_commit();
          issue_qk<C>(s, q_rows, smem_ring.k_tile(next));
          wgmma_commit();
        });
        wgmma_wait<1>();
        fence_regs(o);
        smem_ring.release(bars.k_empty(ring.slot));
        softmax_tile<C>(o, st, scale_log2, factor);
        pack_p(o, pf2);
        // the next loads probed with an address that depends on all of tile 0's P (a select never taken): ptxas
        // would otherwise move tile 0's softmax below the wait for tile 1's S
        loads.probe_pinned(bars, next, packed_or(pf2));
        wgmma_wait<0>();
        fence_regs(s);
        smem_ring.release(bars.k_empty(next.slot));
#pragma unroll
        for (int r = 0; r < 64; ++r) o[r] = 0.0f;
        if (turn.leads()) mbar_wait(bars.v_full(ring.slot), ring.parity);
        turn.issue([&] {
          issue_pv<C>(o, pf2, smem_ring.v_tile(ring));
          wgmma_commit();
        });
        if (tile == 1) {
          smem_ring.release(bars.q_empty());
          mask_diagonal(s, row0, lane);
        }
        const bool packed = !codes_may_have_moved<C>(s, st, scale_log2, pf);
        factor[0] = factor[1] = 1.0f;
        if (!packed) softmax_tile<C>(s, st, scale_log2, factor);
        fence_regs(s);
        if (!packed) pack_p(s, pf);
        wgmma_wait<0>();
        fence_regs(o);
        smem_ring.release(bars.v_empty(ring.slot));
        rescale_o(o, factor);
        prev = next;
        ring = next;
        ring.advance();
      };
      if (C::kFirstPair && tile > 0) {
        first_pair();
      } else {
        first_step();
      }

      // One key tile after the first: S of this tile and P V of the previous one in flight together.
      auto step = [&](auto diagonal, uint32_t(&pf_read)[32], uint32_t(&pf_write)[32]) {
        if (turn.leads()) {
          loads.wait_k(bars, ring);
          loads.wait_v(bars, prev);
        }
        turn.issue([&] {
          issue_qk<C>(s, q_rows, smem_ring.k_tile(ring));
          wgmma_commit();
          issue_pv<C>(o, pf_read, smem_ring.v_tile(prev));
          wgmma_commit();
        });
        wgmma_wait<1>();  // S of this tile is ready; P V of the previous one may still run
        loads.probe(bars, ring);
        fence_regs(s);
        smem_ring.release(bars.k_empty(ring.slot));
        if constexpr (std::is_same_v<decltype(diagonal), bool>) {  // C::kCompactTail: masked by a flag
          if (diagonal) {
            smem_ring.release(bars.q_empty());
            mask_diagonal(s, row0, lane);
          }
        } else if constexpr (decltype(diagonal)::value) {
          smem_ring.release(bars.q_empty());
          mask_diagonal(s, row0, lane);
        }
        bool packed = false;
        if constexpr (C::kCodeTest) {
          packed = !codes_may_have_moved<C>(s, st, scale_log2, pf_write);
          factor[0] = factor[1] = 1.0f;
        }
        if (!packed) softmax_tile<C>(s, st, scale_log2, factor);
        fence_regs(s);  // the exponentials are done before the wait below, i.e. under the running P V
        if constexpr (C::kCodeTest) {
          if (!packed) pack_p(s, pf_write);  // the other set: the running P V reads pf_read
        }
        wgmma_wait<0>();
        fence_regs(o);
        smem_ring.release(bars.v_empty(prev.slot));
        rescale_o(o, factor);
        if constexpr (!C::kCodeTest) pack_p(s, pf_write);
        prev = ring;
        ring.advance();
      };
      const int warp_row = tile * kTileM + consumer * kRowsPerConsumer + 16 * warp;
      float scale[2];  // C::kLeanEpilogue: the rows' 1 / l, and their lse stored, under the last P V (no O needed)
      // The last key tile's P V, from `pf_last`.
      auto last_pv = [&](const uint32_t(&pf_last)[32]) {
        loads.wait_v(bars, prev);
        turn.issue([&] {
          issue_pv<C>(o, pf_last, smem_ring.v_tile(prev));
          wgmma_commit();
        });
        if constexpr (C::kLeanEpilogue) finish_rows<C>(p, job, warp_row, lane, st, [] { return 1.0f; }, scale);
        wgmma_wait<0>();
        fence_regs(o);
        smem_ring.release(bars.v_empty(prev.slot));
      };
      if constexpr (C::kCodeTest && C::kCompactTail) {
        // Two step forms, the diagonal key tile among them (masked by a flag), and the last P V after either: a
        // query tile runs through less code than with a masked form and a tail of each parity.
        for (int kt = 1;; kt += 2) {
          if (kt > tile) {
            last_pv(pf);
            break;
          }
          step(kt == tile, pf, pf2);
          if (kt + 1 > tile) {
            last_pv(pf2);
            break;
          }
          step(kt + 1 == tile, pf2, pf);
        }
      } else if constexpr (C::kFirstPair) {  // after the first step (tile 0) or the first pair: P in `pf`
        // (the two-set loop below from key tile 2; as one loop with the next form, ptxas schedules both otherwise)
        if (tile <= 1) {
          last_pv(pf);
        } else {
          int kt = 2;
          for (; kt + 1 < tile; kt += 2) {
            step(std::false_type{}, pf, pf2);
            step(std::false_type{}, pf2, pf);
          }
          if (kt < tile) {
            step(std::false_type{}, pf, pf2);
            step(std::true_type{}, pf2, pf);
            last_pv(pf);
          } else {
            step(std::true_type{}, pf, pf2);
            last_pv(pf2);
          }
        }
      } else if constexpr (C::kCodeTest) {  // the two P sets take turns: two steps per loop trip
        int kt = 1;
        for (; kt + 1 < tile; kt += 2) {
          step(std::false_type{}, pf, pf2);
          step(std::false_type{}, pf2, pf);
        }
        if (kt < tile) {
          step(std::false_type{}, pf, pf2);
          step(std::true_type{}, pf2, pf);
          last_pv(pf);
        } else if (tile > 0) {
          step(std::true_type{}, pf, pf2);
          last_pv(pf2);
        } else {
          last_pv(pf);
        }
      } else {
        for (int kt = 1; kt < tile; ++kt) step(std::false_type{}, pf, pf);
        if (tile > 0) step(std::true_type{}, pf, pf);  // only the diagonal tile needs the causal mask
        last_pv(pf);
      }

      if constexpr (C::kLeanEpilogue) {
        store_rows<C>(p, job, warp_row, lane, o, scale, stage);
      } else {
        store_tile<C>(p, job, tile, consumer, warp, lane, o, st, [] { return 1.0f; }, stage);
      }
    });
  });
}

}  // namespace zyfa
