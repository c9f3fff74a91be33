// What configures an sm90a attention kernel: the CTA shape every kernel shares, the element types' traits, and the
// two consumer schedules. A kernel is one instantiation of the pieces (producer.cuh, the element type's main loop
// and softmax: mainloop_bf16.cuh and softmax_bf16.cuh or mainloop_fp8.cuh and softmax_fp8.cuh, epilogue.cuh,
// tile_scheduler.cuh) with a `Config`, which the build writes into "kernel_config.cuh" from the kernel's manifest
// entry (asmgen/sm90a/__init__.py, config_header):
//
//   #define ZYFA_KERNEL <symbol>
//   struct Config : Bf16 | E4m3 {               // the element type's traits
//     static constexpr int kDQk, kDV;           // head dims
//     static constexpr int kStages;             // depth of the K/V ring
//     static constexpr float kTau;              // rescale threshold of the lazy row maximum, base-2 units
//     using Schedule = PingPong | Independent;  // how the two consumers issue their GEMMs
//     static constexpr Store kStore;            // how O leaves: direct, staged or by bulk copies (epilogue.cuh)
//     static constexpr bool kProbeRing;         // the next step's K and V probed under the softmax (pipeline.cuh)
//     static constexpr bool kCodeTest;          // after the first key tile, row maxima only when the packed P
//                                               // shows one may have moved (softmax_bf16.cuh, softmax_fp8.cuh)
//     // BF16, the per-tile choices (the traits' defaults: off):
//     static constexpr bool kLeanEpilogue;      // rows finished under the last P V (epilogue.cuh)
//     static constexpr bool kCompactTail;       // one code-test loop, the diagonal step masked by a flag
//     static constexpr bool kKFirst;            // a query tile's first K loaded before its Q (producer.cuh)
//     static constexpr bool kFirstPair;         // a query tile's first two QK^T in one turn (code-test loop)
//     // FP8:
//     static constexpr PMode kPMode;            // exact or lean P (softmax_fp8.cuh)
//     static constexpr int kDynamicSharedBytes; // what the launch provides (checked against the layout)
//   };
#pragma once

#include "ptx.cuh"

#include <cstdint>

namespace zyfa {

constexpr int kTileM = 128;           // query rows per job tile (two consumer warpgroups of 64)
constexpr int kTileN = 128;           // keys per tile
constexpr int kRowsPerConsumer = 64;  // wgmma M
constexpr int kAtomRowBytes = 128;    // a row of the 128-byte swizzle
constexpr int kAtomBytes = 8 * kAtomRowBytes;  // 8 rows: the swizzle pattern's period
constexpr int kThreadsPerWarpgroup = 128;
constexpr int kConsumerWarps = 8;
constexpr int kThreads = 3 * kThreadsPerWarpgroup;  // producer warpgroup + two consumer warpgroups
constexpr uint32_t kProducerRegs = 24;
constexpr uint32_t kConsumerRegs = 240;
constexpr uint32_t kPingBarrier = 1;  // named barriers 1 and 2: one per consumer warpgroup (PingPong)
constexpr float kLn2 = 0.6931471805599453f;

// BF16 operands: TMA boxes of 64 columns (128 bytes, the swizzle width) by 128 rows; V arrives as stored (keys x d_v,
// MN-major for the P V product).
struct Bf16 {
  static constexpr int kBoxCols = 64;             // columns per 128-byte swizzled row: TMA box width, wgmma atom
  static constexpr int kBoxBytes = 128 * kBoxCols * 2;  // one 128-row box
  static constexpr int kMmaK = 16;                // wgmma K for 16-bit operands
  static constexpr float kPShift = 0.0f;          // P as computed (p_shift 0)
  static constexpr bool kVTransposed = false;
  // The per-tile choices (config_header sets them where measured to gain):
  static constexpr bool kLeanEpilogue = false;  // rows finished under the last P V, the lse by lg2.approx
  static constexpr bool kCompactTail = false;   // the code-test loop masks its diagonal step by a flag
  static constexpr bool kKFirst = false;        // the producer loads a query tile's first K before its Q
  static constexpr bool kFirstPair = false;     // the code-test loop issues key tiles 0 and 1's QK^T in one turn
  static constexpr int tile_bytes(int cols) { return (cols + kBoxCols - 1) / kBoxCols * kBoxBytes; }  // 128 rows
  static constexpr int v_tile_bytes(int d_v) { return tile_bytes(d_v); }  // 128 keys x d_v
};

// FP8 e4m3 operands: boxes of 128 columns (128 bytes) by 128 rows; wgmma reads 8-bit shared-memory operands K-major
// only, so V arrives transposed (V^T, keys contiguous, from the host's pre-pass).
struct E4m3 {
  static constexpr int kBoxCols = 128;
  static constexpr int kBoxBytes = 128 * kBoxCols;
  static constexpr int kMmaK = 32;           // wgmma K for 8-bit operands
  static constexpr float kPShift = 8.0f;     // P is written 2^8 larger before the e4m3 rounding (p_shift 8)
  static constexpr bool kVTransposed = true;
  static constexpr bool kLeanEpilogue = false;  // Bf16's per-tile choices, off (the epilogue and producer read them)
  static constexpr bool kKFirst = false;
  // d_qk = 192 takes two boxes, the second half zeros
  static constexpr int tile_bytes(int cols) { return (cols + kBoxCols - 1) / kBoxCols * kBoxBytes; }
  static constexpr int v_tile_bytes(int d_v) { return d_v * kAtomRowBytes; }  // V^T: d_v rows of 128 keys
};

// How the epilogue stores O (epilogue.cuh): from the accumulator in 4-byte stores, through shared memory in 16-byte
// stores of whole 128-byte rows, or through shared memory by bulk copies of whole rows (the TMA engine).
enum class Store { kDirect, kStaged, kBulk };

// How the FP8 kernels write P (the manifest's p_mode, softmax_fp8.cuh).
enum class PMode { kExact, kLean };

// Consumer schedules. PingPong: named barriers make the two consumers take turns issuing their GEMMs, so one's
// softmax hides under the other's MMA. Independent: each issues as soon as its inputs are ready.
struct PingPong {
  static constexpr bool kTurns = true;
};
struct Independent {
  static constexpr bool kTurns = false;
};

// The consumer schedule's turns: under PingPong a consumer waits, before issuing GEMMs, until its partner has
// issued its own, and lets the partner go after; Independent consumers issue at once.
template <class Schedule>
struct Turns {
  uint32_t mine, other;
  bool first;  // the consumer whose turn comes first in every step (consumer 0)
  // Whether this consumer waits for a step's K and V itself: under PingPong only the first does, and its partner,
  // which issues only after the first's turn, finds them loaded (fewer barrier polls on the way to the GEMMs).
  __device__ bool leads() const { return !Schedule::kTurns || first; }
  __device__ void acquire() const {
    if constexpr (Schedule::kTurns) named_barrier_sync(mine, 2 * kThreadsPerWarpgroup);
  }
  __device__ void release() const {
    if constexpr (Schedule::kTurns) named_barrier_arrive(other, 2 * kThreadsPerWarpgroup);
  }
  // Issues this consumer's GEMMs in its turn: `gemms` (wgmma instructions and their commits) after the register
  // fence that orders them behind the accumulators' last writes.
  template <class Gemms>
  __device__ __forceinline__ void issue(Gemms&& gemms) const {
    acquire();
    wgmma_fence();
    gemms();
    release();
  }
};

}  // namespace zyfa
