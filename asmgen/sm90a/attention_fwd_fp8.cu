// Causal forward attention, FP8 e4m3 in, BF16 out (+ FP32 log-sum-exp), for Hopper (sm_90a).
//
// The same CTA shape and tile walk as the BF16 kernel (attention_fwd.cu): one CTA per SM walks the job table, a
// producer warpgroup loads Q, K and V^T with TMA, two consumer warpgroups of 64 query rows run wgmma and the softmax.
// What FP8 changes:
//   - both GEMMs are e4m3 wgmma (k = 32), whose shared-memory operands are K-major only: V arrives transposed (V^T,
//     keys contiguous), written by the host's pre-pass, with the keys of every 16 permuted so that the S
//     accumulator's registers are the P operand's bytes as they stand (see pack_p);
//   - the numerics are zyfa.numerics with p_shift 8, rowsum "rounded", no per-block scaling, and p_mode "exact"
//     (P8 = e4m3(2^(x - m + 8)), rounded to nearest even) or "lean" (P8 = the e4m3 value whose bit pattern is
//     max(0, rne(8 (x - m) + 120)): two FMA-pipe instructions per score, no MUFU); the row sum l adds exactly the
//     rounded P that multiplies V;
//   - two-level accumulation: each key tile's P V lands in a fresh wgmma accumulator (Hopper's FP8 accumulator keeps
//     about 13 mantissa bits) that is added into FP32 registers O and l;
//   - descales are read on the device per (batch, kv head): c = scale log2(e) q_descale k_descale scales the scores,
//     v_descale the output; lse = ln2 (m - 8 + log2 l).
// Rows and keys past `seqlen` need no masking of their own: TMA reads them as zeros, causality removes keys past a
// row's own, and rows past seqlen are not stored. So any sequence length runs without padding.
//
// Each consumer waits for both GEMMs of a step before its softmax: the other consumer's GEMMs run under it.
//
// Compile-time configuration (asmgen/sm90a/__init__.py): ZYFA_KERNEL (symbol), ZYFA_D_QK, ZYFA_D_V, ZYFA_STAGES,
// ZYFA_DYNAMIC_SHARED_BYTES, ZYFA_PINGPONG (the schedule), ZYFA_ROWSUM (how l is summed), ZYFA_LEAN (the p_mode:
// 1 lean, 0 exact).

#include "ptx.cuh"
#include "tile.cuh"

#include <math_constants.h>

#include <type_traits>

namespace zyfa {
namespace fp8 {

constexpr int kTileM = 128;
constexpr int kTileN = 128;
constexpr int kRowsPerConsumer = 64;
constexpr int kBoxCols = 128;              // e4m3 columns per 128-byte swizzled row: TMA box width, wgmma atom row
constexpr int kBoxBytes = 128 * kBoxCols;  // one box of 128 rows
constexpr int kAtomRowBytes = 128;
constexpr int kAtomBytes = 8 * kAtomRowBytes;
constexpr int kMmaK = 32;  // wgmma K for 8-bit operands
constexpr int kOnesRows = 8;  // rows of ones after each V^T tile: the P V product's N = d_v + 8
constexpr int kOnesBytes = kOnesRows * kAtomRowBytes;
constexpr uint32_t kE4m3OnesWord = 0x38383838u;  // four e4m3 1.0
// How l sums a tile's probabilities: 0 the ones columns of the P V product (the rounded P, in the tensor core's
// truncating accumulator), 1 the unrounded FP32 p (FA3's way), 2 the rounded P from the packed fragments, in f16x2
// (exact conversion, rounded additions) then FP32.
constexpr int kRowsum = ZYFA_ROWSUM;
constexpr bool kOnes = kRowsum == 0;
constexpr int kAccRegs = kOnes ? 68 : 64;  // a 64x136 (64x128 without the ones) FP32 accumulator per thread
constexpr int kThreadsPerWarpgroup = 128;
constexpr int kConsumerWarps = 8;
constexpr int kThreads = 3 * kThreadsPerWarpgroup;
constexpr uint32_t kProducerRegs = 24;
constexpr uint32_t kConsumerRegs = 240;
constexpr uint32_t kPingBarrier = 1;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kTau = 0.125f;   // rescale threshold (the contract's FP8 value)
constexpr float kPShift = 8.0f;  // P is written 2^8 larger before the e4m3 rounding
// Lean P's code of 2^y is 8 y + 56 (e4m3: 3 mantissa bits, 1.0 is code 56), so 8 (x - m) + 56 + 8 p_shift.
constexpr float kLeanCodeOffset = 56.0f + 8.0f * kPShift;  // 120: the code of the row maximum
// The codes are formed in [0, 1] as (8 (x - m) + 120) / 128 by a saturating FMA (the clamp at code 0 for free;
// codes stay <= 121 by the P range guard), then an FMA by 128 plus 1.5 * 2^23 rounds them to an integer in the
// low mantissa bits (FMA pipe only: a float->int conversion would take the MUFU pipe, which ex2 needs).
constexpr float kLeanCodeScale = 128.0f;
constexpr float kRoundToInteger = 12582912.0f;  // 1.5 * 2^23: x + this has rne(x) in its low mantissa bits

enum class PMode { kExact, kLean };

template <int D_QK, int D_V, int STAGES>
struct SharedLayout {
  static constexpr int kQBoxes = (D_QK + kBoxCols - 1) / kBoxCols;  // d_qk = 192: the second box half zeros
  static constexpr int kQBytes = kQBoxes * kBoxBytes;
  static constexpr int kKBytes = kQBytes;
  static constexpr int kVBytes = D_V * kAtomRowBytes + (kOnes ? kOnesBytes : 0);  // V^T rows of 128 keys, ones
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + STAGES * kKBytes;
  static constexpr int kBarriers = kV + STAGES * kVBytes;
  static constexpr int kNumBarriers = 2 + 4 * STAGES;
  static constexpr int kBytes = kBarriers + kNumBarriers * 8;
};

struct Barriers {
  uint32_t base;
  __device__ uint32_t q_full() const { return base; }
  __device__ uint32_t q_empty() const { return base + 8; }
  __device__ uint32_t k_full(int s) const { return base + 16 + 32 * s; }
  __device__ uint32_t v_full(int s) const { return base + 24 + 32 * s; }
  __device__ uint32_t k_empty(int s) const { return base + 32 + 32 * s; }
  __device__ uint32_t v_empty(int s) const { return base + 40 + 32 * s; }
};

struct Params {
  uint16_t* out;
  float* lse;
  const int* jobs;
  const float* q_descale;  // per (batch, kv head): descale[batch * stride_b + head_k * stride_h]
  const float* k_descale;
  const float* v_descale;
  int q_descale_stride_b, q_descale_stride_h;  // elements; (0, 0) for one value, a broadcast view any others
  int k_descale_stride_b, k_descale_stride_h;
  int v_descale_stride_b, v_descale_stride_h;
  int num_jobs;
  int seqlen;
  int heads;
  int heads_k;
  float scale_log2;  // softmax_scale * log2(e), rounded once to FP32
  long long out_stride_b;
  long long out_stride_s;
  long long out_stride_h;
};

// ---- producer -----------------------------------------------------------------------------------------------------

template <int D_QK, int D_V, int STAGES>
__device__ void produce(const TensorMap* tq, const TensorMap* tk, const TensorMap* tvt, uint8_t* smem,
                        const Barriers& bars, const Params& p) {
  using L = SharedLayout<D_QK, D_V, STAGES>;
  const uint32_t base = smem_u32(smem);
  const int group = p.heads / p.heads_k;
  RingPos<STAGES> ring;
  uint32_t q_parity = 0;
  for (int index = blockIdx.x; index < p.num_jobs; index += gridDim.x) {
    const Job job = load_job(p.jobs, index);
    const int head_k = job.head / group;
    for (int i = 0; i < job.num_tiles(); ++i) {
      const int tile = job.tile(i);
      mbar_wait(bars.q_empty(), q_parity ^ 1);
      mbar_arrive_expect_tx(bars.q_full(), L::kQBytes);
#pragma unroll
      for (int b = 0; b < L::kQBoxes; ++b)
        tma_load_4d(base + L::kQ + b * kBoxBytes, tq, bars.q_full(), b * kBoxCols, tile * kTileM, job.head,
                    job.batch);
      q_parity ^= 1;
      for (int kt = 0; kt <= tile; ++kt) {
        mbar_wait(bars.k_empty(ring.slot), ring.parity ^ 1);
        mbar_arrive_expect_tx(bars.k_full(ring.slot), L::kKBytes);
#pragma unroll
        for (int b = 0; b < L::kQBoxes; ++b)
          tma_load_4d(base + L::kK + ring.slot * L::kKBytes + b * kBoxBytes, tk, bars.k_full(ring.slot),
                      b * kBoxCols, kt * kTileN, head_k, job.batch);
        // V^T is (batch, heads_k, d_v, keys): one box of 128 keys by d_v rows; the ones rows after it stay.
        mbar_wait(bars.v_empty(ring.slot), ring.parity ^ 1);
        mbar_arrive_expect_tx(bars.v_full(ring.slot), D_V * kAtomRowBytes);
        tma_load_4d(base + L::kV + ring.slot * L::kVBytes, tvt, bars.v_full(ring.slot), kt * kTileN, 0, head_k,
                    job.batch);
        ring.advance();
      }
    }
  }
}

// ---- consumer -----------------------------------------------------------------------------------------------------

// Ping-pong turns: consumer warpgroup w (1 or 2) waits on named barrier w and lets the other go on barrier 3 - w.
// The ids are computed from the thread index at each use rather than held: two registers fewer through the key
// loop, where the FP8 kernel has none to spare.
template <bool PINGPONG>
struct PingPong {
  __device__ static uint32_t mine() { return kPingBarrier + threadIdx.x / (2 * kThreadsPerWarpgroup); }
  __device__ void acquire() const {
    if constexpr (PINGPONG) named_barrier_sync(mine(), 2 * kThreadsPerWarpgroup);
  }
  __device__ void release() const {
    if constexpr (PINGPONG) named_barrier_arrive(2 * kPingBarrier + 1 - mine(), 2 * kThreadsPerWarpgroup);
  }
};

struct RowState {
  float m[2];  // reference maximum (base-2 units, descales included); -inf while unset
  float l[2];  // row sum of the rounded P (every lane of the quad holds it: the ones columns)
};
__device__ __forceinline__ RowState no_rows() { return {{-CUDART_INF_F, -CUDART_INF_F}, {0.0f, 0.0f}}; }

// The lazy row maximum of one key tile's scores: it moves when the tile's maximum exceeds it by more than tau, and
// factor[h] = 2^(m_old - m_new) is returned for O and l (1 where it did not move). A warp vote skips the quad
// reductions when no partial maximum exceeds m + tau (the row maximum cannot move then: the results are the same).
__device__ __forceinline__ void row_maxima(const float (&s)[64], RowState& st, float c, float (&factor)[2]) {
  float local[2];
  partial_maxima(s, local);
  factor[0] = factor[1] = 1.0f;
  // c > 0: the maximum of the scaled scores is the scaled maximum, with the same rounding
  if (__any_sync(0xffffffff, local[0] * c > st.m[0] + kTau || local[1] * c > st.m[1] + kTau)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float mt = quad_max(local[h]) * c;
      if (mt > st.m[h] + kTau) {
        factor[h] = ex2(st.m[h] - mt);
        st.m[h] = mt;
      }
    }
  }
}

// Exact P: scores -> 2^(x - m + 8) in place (FP32, rounded to e4m3 by pack_p), x - m + 8 as one FMA.
__device__ __forceinline__ void exact_p(float (&s)[64], const RowState& st, float c) {
  const float bias[2] = {kPShift - st.m[0], kPShift - st.m[1]};
#pragma unroll
  for (int r = 0; r < 64; ++r) s[r] = ex2(fmaf(s[r], c, bias[acc_half(r)]));
}

// Lean P: scores -> e4m3 codes max(0, rne(8 (x - m) + 120)), gathered four to a register in pack_p's order.
__device__ __forceinline__ void lean_p(const float (&s)[64], const RowState& st, float c, uint32_t (&pf)[16]) {
  const float scale = c * (8.0f / kLeanCodeScale);  // exact: a power of two
  const float bias[2] = {(kLeanCodeOffset - 8.0f * st.m[0]) / kLeanCodeScale,
                         (kLeanCodeOffset - 8.0f * st.m[1]) / kLeanCodeScale};
  auto code = [&](int r) {  // FP32 whose low byte is the code
    return __float_as_uint(fmaf(fma_sat(s[r], scale, bias[acc_half(r)]), kLeanCodeScale, kRoundToInteger));
  };
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = 16 * k + 8 * (j / 2) + 2 * (j % 2);  // as pack_p
      pf[4 * k + j] = gather_low_bytes(code(r), code(r + 1), code(r + 4), code(r + 5));
    }
}

// P (FP32, S accumulator layout) -> e4m3 A fragments of the P V product, four k = 32 steps of four registers.
// The A operand's register j of a step holds row half j%2, k columns 4(l%4) + {0..3} (+16 for j >= 2); the
// accumulator holds key columns 2(l%4) + {0, 1, 8, 9} (+16) there. Rather than move bytes between lanes, V^T's keys
// are stored permuted (the host's pre-pass): A column 4t + 2a + b holds key 8a + 2t + b of each 16, so these
// registers are the fragments as they stand.
__device__ __forceinline__ void pack_p(const float (&s)[64], uint32_t (&pf)[16]) {
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = 16 * k + 8 * (j / 2) + 2 * (j % 2);  // first of registers r, r+1 (keys 2t, 2t+1), r+4, r+5
      pf[4 * k + j] = pack_e4m3x4(s[r], s[r + 1], s[r + 4], s[r + 5]);
    }
}

template <int D_QK>
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t q_rows, uint32_t k_tile) {
  const uint64_t q_desc = smem_desc_sw128(q_rows, 16, kAtomBytes);
  const uint64_t k_desc = smem_desc_sw128(k_tile, 16, kAtomBytes);
#pragma unroll
  for (int k = 0; k < D_QK / kMmaK; ++k) {
    // K step k lies in box k/4, at byte 32 (k%4) of each swizzled 128-byte row.
    const uint32_t offset = (k / 4) * kBoxBytes + (k % 4) * kMmaK;
    wgmma_m64n128k32_ss_e4m3(s, smem_desc_advance(q_desc, offset), smem_desc_advance(k_desc, offset), k > 0);
  }
}

// acc = P V^T-tile (N = 136: columns 128..135 the row sums), a fresh accumulator.
template <int ACC_REGS>  // 68 with the ones columns, else 64
__device__ __forceinline__ void issue_pv(float (&acc)[ACC_REGS], const uint32_t (&pf)[16], uint32_t v_tile) {
  const uint64_t v_desc = smem_desc_sw128(v_tile, 16, kAtomBytes);
#pragma unroll
  for (int k = 0; k < kTileN / kMmaK; ++k) {
    const uint32_t a[4] = {pf[4 * k], pf[4 * k + 1], pf[4 * k + 2], pf[4 * k + 3]};
    if constexpr (ACC_REGS == 68) {
      wgmma_m64n136k32_rs_e4m3(acc, a, smem_desc_advance(v_desc, k * kMmaK), k > 0);
    } else {
      wgmma_m64n128k32_rs_e4m3(acc, a, smem_desc_advance(v_desc, k * kMmaK), k > 0);
    }
  }
}

__device__ __forceinline__ void fence_acc(float (&d)[kAccRegs]) {
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The second level of the accumulation: O += acc and l += its ones columns, in FP32 registers. Every factor of
// tile j's softmax applies to O and l before tile j's product is added, as in the model.
// `sums`: the tile's row sums when they do not come from the ones columns (ZYFA_ROWSUM 1, 2).
__device__ __forceinline__ void add_tile(float (&o)[64], RowState& st, const float (&acc)[kAccRegs],
                                         const float (&sums)[2]) {
#pragma unroll
  for (int r = 0; r < 64; ++r) o[r] += acc[r];
  if constexpr (kOnes) {
    st.l[0] += acc[kAccRegs - 4];
    st.l[1] += acc[kAccRegs - 2];
  } else {
    st.l[0] += sums[0];
    st.l[1] += sums[1];
  }
}

// This lane's part of the row sums of a tile (ZYFA_ROWSUM 1: unrounded p; 2: the packed e4m3 P); the quad's four
// parts are added at the end of the query tile.
__device__ __forceinline__ void tile_sums(const float (&s)[64], const uint32_t (&pf)[16], float (&sums)[2]) {
  if constexpr (kRowsum == 1) {
    float part[2][4] = {};
#pragma unroll
    for (int r = 0; r < 64; ++r) part[acc_half(r)][(r / 4) % 4] += s[r];
#pragma unroll
    for (int h = 0; h < 2; ++h) sums[h] = (part[h][0] + part[h][1]) + (part[h][2] + part[h][3]);
  } else if constexpr (kRowsum == 2) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t part[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // fragment registers 4k + h and 4k + h + 2 hold row half h
        uint32_t a, b, c, d;
        unpack_e4m3x4(pf[4 * k + h], a, b);
        unpack_e4m3x4(pf[4 * k + h + 2], c, d);
        part[k] = hadd2(hadd2(a, b), hadd2(c, d));
      }
      sums[h] = f16x2_sum(hadd2(part[0], part[1])) + f16x2_sum(hadd2(part[2], part[3]));
    }
  }
}

__device__ __forceinline__ void rescale(float (&o)[64], RowState& st, const float (&factor)[2]) {
  if (factor[0] != 1.0f || factor[1] != 1.0f) {
#pragma unroll
    for (int r = 0; r < 64; ++r) o[r] *= factor[acc_half(r)];
    st.l[0] *= factor[0];
    st.l[1] *= factor[1];
  }
}

// The softmax of one key tile: row maxima (factor for O and l), then P as e4m3 A fragments.
template <PMode MODE>
__device__ __forceinline__ void probabilities(float (&s)[64], RowState& st, float c, float (&factor)[2],
                                              uint32_t (&pf)[16]) {
  row_maxima(s, st, c, factor);
  if constexpr (MODE == PMode::kLean) {
    lean_p(s, st, c, pf);
  } else {
    exact_p(s, st, c);
    pack_p(s, pf);
  }
}

template <int D_QK, int D_V, int STAGES, bool PINGPONG, PMode MODE>
__device__ void consume(uint8_t* smem, const Barriers& bars, const Params& p, int consumer) {
  using L = SharedLayout<D_QK, D_V, STAGES>;
  const uint32_t base = smem_u32(smem);
  const int thread = threadIdx.x % kThreadsPerWarpgroup;
  const int warp = thread / 32;
  const int lane = threadIdx.x % 32;
  const int group = p.heads / p.heads_k;
  const uint32_t q_rows = base + L::kQ + consumer * kRowsPerConsumer * kAtomRowBytes;
  const PingPong<PINGPONG> turn;
  if (consumer == 1) turn.release();

  RingPos<STAGES> ring;
  RingPos<STAGES> prev;
  uint32_t q_parity = 0;
  RowState st;
  float s[64], o[64], acc[kAccRegs];
  uint32_t pf[16];
  float sums[2] = {0.0f, 0.0f};  // row sums of the tile whose P V is in flight (ZYFA_ROWSUM 1, 2)

  auto k_tile = [&](const RingPos<STAGES>& at) { return base + L::kK + at.slot * L::kKBytes; };
  auto v_tile = [&](const RingPos<STAGES>& at) { return base + L::kV + at.slot * L::kVBytes; };
  auto release = [&](uint32_t bar) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };

  for (int index = blockIdx.x; index < p.num_jobs; index += gridDim.x) {
    const Job job = load_job(p.jobs, index);
    if (job.num_tiles() == 0) continue;  // a slot that pads the table: its batch and head are -1
    const int head_k = job.head / group;
    const float qd = p.q_descale[job.batch * p.q_descale_stride_b + head_k * p.q_descale_stride_h];
    const float kd = p.k_descale[job.batch * p.k_descale_stride_b + head_k * p.k_descale_stride_h];
    const float c = __fmul_rn(__fmul_rn(p.scale_log2, qd), kd);  // the model's order
    for (int i = 0; i < job.num_tiles(); ++i) {
      const int tile = job.tile(i);
      const int diag_row = consumer * kRowsPerConsumer + 16 * warp + lane / 4;
      float factor[2];
      st = no_rows();
#pragma unroll
      for (int r = 0; r < 64; ++r) o[r] = 0.0f;

      mbar_wait(bars.q_full(), q_parity);
      q_parity ^= 1;

      // Key tile 0: QK^T alone.
      mbar_wait(bars.k_full(ring.slot), ring.parity);
      turn.acquire();
      wgmma_fence();
      issue_qk<D_QK>(s, q_rows, k_tile(ring));
      wgmma_commit();
      turn.release();
      wgmma_wait<0>();
      fence_regs(s);
      release(bars.k_empty(ring.slot));
      if (tile == 0) {
        release(bars.q_empty());
        mask_diagonal(s, diag_row, lane);
      }
      probabilities<MODE>(s, st, c, factor, pf);  // m was unset: O and l are still 0, no factor needed
      tile_sums(s, pf, sums);
      prev = ring;
      ring.advance();

      // One key tile after the first: S of this tile and P V of the previous one in flight together.
      auto step = [&](auto diagonal) {
        mbar_wait(bars.k_full(ring.slot), ring.parity);
        mbar_wait(bars.v_full(prev.slot), prev.parity);
        turn.acquire();
        wgmma_fence();
        issue_qk<D_QK>(s, q_rows, k_tile(ring));
        wgmma_commit();
        issue_pv(acc, pf, v_tile(prev));
        wgmma_commit();
        turn.release();
        wgmma_wait<0>();  // both: the other consumer's GEMMs run under this one's softmax
        fence_acc(acc);
        release(bars.v_empty(prev.slot));
        add_tile(o, st, acc, sums);
        fence_regs(s);
        release(bars.k_empty(ring.slot));
        if constexpr (decltype(diagonal)::value) {
          release(bars.q_empty());
          mask_diagonal(s, diag_row, lane);
        }
        probabilities<MODE>(s, st, c, factor, pf);
        rescale(o, st, factor);
        tile_sums(s, pf, sums);
        prev = ring;
        ring.advance();
      };
      for (int kt = 1; kt < tile; ++kt) step(std::false_type{});
      if (tile > 0) step(std::true_type{});
      // The last tile's P V.
      mbar_wait(bars.v_full(prev.slot), prev.parity);
      turn.acquire();
      wgmma_fence();
      issue_pv(acc, pf, v_tile(prev));
      wgmma_commit();
      turn.release();
      wgmma_wait<0>();
      fence_acc(acc);
      release(bars.v_empty(prev.slot));
      add_tile(o, st, acc, sums);

      // Epilogue: out = O / l * v_descale in BF16, lse = ln2 (m - 8 + log2 l); rows past seqlen are not stored.
      const int row = tile * kTileM + consumer * kRowsPerConsumer + 16 * warp + lane / 4;
      const int head_row = job.batch * p.heads + job.head;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float l = kOnes ? st.l[h] : quad_sum(st.l[h]);  // the ones columns give every lane the whole sum
        const float inv_l = 1.0f / l;
        // loaded here: registers fewer through the key loop
        const float scale = inv_l * p.v_descale[job.batch * p.v_descale_stride_b +
                                                (job.head / group) * p.v_descale_stride_h];
        const int q = row + 8 * h;
        if (q < p.seqlen) {
          uint16_t* out = p.out + job.batch * p.out_stride_b + q * p.out_stride_s + job.head * p.out_stride_h;
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            const int r = 4 * j + 2 * h;
            *reinterpret_cast<uint32_t*>(out + acc_col(r, lane)) = pack_bf16x2(o[r] * scale, o[r + 1] * scale);
          }
          if (lane % 4 == 0)
            p.lse[static_cast<long long>(head_row) * p.seqlen + q] = kLn2 * (st.m[h] - kPShift - log2f(inv_l));
        }
      }
    }
  }
}

template <int D_QK, int D_V, int STAGES, bool PINGPONG, PMode MODE>
__device__ void attention_fwd(const TensorMap* tq, const TensorMap* tk, const TensorMap* tvt, const Params& p) {
  using L = SharedLayout<D_QK, D_V, STAGES>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((kAtomBytes - smem_u32(smem_raw) % kAtomBytes) % kAtomBytes);
  const Barriers bars{smem_u32(smem) + L::kBarriers};
  const int warpgroup = threadIdx.x / kThreadsPerWarpgroup;

  // The ones rows after every V^T slot, written once: TMA never writes there.
  for (int w = threadIdx.x; kOnes && w < STAGES * kOnesBytes / 4; w += kThreads) {
    const int slot = w / (kOnesBytes / 4);
    reinterpret_cast<uint32_t*>(smem + L::kV + slot * L::kVBytes + D_V * kAtomRowBytes)[w % (kOnesBytes / 4)] =
        kE4m3OnesWord;
  }
  fence_proxy_async_shared();  // wgmma reads them through the async proxy
  if (threadIdx.x == 0) {
    tma_prefetch_map(tq);
    tma_prefetch_map(tk);
    tma_prefetch_map(tvt);
    mbar_init(bars.q_full(), 1);
    mbar_init(bars.q_empty(), kConsumerWarps);
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
    if (threadIdx.x == 0) produce<D_QK, D_V, STAGES>(tq, tk, tvt, smem, bars, p);
  } else {
    regs_claim<kConsumerRegs>();
    consume<D_QK, D_V, STAGES, PINGPONG, MODE>(smem, bars, p, warpgroup - 1);
  }
}

}  // namespace fp8
}  // namespace zyfa

static_assert(zyfa::fp8::SharedLayout<ZYFA_D_QK, ZYFA_D_V, ZYFA_STAGES>::kBytes + zyfa::fp8::kAtomBytes ==
                  ZYFA_DYNAMIC_SHARED_BYTES,
              "shared memory layout and manifest disagree");
static_assert(ZYFA_D_V == zyfa::fp8::kTileN, "the P V product is one 64x136 accumulator: d_v must be 128");
static_assert(!(ZYFA_LEAN && ZYFA_ROWSUM == 1), "lean P has no unrounded probabilities to sum (ZYFA_ROWSUM 1)");
static_assert(ZYFA_D_QK % zyfa::fp8::kMmaK == 0 && ZYFA_D_QK <= 256, "d_qk must be a multiple of 32, at most 256");

extern "C" __global__ void __launch_bounds__(zyfa::fp8::kThreads, 1)
    ZYFA_KERNEL(const __grid_constant__ zyfa::TensorMap q, const __grid_constant__ zyfa::TensorMap k,
                const __grid_constant__ zyfa::TensorMap vt, uint16_t* out, float* lse, const int* jobs,
                const float* q_descale, const float* k_descale, const float* v_descale, int q_descale_stride_b,
                int q_descale_stride_h, int k_descale_stride_b, int k_descale_stride_h, int v_descale_stride_b,
                int v_descale_stride_h, int num_jobs, int seqlen, int heads, int heads_k, float scale_log2,
                long long out_stride_b, long long out_stride_s, long long out_stride_h) {
  const zyfa::fp8::Params p{out, lse, jobs, q_descale, k_descale, v_descale, q_descale_stride_b, q_descale_stride_h,
                            k_descale_stride_b, k_descale_stride_h, v_descale_stride_b, v_descale_stride_h,
                            num_jobs, seqlen, heads, heads_k, scale_log2, out_stride_b, out_stride_s,
                            out_stride_h};
  constexpr zyfa::fp8::PMode kMode = ZYFA_LEAN ? zyfa::fp8::PMode::kLean : zyfa::fp8::PMode::kExact;
  zyfa::fp8::attention_fwd<ZYFA_D_QK, ZYFA_D_V, ZYFA_STAGES, ZYFA_PINGPONG != 0, kMode>(&q, &k, &vt, p);
}
