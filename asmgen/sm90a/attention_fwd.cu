// Causal forward attention, BF16 in, BF16 out (+ FP32 log-sum-exp), for Hopper (sm_90a).
//
// One CTA per SM walks a host-built job table (rows [batch, head, tile_lo, tile_hi], paired causal query tiles of
// 128 rows; CTA w takes rows w, w + gridDim.x, ...). Three warpgroups:
//   WG0      producer: one thread loads Q, K and V tiles with TMA into shared memory, completing on mbarriers;
//            Q through a ring of Q_STAGES slots, K and V through a ring of STAGES slots.
//   WG1, WG2 consumers: 64 query rows each. S = Q K^T and O += P V with wgmma; the softmax in registers.
// The numerics follow the model of zyfa.numerics (p_mode "bf16"): key tiles in increasing order, a lazily rescaled
// row maximum (rescale only when a tile's maximum exceeds it by more than TAU), p = 2^(x - m) in FP32, the row sum
// of unrounded p, P = bf16(p), O += P V in FP32, O / l at the end (as O * (1/l)) and lse = ln2 (m + log2 l).
// Any sequence length: TMA reads rows and keys past seqlen as zeros, causality removes keys past a row's own, and
// rows past seqlen are not stored (masks_tail in the manifest).
//
// Compile-time configuration (set by asmgen/sm90a/__init__.py):
//   ZYFA_KERNEL    kernel symbol          ZYFA_D_QK, ZYFA_D_V   head dims (multiples of 64; D_V = 128)
//   ZYFA_TAU       rescale threshold      ZYFA_STAGES           K/V ring depth
//   ZYFA_Q_STAGES  Q buffers: 1 (the next query tile's Q loads once both consumers have issued this tile's last
//                  QK^T) or 2 (it loads while this tile's last key tiles run; fits shared memory only at d = 128)
//   ZYFA_DYNAMIC_SHARED_BYTES  dynamic shared memory the launch provides (checked against the layout)
//   ZYFA_OVERLAP   issue QK^T of tile j with P V of tile j-1 and run tile j's softmax under that P V (1), or
//                  finish P V of tile j-1 before QK^T of tile j (0)
//   ZYFA_PINGPONG  the two consumers take turns issuing their GEMMs, so one's softmax hides under the other's MMA
//   ZYFA_FMA_SCALE compute x - m as one FMA (c s - m) instead of the model's rounded product then difference
//   ZYFA_POLY_EXP2_GROUPS  how many of the 16 groups of four scores a thread holds per key tile take their
//                  exponentials from the FMA-pipe polynomial (exp2_poly) instead of ex2 (MUFU), except in a query
//                  tile's first and diagonal key tiles (0 in the shipped kernels: measured slower, docs/sm90a.md)
//   ZYFA_PIN_SOFTMAX  keep the softmax ahead of the P V wait in the SASS (1, the shipped independent kernels), or
//                  leave its place to ptxas (0, the shipped ping-pong kernels). ptxas sees no dependency between
//                  the softmax and `wgmma.wait_group` and sinks the exponentials, row sums and the quad reduction
//                  past the wait, so only the local row maxima overlap P V. With 1, the release of the K slot moves
//                  from just after the S wait to just before the P V wait and its barrier address is made to depend
//                  on the row sums (a select ptxas cannot fold). ptxas keeps that mbarrier arrive (a shared-memory
//                  operation) ahead of the wait, and so the softmax it depends on. Costs 2 instructions (FADD,
//                  select) per tile; see docs/sm90a.md.
//   ZYFA_DESC_ADD  build each wgmma's shared-memory descriptors by adding the step's offset to a tile's base
//                  descriptor (one 32-bit add, smem_desc_advance; the shipped independent kernels) instead of
//                  encoding each from its address (0, the ping-pong kernels: about five integer instructions and an
//                  extra R2UR per wgmma, on the GEMM-issue path that the other consumer waits behind under
//                  ping-pong)
//   ZYFA_DOUBLE_P  two sets of P fragments used in turn (1), or one (0, the shipped kernels): with two, the BF16
//                  packing of tile j's P goes ahead of the P V wait (P V of tile j-1 reads the other set), leaving
//                  only the rescale of O after it; costs 32 registers and a loop unrolled by two. Needs
//                  ZYFA_PIN_SOFTMAX: the pinned barrier address then also depends on the OR of the packed
//                  fragments, otherwise ptxas sinks the packing past the wait again.
//   ZYFA_CROSS_TILE  the last P V of a query tile and the first QK^T of the CTA's next tile are issued together,
//                  the next tile's first softmax runs under that P V and the epilogue after it (1), or each query
//                  tile starts with its QK^T alone and ends with its P V alone (0, the shipped kernels)
//   ZYFA_VOTE_MAX  skip the quad reductions of the row maxima when no lane of the warp has a partial maximum above
//                  m + tau (1: a warp vote instead of two dependent shuffles per row; the row maximum cannot move
//                  then, so the results are bitwise those of 0), or always reduce (0, the shipped kernels)
//   ZYFA_SPECULATE in the steady-state steps, start the exponentials with the current row maxima at once and find
//                  the tile's maxima alongside (1): if a warpgroup-wide vote then finds one that moves (rare after
//                  the first key tiles), S is computed again from Q and K, still in shared memory, and the tile
//                  takes the usual path; otherwise the exponentials were the right ones, so the results are bitwise
//                  those of 0 (the shipped kernels: maxima, then exponentials). K is still there: the producer
//                  refills a K slot only after the V load before it, which waits for this step's V release.
//                  Needs ZYFA_PIN_SOFTMAX (unpinned, ptxas would sink the softmax past the P V wait anyway).
//   ZYFA_LEAVE_OUT for measurement only (wrong results): 0 the whole kernel (the shipped kernels); 1 without the
//                  exponentials: p = m + tau - c s, one FMA like x - m and >= 0 as pinned_address needs, so the
//                  softmax's other instructions stay and MUFU is idle; 2 without the softmax: P = bf16(S), no row
//                  maxima, exponentials, sums or rescale, the GEMMs, loads and synchronisation alone
//   ZYFA_WAIT_HINT which mbarrier waits sleep until a barrier changes instead of polling (mbar_wait): none (0, the
//                  shipped kernels), the producer's (1: it waits most of the time), or every wait (2); measured
//                  neutral

#include "ptx.cuh"
#include "tile.cuh"

#include <math_constants.h>

#include <type_traits>

namespace zyfa {

constexpr int kTileM = 128;           // query rows per job tile (two consumer warpgroups of 64)
constexpr int kTileN = 128;           // keys per tile
constexpr int kRowsPerConsumer = 64;  // wgmma M
constexpr int kBoxCols = 64;          // BF16 columns per 128-byte swizzled row: TMA box width and wgmma atom
constexpr int kBoxBytes = 128 * kBoxCols * 2;  // one 128-row box
constexpr int kAtomRowBytes = 128;
constexpr int kAtomBytes = 8 * kAtomRowBytes;  // 8 rows: the swizzle pattern's period
constexpr int kMmaK = 16;                      // wgmma K for BF16
constexpr int kThreadsPerWarpgroup = 128;
constexpr int kConsumerWarps = 8;
constexpr int kThreads = 3 * kThreadsPerWarpgroup;
constexpr uint32_t kProducerRegs = 24;
constexpr uint32_t kConsumerRegs = 240;
constexpr uint32_t kPingBarrier = 1;  // named barriers 1 and 2: one per consumer warpgroup
constexpr uint32_t kVoteBarrier = 3;  // named barriers 3 and 4: a consumer warpgroup's vote (ZYFA_SPECULATE)
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kTau = ZYFA_TAU;  // rescale threshold of the lazy row maximum, base-2 units
constexpr int kPolyExp2Groups = ZYFA_POLY_EXP2_GROUPS;
constexpr bool kPinSoftmax = ZYFA_PIN_SOFTMAX != 0;
constexpr bool kProducerSleeps = ZYFA_WAIT_HINT >= 1;
constexpr bool kConsumersSleep = ZYFA_WAIT_HINT >= 2;
constexpr bool kDoubleP = ZYFA_DOUBLE_P != 0;
constexpr bool kDescAdd = ZYFA_DESC_ADD != 0;
constexpr bool kCrossTile = ZYFA_CROSS_TILE != 0;
constexpr int kQStages = ZYFA_Q_STAGES;
constexpr int kLeaveOut = ZYFA_LEAVE_OUT;
constexpr bool kVoteMax = ZYFA_VOTE_MAX != 0;
constexpr bool kSpeculate = ZYFA_SPECULATE != 0;

template <int D_QK, int D_V, int STAGES>
struct SharedLayout {
  static constexpr int kQBoxes = D_QK / kBoxCols;
  static constexpr int kVBoxes = D_V / kBoxCols;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQStages * kQBoxes * kBoxBytes;
  static constexpr int kV = kK + STAGES * kQBoxes * kBoxBytes;
  static constexpr int kBarriers = kV + STAGES * kVBoxes * kBoxBytes;
  // per Q slot q_full, q_empty, then per K/V slot k_full, v_full, k_empty, v_empty
  static constexpr int kNumBarriers = 2 * kQStages + 4 * STAGES;
  static constexpr int kBytes = kBarriers + kNumBarriers * 8;
  static constexpr int kQBytes = kQBoxes * kBoxBytes;
  static constexpr int kKBytes = kQBoxes * kBoxBytes;
  static constexpr int kVBytes = kVBoxes * kBoxBytes;
};

struct Barriers {
  uint32_t base;
  static constexpr int kRing = 16 * kQStages;  // the K/V ring's barriers follow the Q slots' pairs
  __device__ uint32_t q_full(int s) const { return base + 16 * s; }
  __device__ uint32_t q_empty(int s) const { return base + 8 + 16 * s; }
  __device__ uint32_t k_full(int s) const { return base + kRing + 32 * s; }
  __device__ uint32_t v_full(int s) const { return base + kRing + 8 + 32 * s; }
  // K and V of a slot are released separately: K once QK^T has read it, V once P V has, so the next K load
  // starts a whole tile earlier than if the slot waited for both.
  __device__ uint32_t k_empty(int s) const { return base + kRing + 16 + 32 * s; }
  __device__ uint32_t v_empty(int s) const { return base + kRing + 24 + 32 * s; }
};

struct Params {
  uint16_t* out;  // BF16 bits
  float* lse;
  const int* jobs;
  int num_jobs;
  int seqlen;
  int heads;
  int heads_k;
  float scale_log2;  // softmax_scale * log2(e), rounded once to FP32 (the model's c)
  long long out_stride_b;  // elements
  long long out_stride_s;
  long long out_stride_h;
};

// ---- producer -----------------------------------------------------------------------------------------------------

template <int D_QK, int D_V, int STAGES>
__device__ void produce(const TensorMap* tq, const TensorMap* tk, const TensorMap* tv, uint8_t* smem,
                        const Barriers& bars, const Params& p) {
  using L = SharedLayout<D_QK, D_V, STAGES>;
  const uint32_t base = smem_u32(smem);
  const int group = p.heads / p.heads_k;
  RingPos<STAGES> ring;
  RingPos<kQStages> q;
  for (int index = blockIdx.x; index < p.num_jobs; index += gridDim.x) {
    const Job job = load_job(p.jobs, index);
    const int head_k = job.head / group;
    for (int i = 0; i < job.num_tiles(); ++i) {
      const int tile = job.tile(i);
      mbar_wait<kProducerSleeps>(bars.q_empty(q.slot), q.parity ^ 1);
      mbar_arrive_expect_tx(bars.q_full(q.slot), L::kQBytes);
#pragma unroll
      for (int b = 0; b < L::kQBoxes; ++b)
        tma_load_4d(base + L::kQ + (q.slot * L::kQBoxes + b) * kBoxBytes, tq, bars.q_full(q.slot), b * kBoxCols,
                    tile * kTileM, job.head, job.batch);
      q.advance();
      for (int kt = 0; kt <= tile; ++kt) {
        mbar_wait<kProducerSleeps>(bars.k_empty(ring.slot), ring.parity ^ 1);
        mbar_arrive_expect_tx(bars.k_full(ring.slot), L::kKBytes);
#pragma unroll
        for (int b = 0; b < L::kQBoxes; ++b)
          tma_load_4d(base + L::kK + (ring.slot * L::kQBoxes + b) * kBoxBytes, tk, bars.k_full(ring.slot),
                      b * kBoxCols, kt * kTileN, head_k, job.batch);
        mbar_wait<kProducerSleeps>(bars.v_empty(ring.slot), ring.parity ^ 1);
        mbar_arrive_expect_tx(bars.v_full(ring.slot), L::kVBytes);
#pragma unroll
        for (int b = 0; b < L::kVBoxes; ++b)
          tma_load_4d(base + L::kV + (ring.slot * L::kVBoxes + b) * kBoxBytes, tv, bars.v_full(ring.slot),
                      b * kBoxCols, kt * kTileN, head_k, job.batch);
        ring.advance();
      }
    }
  }
}

// ---- consumer -----------------------------------------------------------------------------------------------------

template <bool PINGPONG>
struct PingPong {
  uint32_t mine, other;
  // Before issuing GEMMs: wait until the partner warpgroup has issued its own.
  __device__ void acquire() const {
    if constexpr (PINGPONG) named_barrier_sync(mine, 2 * kThreadsPerWarpgroup);
  }
  // After issuing: let the partner issue next.
  __device__ void release() const {
    if constexpr (PINGPONG) named_barrier_arrive(other, 2 * kThreadsPerWarpgroup);
  }
};

// Row state of the online softmax for the thread's two rows.
struct RowState {
  float m[2];  // reference maximum, base-2 scaled units; -inf while unset
  float l[2];  // this thread's partial row sum (the quad adds its partials at the end)
};
// A query tile's row state before its first key tile.
__device__ __forceinline__ RowState no_rows() { return {{-CUDART_INF_F, -CUDART_INF_F}, {0.0f, 0.0f}}; }

constexpr int kScoreGroups = 16;  // a thread's 64 scores of a tile as groups of four (8 key columns, both rows)

// Whether score group g takes the polynomial exponential: POLY_GROUPS of the 16, spread evenly over the tile so
// the FMA-pipe and MUFU work interleave.
template <int POLY_GROUPS>
__device__ __forceinline__ constexpr bool poly_group(int g) {
  return (g * POLY_GROUPS) % kScoreGroups < POLY_GROUPS;
}

// Scores of one key tile -> probabilities in place; returns per-row factors for O (1 where m did not move).
// POLY_GROUPS > 0 only where no score is -inf (off the diagonal tile): exp2_poly clamps its input.
template <int POLY_GROUPS>
__device__ __forceinline__ void softmax_tile(float (&s)[64], RowState& st, float scale_log2, float tau,
                                             float (&factor)[2]) {
  if constexpr (kLeaveOut == 2) {
    factor[0] = factor[1] = 1.0f;
    return;
  }
  float local[2];
  partial_maxima(s, local);
  factor[0] = factor[1] = 1.0f;
  // c > 0, so the maximum of the scaled scores is the scaled maximum, with the same rounding, and a row's maximum
  // exceeds m + tau exactly when one of its quad's partial maxima does (ZYFA_VOTE_MAX).
  if (!kVoteMax || __any_sync(0xffffffff, local[0] * scale_log2 > st.m[0] + tau ||
                                              local[1] * scale_log2 > st.m[1] + tau)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float mt = quad_max(local[h]) * scale_log2;
      if (mt > st.m[h] + tau) {
        factor[h] = ex2(st.m[h] - mt);
        st.m[h] = mt;
        st.l[h] *= factor[h];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 64; ++r) {
    const int h = acc_half(r);
    if constexpr (kLeaveOut == 1) {
      s[r] = fmaf(s[r], -scale_log2, st.m[h] + tau);  // timing only: >= 0 with no exponential (ZYFA_LEAVE_OUT)
    } else {
#if ZYFA_FMA_SCALE
      const float x = fmaf(s[r], scale_log2, -st.m[h]);  // one rounding fewer than the model: a last-bit difference
#else
      const float x = __fmul_rn(s[r], scale_log2) - st.m[h];  // x = c s rounded, then x - m: the model's roundings
#endif
      s[r] = poly_group<POLY_GROUPS>(r / 4) ? exp2_poly(x) : ex2(x);
    }
    st.l[h] += s[r];
  }
}

// ZYFA_SPECULATE: the exponentials of a key tile with the current row maxima, and whether the tile moves any row
// maximum of the warpgroup (the vote waits for its four warps). If not, the probabilities and row sums are
// softmax_tile's, bit for bit (same FFMA, ex2 and summation order; the maxima stay); if so, `s` and `st` are left
// unusable and the caller computes S again and runs softmax_tile.
__device__ __forceinline__ bool softmax_tile_speculative(float (&s)[64], RowState& st, float scale_log2, float tau,
                                                         uint32_t vote_barrier) {
  float local[2];
  partial_maxima(s, local);  // of the scores, before the loop below overwrites them (ptxas interleaves the two)
#pragma unroll
  for (int r = 0; r < 64; ++r) {
    const int h = acc_half(r);
    s[r] = ex2(fmaf(s[r], scale_log2, -st.m[h]));
    st.l[h] += s[r];
  }
  // as in softmax_tile: a partial maximum above m + tau moves its row
  const bool moves = local[0] * scale_log2 > st.m[0] + tau || local[1] * scale_log2 > st.m[1] + tau;
  return named_barrier_any(vote_barrier, kThreadsPerWarpgroup, moves);
}

// `bar`, made to depend on every probability of the tile for ptxas (ZYFA_PIN_SOFTMAX): the row sums are sums of
// values >= +0, or a NaN, which FP32 arithmetic returns as the canonical 0x7FFFFFFF, so their sum never has the
// sign bit set and the select always yields `bar`; ptxas cannot prove that and keeps the data dependency.
// Precondition: p >= 0. A negative row sum would arrive on the next barrier and hang the CTA.
// With `packed` (ZYFA_DOUBLE_P) the address depends on every P fragment too (their OR: about 11 three-input LOP3):
// BF16 probabilities have no sign bit either (cvt returns a NaN as the canonical 0x7FFF).
__device__ __forceinline__ uint32_t pinned_address(uint32_t bar, const RowState& st, uint32_t packed = 0) {
  constexpr uint32_t kUnreachableOffset = 8;  // the next barrier: never taken
  const int bits = __float_as_int(st.l[0] + st.l[1]) | static_cast<int>(packed);
  return bits < 0 ? bar + kUnreachableOffset : bar;
}

// OR of all P fragments: a value that depends on each of them (for pinned_address).
__device__ __forceinline__ uint32_t fragments_or(const uint32_t (&pf)[32]) {
  uint32_t acc[4] = {pf[0], pf[1], pf[2], pf[3]};  // four short chains
#pragma unroll
  for (int i = 4; i < 32; ++i) acc[i % 4] |= pf[i];
  return (acc[0] | acc[1]) | (acc[2] | acc[3]);
}

// P (FP32 accumulator layout) -> BF16 A fragments: the accumulator of key columns 16k..16k+15 is exactly the
// register A fragment of the k-th 16-key step.
__device__ __forceinline__ void pack_p(const float (&s)[64], uint32_t (&pf)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) pf[i] = pack_bf16x2(s[2 * i], s[2 * i + 1]);
}

__device__ __forceinline__ void rescale_o(float (&o)[64], const float (&factor)[2]) {
  if (factor[0] != 1.0f || factor[1] != 1.0f) {
#pragma unroll
    for (int r = 0; r < 64; ++r) o[r] *= factor[acc_half(r)];
  }
}

template <int D_QK>
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t q_rows, uint32_t k_tile) {
  const uint64_t q_desc = smem_desc_sw128(q_rows, 16, kAtomBytes);  // ZYFA_DESC_ADD: bases, advanced per step
  const uint64_t k_desc = smem_desc_sw128(k_tile, 16, kAtomBytes);
#pragma unroll
  for (int k = 0; k < D_QK / kMmaK; ++k) {
    // K step k lies in box k/4, at byte 32*(k%4) of each swizzled 128-byte row.
    const uint32_t offset = (k / 4) * kBoxBytes + (k % 4) * (kMmaK * 2);
    if constexpr (kDescAdd) {
      wgmma_m64n128k16_ss(s, smem_desc_advance(q_desc, offset), smem_desc_advance(k_desc, offset), k > 0);
    } else {
      wgmma_m64n128k16_ss(s, smem_desc_sw128(q_rows + offset, 16, kAtomBytes),
                          smem_desc_sw128(k_tile + offset, 16, kAtomBytes), k > 0);
    }
  }
}

__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pf)[32], uint32_t v_tile) {
  const uint64_t v_desc = smem_desc_sw128(v_tile, kBoxBytes, kAtomBytes);  // ZYFA_DESC_ADD: advanced per step
#pragma unroll
  for (int k = 0; k < kTileN / kMmaK; ++k) {
    const uint32_t a[4] = {pf[4 * k], pf[4 * k + 1], pf[4 * k + 2], pf[4 * k + 3]};
    // 16 keys = 16 rows of 128 bytes; the next 64 columns of V are the next box.
    if constexpr (kDescAdd) {
      wgmma_m64n128k16_rs_bt(o, a, smem_desc_advance(v_desc, k * kMmaK * kAtomRowBytes));
    } else {
      wgmma_m64n128k16_rs_bt(o, a, smem_desc_sw128(v_tile + k * kMmaK * kAtomRowBytes, kBoxBytes, kAtomBytes));
    }
  }
}

// ZYFA_CROSS_TILE: the query tile this CTA computes after tile `i` of `job` (at row `index` of the table), or -1.
__device__ __forceinline__ int next_tile(const Params& p, const Job& job, int index, int i) {
  if (i + 1 < job.num_tiles()) return job.tile(i + 1);
  for (int next = index + gridDim.x; next < p.num_jobs; next += gridDim.x) {
    const Job after = load_job(p.jobs, next);
    if (after.num_tiles() > 0) return after.tile(0);
  }
  return -1;
}

template <int D_QK, int D_V, int STAGES, bool OVERLAP, bool PINGPONG>
__device__ void consume(uint8_t* smem, const Barriers& bars, const Params& p, int consumer) {
  using L = SharedLayout<D_QK, D_V, STAGES>;
  const uint32_t base = smem_u32(smem);
  const int thread = threadIdx.x % kThreadsPerWarpgroup;
  const int warp = thread / 32;
  const int lane = threadIdx.x % 32;
  const float scale_log2 = p.scale_log2;
  const uint32_t q_base = base + L::kQ + consumer * kRowsPerConsumer * kAtomRowBytes;  // this consumer's rows
  const PingPong<PINGPONG> turn{kPingBarrier + consumer, kPingBarrier + (consumer ^ 1)};
  if (consumer == 1) turn.release();  // the first consumer goes first

  RingPos<STAGES> ring;
  RingPos<STAGES> prev;  // the ring slot whose V the next P V reads
  RowState st;
  bool started = false;  // ZYFA_CROSS_TILE: the previous tile already ran this tile's first key tile
  RingPos<kQStages> q;  // the Q slot of the next tile to start
  int q_slot = 0;  // the current tile's Q slot
  uint32_t q_rows = q_base;  // this consumer's rows of it
  float s[64], o[64];
  uint32_t pf[32];  // P fragments read by the next P V
  uint32_t pf_b[32];  // ZYFA_DOUBLE_P: the second set, written while P V reads the first (unused otherwise)

  auto k_tile = [&](const RingPos<STAGES>& at) { return base + L::kK + at.slot * L::kKBytes; };
  auto v_tile = [&](const RingPos<STAGES>& at) { return base + L::kV + at.slot * L::kVBytes; };
  auto release = [&](uint32_t bar) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };
  // A query tile's Q: wait for its slot to land before the tile's first QK^T; free it after the last.
  auto acquire_q = [&]() {
    q_slot = q.slot;
    mbar_wait<kConsumersSleep>(bars.q_full(q_slot), q.parity);
    q.advance();
    if constexpr (kQStages > 1) q_rows = q_base + q_slot * L::kQBytes;  // one buffer: q_rows stays q_base
  };
  auto release_q = [&]() { release(bars.q_empty(q_slot)); };
  // Epilogue of a query tile: O / l to BF16, lse = ln2 (m + log2 l), with log2 l = -log2(1/l).
  auto store_tile = [&](const Job& job, int tile, const RowState& rows) {
    const int row = tile * kTileM + consumer * kRowsPerConsumer + 16 * warp + lane / 4;
    const int head_row = job.batch * p.heads + job.head;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float inv_l = 1.0f / quad_sum(rows.l[h]);  // one division per row; O * (1/l) is within an FP32 ulp
      const int q = row + 8 * h;
      if (q >= p.seqlen) continue;  // the last tile's rows past seqlen (TMA read them as zeros) are not stored
      uint16_t* out = p.out + job.batch * p.out_stride_b + q * p.out_stride_s + job.head * p.out_stride_h;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int r = 4 * i + 2 * h;
        *reinterpret_cast<uint32_t*>(out + acc_col(r, lane)) = pack_bf16x2(o[r] * inv_l, o[r + 1] * inv_l);
      }
      if (lane % 4 == 0)
        p.lse[static_cast<long long>(head_row) * p.seqlen + q] = kLn2 * (rows.m[h] - log2f(inv_l));
    }
  };

  for (int index = blockIdx.x; index < p.num_jobs; index += gridDim.x) {
    const Job job = load_job(p.jobs, index);
    for (int i = 0; i < job.num_tiles(); ++i) {
      const int tile = job.tile(i);
      // Row of this thread's first row inside the diagonal key tile.
      const int diag_row = consumer * kRowsPerConsumer + 16 * warp + lane / 4;
      float factor[2];
      if (!(kCrossTile && started)) {  // the tile's first key tile, unless the previous tile ran it (cross-tile)
        st = no_rows();
#pragma unroll
        for (int r = 0; r < 64; ++r) o[r] = 0.0f;

        acquire_q();

        // Key tile 0: QK^T alone (no P V before it).
        mbar_wait<kConsumersSleep>(bars.k_full(ring.slot), ring.parity);
        turn.acquire();
        wgmma_fence();
        issue_qk<D_QK>(s, q_rows, k_tile(ring));
        wgmma_commit();
        turn.release();
        wgmma_wait<0>();
        fence_regs(s);
        release(bars.k_empty(ring.slot));
        if (tile == 0) {
          release_q();
          mask_diagonal(s, diag_row, lane);
        }
        softmax_tile<0>(s, st, scale_log2, kTau, factor);  // ex2 only: this tile may be the diagonal one
        pack_p(s, pf);

        prev = ring;
        ring.advance();
      }
      started = false;
      // One key tile after the first: S of this tile and P V of the previous one in flight together.
      // `cur`: fragments of the previous tile, read by its P V; `next`: where this tile's P goes (the same array
      // unless ZYFA_DOUBLE_P).
      auto step = [&](auto diagonal, uint32_t(&cur)[32], uint32_t(&next)[32]) {
        mbar_wait<kConsumersSleep>(bars.k_full(ring.slot), ring.parity);
        mbar_wait<kConsumersSleep>(bars.v_full(prev.slot), prev.parity);
        turn.acquire();
        wgmma_fence();
        if constexpr (OVERLAP) {
          issue_qk<D_QK>(s, q_rows, k_tile(ring));
          wgmma_commit();
          issue_pv(o, cur, v_tile(prev));
          wgmma_commit();
          turn.release();
          wgmma_wait<1>();  // S of this tile is ready; P V of the previous one may still run
        } else {
          issue_pv(o, cur, v_tile(prev));
          wgmma_commit();
          issue_qk<D_QK>(s, q_rows, k_tile(ring));
          wgmma_commit();
          turn.release();
          wgmma_wait<0>();
        }
        fence_regs(s);
        if constexpr (!kPinSoftmax) release(bars.k_empty(ring.slot));
        if constexpr (decltype(diagonal)::value) {
          release_q();
          mask_diagonal(s, diag_row, lane);
          softmax_tile<0>(s, st, scale_log2, kTau, factor);
        } else if constexpr (kSpeculate) {
          const RowState before = st;
          factor[0] = factor[1] = 1.0f;
          if (softmax_tile_speculative(s, st, scale_log2, kTau, kVoteBarrier + consumer)) {
            // A row maximum moves: S again (this also waits for P V of the previous tile), then the usual path.
            st = before;
            wgmma_fence();
            issue_qk<D_QK>(s, q_rows, k_tile(ring));
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(s);
            softmax_tile<0>(s, st, scale_log2, kTau, factor);
          }
        } else {
          softmax_tile<kPolyExp2Groups>(s, st, scale_log2, kTau, factor);
        }
        fence_regs(s);  // the exponentials are done before the wait below, i.e. under the running P V
        if constexpr (kDoubleP) {
          pack_p(s, next);  // P V of the previous tile reads `cur`, not `next`
          release(pinned_address(bars.k_empty(ring.slot), st, fragments_or(next)));
        } else if constexpr (kPinSoftmax) {
          release(pinned_address(bars.k_empty(ring.slot), st));
        }
        wgmma_wait<0>();
        fence_regs(o);
        release(bars.v_empty(prev.slot));
        rescale_o(o, factor);
        if constexpr (!kDoubleP) pack_p(s, next);
        prev = ring;
        ring.advance();
      };
      // P V of the last key tile, from the fragments `last`.
      auto last_pv = [&](const uint32_t(&last)[32]) {
        mbar_wait<kConsumersSleep>(bars.v_full(prev.slot), prev.parity);
        turn.acquire();
        wgmma_fence();
        issue_pv(o, last, v_tile(prev));
        wgmma_commit();
        turn.release();
        wgmma_wait<0>();
        fence_regs(o);
        release(bars.v_empty(prev.slot));
      };
      if constexpr (kDoubleP) {
        // Steps alternate the two sets, so the loop is unrolled by two and the tail picks the set by parity.
        int kt = 1;
        for (; kt + 1 < tile; kt += 2) {
          step(std::false_type{}, pf, pf_b);
          step(std::false_type{}, pf_b, pf);
        }
        if (kt < tile) {  // one off-diagonal tile left: it writes pf_b, the diagonal pf
          step(std::false_type{}, pf, pf_b);
          step(std::true_type{}, pf_b, pf);
          last_pv(pf);
        } else if (tile > 0) {
          step(std::true_type{}, pf, pf_b);
          last_pv(pf_b);
        } else {
          last_pv(pf);
        }
      } else {
        for (int kt = 1; kt < tile; ++kt) step(std::false_type{}, pf, pf);
        if (tile > 0) step(std::true_type{}, pf, pf);  // only the diagonal tile needs the causal mask
        if constexpr (kCrossTile) {
          const int next = next_tile(p, job, index, i);
          if (next >= 0) {
            // This tile's last P V and the next tile's first QK^T in flight together; the next tile's first
            // softmax runs under the P V, this tile's epilogue after it.
            acquire_q();
            mbar_wait<kConsumersSleep>(bars.k_full(ring.slot), ring.parity);
            mbar_wait<kConsumersSleep>(bars.v_full(prev.slot), prev.parity);
            turn.acquire();
            wgmma_fence();
            issue_qk<D_QK>(s, q_rows, k_tile(ring));
            wgmma_commit();
            issue_pv(o, pf, v_tile(prev));
            wgmma_commit();
            turn.release();
            wgmma_wait<1>();
            fence_regs(s);
            const RowState done = st;
            st = no_rows();
            if (next == 0) {
              release_q();
              mask_diagonal(s, diag_row, lane);
            }
            softmax_tile<0>(s, st, scale_log2, kTau, factor);  // its factor is not applied: O starts at 0
            fence_regs(s);
            release(pinned_address(bars.k_empty(ring.slot), st));  // the softmax stays under P V (both schedules)
            wgmma_wait<0>();
            fence_regs(o);
            release(bars.v_empty(prev.slot));
            store_tile(job, tile, done);
#pragma unroll
            for (int r = 0; r < 64; ++r) o[r] = 0.0f;
            pack_p(s, pf);
            prev = ring;
            ring.advance();
            started = true;
            continue;
          }
        }
        // last_pv(pf), written out as the shipped kernels have it (a lambda call changes their bytes)
        mbar_wait<kConsumersSleep>(bars.v_full(prev.slot), prev.parity);
        turn.acquire();
        wgmma_fence();
        issue_pv(o, pf, v_tile(prev));
        wgmma_commit();
        turn.release();
        wgmma_wait<0>();
        fence_regs(o);
        release(bars.v_empty(prev.slot));
      }

      store_tile(job, tile, st);
    }
  }
}

template <int D_QK, int D_V, int STAGES, bool OVERLAP, bool PINGPONG>
__device__ void attention_fwd(const TensorMap* tq, const TensorMap* tk, const TensorMap* tv, const Params& p) {
  using L = SharedLayout<D_QK, D_V, STAGES>;
  extern __shared__ uint8_t smem_raw[];
  // The 128-byte swizzle repeats every 1024 bytes; TMA and wgmma both assume boxes start on that boundary.
  uint8_t* smem = smem_raw + ((kAtomBytes - smem_u32(smem_raw) % kAtomBytes) % kAtomBytes);
  const Barriers bars{smem_u32(smem) + L::kBarriers};
  const int warpgroup = threadIdx.x / kThreadsPerWarpgroup;

  if (threadIdx.x == 0) {
    tma_prefetch_map(tq);
    tma_prefetch_map(tk);
    tma_prefetch_map(tv);
    for (int s = 0; s < kQStages; ++s) {
      mbar_init(bars.q_full(s), 1);
      mbar_init(bars.q_empty(s), kConsumerWarps);
    }
    for (int s = 0; s < STAGES; ++s) {
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
    if (threadIdx.x == 0) produce<D_QK, D_V, STAGES>(tq, tk, tv, smem, bars, p);
  } else {
    regs_claim<kConsumerRegs>();
    consume<D_QK, D_V, STAGES, OVERLAP, PINGPONG>(smem, bars, p, warpgroup - 1);
  }
}

}  // namespace zyfa

// The launch provides ZYFA_DYNAMIC_SHARED_BYTES: the layout plus slack to align it.
static_assert(zyfa::SharedLayout<ZYFA_D_QK, ZYFA_D_V, ZYFA_STAGES>::kBytes + zyfa::kAtomBytes ==
                  ZYFA_DYNAMIC_SHARED_BYTES,
              "shared memory layout and manifest disagree");
static_assert(ZYFA_D_V == zyfa::kTileN, "the PV product is one 64x128 accumulator: d_v must be 128");
static_assert(ZYFA_D_QK % zyfa::kBoxCols == 0, "d_qk must be a multiple of 64");
static_assert(ZYFA_Q_STAGES == 1 || ZYFA_Q_STAGES == 2, "one or two Q buffers");
static_assert(ZYFA_VOTE_MAX == 0 || ZYFA_VOTE_MAX == 1, "ZYFA_VOTE_MAX is 0 or 1");
static_assert(!ZYFA_SPECULATE || (ZYFA_PIN_SOFTMAX && ZYFA_OVERLAP && !ZYFA_DOUBLE_P && !ZYFA_LEAVE_OUT &&
                                  ZYFA_POLY_EXP2_GROUPS == 0 && ZYFA_FMA_SCALE),
              "ZYFA_SPECULATE needs the pinned, overlapped kernel with ex2 and the FMA x - m (the speculative "
              "exponentials are softmax_tile's, held under P V)");
static_assert(ZYFA_LEAVE_OUT >= 0 && ZYFA_LEAVE_OUT <= 2, "ZYFA_LEAVE_OUT: 0 nothing, 1 the exponentials, 2 the softmax");
static_assert(!(ZYFA_CROSS_TILE && ZYFA_DOUBLE_P), "ZYFA_CROSS_TILE is written for one set of P fragments");
static_assert(!ZYFA_DOUBLE_P || (ZYFA_OVERLAP && ZYFA_PIN_SOFTMAX),
              "ZYFA_DOUBLE_P needs the overlapped schedule and ZYFA_PIN_SOFTMAX (without it ptxas sinks the packing "
              "past the wait and spills)");
static_assert(ZYFA_POLY_EXP2_GROUPS >= 0 && ZYFA_POLY_EXP2_GROUPS <= zyfa::kScoreGroups,
              "ZYFA_POLY_EXP2_GROUPS counts groups of four scores out of 16");

extern "C" __global__ void __launch_bounds__(zyfa::kThreads, 1)
    ZYFA_KERNEL(const __grid_constant__ zyfa::TensorMap q, const __grid_constant__ zyfa::TensorMap k,
                const __grid_constant__ zyfa::TensorMap v, uint16_t* out, float* lse, const int* jobs,
                int num_jobs, int seqlen, int heads, int heads_k, float scale_log2, long long out_stride_b,
                long long out_stride_s, long long out_stride_h) {
  const zyfa::Params p{out, lse, jobs, num_jobs, seqlen, heads, heads_k, scale_log2,
                       out_stride_b, out_stride_s, out_stride_h};
  zyfa::attention_fwd<ZYFA_D_QK, ZYFA_D_V, ZYFA_STAGES, ZYFA_OVERLAP != 0, ZYFA_PINGPONG != 0>(&q, &k, &v, p);
}
