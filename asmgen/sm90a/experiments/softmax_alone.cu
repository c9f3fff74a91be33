// The FP8 consumer's softmax step (O += acc, then from softmax_fp8.cuh the lazy row maxima, exact P, its e4m3
// packing, the rescale and the rounded-P row sums) on registers in a loop, without the kernel around it: its cycles
// alone, beside a second warp on the sub-partition, without one of its parts, and beside another warpgroup's wgmmas
// issued in three ways; and the BF16 kernels' step (softmax_bf16.cuh) the same ways. microbench.py builds, checks
// and runs the kernels. The scores stay below m + tau, as in most steps of a long row.
#include "config.cuh"
#include "softmax_bf16.cuh"
#include "softmax_fp8.cuh"
#include "tile.cuh"

#include "clock.cuh"

using namespace zyfa;

namespace {

struct Exact : E4m3 {
  static constexpr float kTau = 0.125f;
  static constexpr PMode kPMode = PMode::kExact;
};
struct Lean : Exact {
  static constexpr PMode kPMode = PMode::kLean;
};
struct Bf16Step : Bf16 {  // the BF16 kernels' softmax
  static constexpr float kTau = 0.125f;
};

constexpr float kScale = 1.4427f;         // c: log2(e), a score scale of 1
constexpr float kRowMaximum = 4.0f;       // above every scaled score: the maxima never move
constexpr uint32_t kSoftmaxBarrier = 1;   // named barrier of the softmax warpgroup (0 is __syncthreads)
constexpr uint32_t kIssuerBarrier = 2;    // named barrier of the warpgroup that issues wgmmas beside it

// What a variant leaves out or changes; kBf16 is the BF16 kernels' step instead (softmax_bf16.cuh: row maxima, ex2 and the
// row sums of unrounded p, O's rescale, BF16 packing; O accumulates in the tensor core there).
enum Part { kAll, kLeanP, kNoRowSums, kNoRowMaxima, kNoAddTile, kBf16 };

// One warpgroup's softmax steps; each warp writes its cycles. Each step's S and acc are the last step's (what a GEMM
// would write: the compiler is told they changed), its P is folded into one score and into c, so that no step can
// start before the previous one's P exists and no exponential is loop-invariant.
template <Part kPart>
__device__ __forceinline__ void softmax_steps(uint32_t* cycles, uint32_t* sink, int iters, int warp) {
  float s[64], o[64], acc[64], sums[2] = {0.0f, 0.0f}, factor[2];
  uint32_t pf[kPart == kBf16 ? 32 : 16];
  float c = kScale;
  RowState st = {{kRowMaximum, kRowMaximum}, {0.0f, 0.0f}};
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < 64; ++r) {
    s[r] = 0.01f * ((lane * 7 + warp * 5 + r * 13) % 97);  // scaled scores in [0, 1.4)
    o[r] = 0.0f;
    acc[r] = 0.001f * r;
  }
  asm volatile("bar.sync %0, 128;" ::"r"(kSoftmaxBarrier));
  const uint32_t start = clock32();
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int r = 0; r < 64; ++r) asm volatile("" : "+f"(s[r]), "+f"(acc[r]));
    if constexpr (kPart != kNoAddTile && kPart != kBf16) {
#pragma unroll
      for (int r = 0; r < 64; ++r) o[r] += acc[r];
    }
    st.l[0] += sums[0];
    st.l[1] += sums[1];
    if constexpr (kPart == kBf16) {
      softmax_tile<Bf16Step>(s, st, c, factor);
      rescale_o(o, factor);
      pack_p(s, pf);
    } else if constexpr (kPart == kLeanP) {
      probabilities<Lean>(s, st, c, factor, pf);
    } else if constexpr (kPart == kNoRowMaxima) {
      factor[0] = factor[1] = 1.0f;
      exact_p<Exact>(s, st, c);
      pack_p(s, pf);
    } else {
      probabilities<Exact>(s, st, c, factor, pf);
    }
    if constexpr (kPart != kBf16) rescale(o, st, factor);
    if constexpr (kPart != kNoRowSums && kPart != kBf16) tile_sums(pf, sums);
    uint32_t fold = pf[0];
#pragma unroll
    for (int r = 1; r < static_cast<int>(sizeof(pf) / sizeof(pf[0])); ++r) fold ^= pf[r];
    s[0] = __uint_as_float(__float_as_uint(s[0]) ^ (fold & 1u));
    c = __uint_as_float(__float_as_uint(c) ^ (fold & 1u));
    if constexpr (kPart == kLeanP) {  // lean P leaves S as it was: without this ptxas hoists the row maxima
      const float nudge = __uint_as_float(fold & 1u);  // +0 or the least subnormal: S unchanged in FP32 sums
#pragma unroll
      for (int r = 1; r < 64; ++r) s[r] += nudge;
    }
  }
  const uint32_t stop = clock32();
  float x = st.l[0] + st.l[1];
#pragma unroll
  for (int r = 0; r < 64; ++r) x += o[r];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = __float_as_uint(x);
  if (lane == 0) cycles[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = stop - start;
}

}  // namespace

#define SOFTMAX_KERNEL(name, part)                                                   \
  extern "C" __global__ void name(uint32_t* cycles, uint32_t* sink, int iters) {     \
    softmax_steps<part>(cycles, sink, iters, threadIdx.x / 32);                      \
  }

SOFTMAX_KERNEL(softmax_all, kAll)
SOFTMAX_KERNEL(softmax_lean_p, kLeanP)
SOFTMAX_KERNEL(softmax_no_row_sums, kNoRowSums)
SOFTMAX_KERNEL(softmax_no_row_maxima, kNoRowMaxima)
SOFTMAX_KERNEL(softmax_no_add_tile, kNoAddTile)
SOFTMAX_KERNEL(softmax_bf16, kBf16)

// How warpgroup 1 keeps the tensor pipe busy beside the softmax warpgroup (softmax_beside): not at all; with
// commit groups of four QK^T-shaped m64n128k32 e4m3 wgmmas from shared memory (64 cycles of the pipe each), each
// waited for before the next is issued (gemm: the pipe about half busy, the warps asleep in their waits); groups
// of four with one left in flight (queued: the pipe busy, the next group in the pipe's queue, the warps asleep in
// their waits); groups of sixteen with one in flight (blocked: the pipe busy and the warps stalled in issuing the
// wgmmas its queue cannot take yet, as a consumer is while its partner's GEMMs run).
enum Issue { kIdle, kGemm, kQueued, kBlocked };
template <Issue kIssue>
struct IssueShape {
  static constexpr int kWgmmas = kIssue == kBlocked ? 16 : 4;  // per commit group
  static constexpr int kInFlight = kIssue == kGemm ? 0 : 1;    // groups left running by each wait
};

// 256 threads: warpgroup 0 runs the steps of `kPart`, warpgroup 1 issues wgmmas as `kIssue` says until all of
// warpgroup 0 is done; its warps write the number of groups they completed where their cycles would go.
template <Part kPart, Issue kIssue>
__device__ __forceinline__ void softmax_beside(uint32_t* cycles, uint32_t* sink, int iters) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ volatile int done;
  if (threadIdx.x == 0) done = 0;
  __syncthreads();
  if (threadIdx.x < kThreadsPerWarpgroup) {
    softmax_steps<kPart>(cycles, sink, iters, threadIdx.x / 32);
    asm volatile("bar.sync %0, 128;" ::"r"(kSoftmaxBarrier));
    if (threadIdx.x == 0) done = 1;
    return;
  }
  if constexpr (kIssue != kIdle) {
    using Shape = IssueShape<kIssue>;
    const uint32_t base = (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + 1023) & ~1023u;
    const uint64_t a = smem_desc_sw128(base, 16, kAtomBytes);
    const uint64_t b = smem_desc_sw128(base + kRowsPerConsumer * kAtomRowBytes, 16, kAtomBytes);
    // Two accumulators taking turns: a group in flight never shares its registers with the next one (else ptxas
    // waits after every wgmma).
    float acc[2][64];
#pragma unroll
    for (int r = 0; r < 64; ++r) acc[0][r] = acc[1][r] = 0.0f;
    auto group = [&](float(&d)[64]) {
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < Shape::kWgmmas; ++k)
        wgmma_m64n128k32_ss_e4m3(d, smem_desc_advance(a, 32 * (k % 4)), smem_desc_advance(b, 32 * (k % 4)), k > 0);
      wgmma_commit();
      wgmma_wait<Shape::kInFlight>();
    };
    // The four warps leave the loop together: a wgmma that only some warps of a warpgroup issue is an illegal
    // instruction, and each warp would otherwise read `done` at its own time.
    auto any_done = [&] {
      uint32_t any;
      asm volatile(
          "{ .reg .pred p, q; setp.ne.s32 p, %1, 0; bar.red.or.pred q, %2, 128, p; selp.u32 %0, 1, 0, q; }"
          : "=r"(any)
          : "r"(done), "r"(kIssuerBarrier));
      return any != 0;
    };
    uint32_t groups = 0;
    while (!any_done()) {
      group(acc[0]);
      group(acc[1]);
      groups += 2;
    }
    wgmma_wait<0>();
    float x = 0.0f;
#pragma unroll
    for (int r = 0; r < 64; ++r) x += acc[0][r] + acc[1][r];
    sink[blockIdx.x * blockDim.x + threadIdx.x] = __float_as_uint(x);
    if (threadIdx.x % 32 == 0) cycles[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = groups;
  }
}

#define SOFTMAX_BESIDE_KERNEL(name, part, issue)                                                                \
  extern "C" __global__ void __launch_bounds__(256) name(uint32_t* cycles, uint32_t* sink, int iters) {        \
    softmax_beside<part, issue>(cycles, sink, iters);                                                           \
  }

SOFTMAX_BESIDE_KERNEL(softmax_beside_idle, kAll, kIdle)
SOFTMAX_BESIDE_KERNEL(softmax_beside_gemm, kAll, kGemm)
SOFTMAX_BESIDE_KERNEL(softmax_beside_queued, kAll, kQueued)
SOFTMAX_BESIDE_KERNEL(softmax_beside_blocked, kAll, kBlocked)
SOFTMAX_BESIDE_KERNEL(softmax_bf16_beside_idle, kBf16, kIdle)
SOFTMAX_BESIDE_KERNEL(softmax_bf16_beside_gemm, kBf16, kGemm)
SOFTMAX_BESIDE_KERNEL(softmax_bf16_beside_queued, kBf16, kQueued)
SOFTMAX_BESIDE_KERNEL(softmax_bf16_beside_blocked, kBf16, kBlocked)
