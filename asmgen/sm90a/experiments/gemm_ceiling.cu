// The tensor pipe's ceiling under the attention kernels' GEMM load: per consumer warpgroup and key-tile step, the
// QK^T of a 64-row query tile (both operands from shared memory) and the P V of its 128 keys (P from registers),
// committed together and waited for, as a step of the kernels issues them; two warpgroups per CTA, one CTA per SM,
// no softmax; the `_split` kernels issue the QK^T as two GEMMs of 64 keys (N = 64: twice the shared-memory reads of
// Q per FLOP), as a kernel whose softmax starts on the first half would. Operands are random values of the element
// type (the tensor pipe's power, and so the SM clock, depends on the bits it multiplies), read once from `data` into
// shared memory and registers. Each warp writes its cycles; microbench.py times the launch, so the table gives
// TFLOP/s and the SM clock under this load.
#include "config.cuh"
#include "ptx.cuh"

#include "clock.cuh"

using namespace zyfa;

namespace {

constexpr int kSharedBytes = 96 * 1024;  // BF16: Q 64 x 128 (two boxes), K 128 x 128, V 128 x 128
constexpr uint32_t kK = 32 * 1024;       // the K tile's offset
constexpr uint32_t kV = 64 * 1024;       // the V (BF16) or V^T (FP8) tile's offset

// The operands, read once from `data`: shared memory, P's registers `a`, and the descriptors of this warpgroup's Q
// rows, of K and of V (v_leading: V's leading byte offset, 16 for FP8's V^T, a box for BF16's MN-major V).
struct Operands {
  uint32_t a[32];
  uint64_t q, k, v;
  __device__ explicit Operands(const uint32_t* data, uint32_t v_leading) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const uint32_t base = (raw + 1023) & ~1023u;
    uint32_t* words = reinterpret_cast<uint32_t*>(smem + (base - raw));
    for (int i = threadIdx.x; i < kSharedBytes / 4; i += blockDim.x) words[i] = data[i];
#pragma unroll
    for (int r = 0; r < 32; ++r) a[r] = data[(threadIdx.x * 32 + r) % (kSharedBytes / 4)];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic-proxy writes, read by wgmma
    __syncthreads();
    const uint32_t rows = base + (threadIdx.x / kThreadsPerWarpgroup) * kRowsPerConsumer * kAtomRowBytes;
    q = smem_desc_sw128(rows, 16, kAtomBytes);
    k = smem_desc_sw128(base + kK, 16, kAtomBytes);
    v = smem_desc_sw128(base + kV, v_leading, kAtomBytes);
  }
};

__device__ __forceinline__ void write_out(uint32_t* cycles, uint32_t* sink, uint32_t elapsed, const float (&s)[64],
                                          const float (&acc)[64]) {
  float x = 0.0f;
#pragma unroll
  for (int r = 0; r < 64; ++r) x += s[r] + acc[r];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = __float_as_uint(x);
  if (threadIdx.x % 32 == 0) cycles[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = elapsed;
}

#define ZYFA_ACC32                                                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define ZYFA_HALF_OPS(d, h) \
  ZYFA_ACC8_OPS(d, 32 * h), ZYFA_ACC8_OPS(d, 32 * h + 8), ZYFA_ACC8_OPS(d, 32 * h + 16), ZYFA_ACC8_OPS(d, 32 * h + 24)

// D(64x64, f32) (+)= A(64xK) B(Kx64), both operands K-major in shared memory, D the registers 32 H .. 32 H + 31 of a
// 64x128 accumulator: QK^T for 64 of a tile's 128 keys (the kernels' QK^T split in two GEMMs).
template <int H>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, uint32_t acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " ZYFA_ACC32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
      : ZYFA_HALF_OPS(d, H)
      : "l"(desc_a), "l"(desc_b), "r"(acc));
}
template <int H>
__device__ __forceinline__ void wgmma_m64n64k32_ss_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                        uint32_t acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " ZYFA_ACC32 ", %32, %33, p, 1, 1;\n}\n"
      : ZYFA_HALF_OPS(d, H)
      : "l"(desc_a), "l"(desc_b), "r"(acc));
}

constexpr uint32_t kHalfKeys = 64 * kAtomRowBytes;  // K rows 64.. of a box: the second half's keys

// The QK^T of a step, committed: one GEMM of the tile's 128 keys, or (kSplit) two of 64 keys, each its commit group
// as a kernel whose softmax starts on the first half would issue them. The same FLOP.
template <bool kSplit>
__device__ __forceinline__ void qk_fp8(float (&s)[64], uint64_t q, uint64_t k) {
  if constexpr (kSplit) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n64k32_ss_e4m3<0>(s, smem_desc_advance(q, 32 * kk), smem_desc_advance(k, 32 * kk), kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n64k32_ss_e4m3<1>(s, smem_desc_advance(q, 32 * kk), smem_desc_advance(k, kHalfKeys + 32 * kk), kk > 0);
  } else {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n128k32_ss_e4m3(s, smem_desc_advance(q, 32 * kk), smem_desc_advance(k, 32 * kk), kk > 0);
  }
  wgmma_commit();
}

// K step kk of a BF16 tile lies in box kk / 4, at byte 32 (kk % 4) of each swizzled row.
__device__ constexpr uint32_t bf16_k_offset(int kk) { return (kk / 4) * Bf16::kBoxBytes + (kk % 4) * 32; }

template <bool kSplit>
__device__ __forceinline__ void qk_bf16(float (&s)[64], uint64_t q, uint64_t k) {
  if constexpr (kSplit) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      wgmma_m64n64k16_ss<0>(s, smem_desc_advance(q, bf16_k_offset(kk)), smem_desc_advance(k, bf16_k_offset(kk)),
                            kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      wgmma_m64n64k16_ss<1>(s, smem_desc_advance(q, bf16_k_offset(kk)),
                            smem_desc_advance(k, kHalfKeys + bf16_k_offset(kk)), kk > 0);
  } else {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      wgmma_m64n128k16_ss(s, smem_desc_advance(q, bf16_k_offset(kk)), smem_desc_advance(k, bf16_k_offset(kk)),
                          kk > 0);
  }
  wgmma_commit();
}

// e4m3, d = 128: the QK^T (4 m64n128k32, or 4 + 4 m64n64k32) and 4 m64n128k32 of P V per step, the FP8 kernels'
// steady step (P V into a fresh accumulator).
template <bool kSplit>
__device__ __forceinline__ void steps_fp8(uint32_t* cycles, uint32_t* sink, const uint32_t* data, int iters) {
  const Operands x(data, 16);
  const uint64_t q = x.q, k = x.k, v = x.v;
  float s[64], acc[64];
  const uint32_t start = clock32();
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
    qk_fp8<kSplit>(s, q, k);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t p[4] = {x.a[4 * kk], x.a[4 * kk + 1], x.a[4 * kk + 2], x.a[4 * kk + 3]};
      wgmma_m64n128k32_rs_e4m3(acc, p, smem_desc_advance(v, 32 * kk), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    fence_regs(acc);
  }
  write_out(cycles, sink, clock32() - start, s, acc);
}

// BF16, d = 128: the QK^T (8 m64n128k16, or 8 + 8 m64n64k16) and 8 m64n128k16 of P V per step, the BF16 kernels'
// step (P V accumulates into O).
template <bool kSplit>
__device__ __forceinline__ void steps_bf16(uint32_t* cycles, uint32_t* sink, const uint32_t* data, int iters) {
  const Operands x(data, Bf16::kBoxBytes);
  const uint64_t q = x.q, k = x.k, v = x.v;
  float s[64], o[64];
#pragma unroll
  for (int r = 0; r < 64; ++r) o[r] = 0.0f;
  const uint32_t start = clock32();
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
    qk_bf16<kSplit>(s, q, k);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t p[4] = {x.a[4 * kk], x.a[4 * kk + 1], x.a[4 * kk + 2], x.a[4 * kk + 3]};
      wgmma_m64n128k16_rs_bt(o, p, smem_desc_advance(v, kk * 16 * kAtomRowBytes));
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    fence_regs(o);
  }
  write_out(cycles, sink, clock32() - start, s, o);
}

}  // namespace

#define CEILING_KERNEL(name, steps)                                                                               \
  extern "C" __global__ void __launch_bounds__(256) name(uint32_t* cycles, uint32_t* sink, const uint32_t* data, \
                                                         int iters) {                                             \
    steps(cycles, sink, data, iters);                                                                             \
  }

CEILING_KERNEL(ceiling_fp8, steps_fp8<false>)
CEILING_KERNEL(ceiling_bf16, steps_bf16<false>)
CEILING_KERNEL(ceiling_fp8_split, steps_fp8<true>)
CEILING_KERNEL(ceiling_bf16_split, steps_bf16<true>)
