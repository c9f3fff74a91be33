// Thin wrappers over the sm_90a PTX the attention kernel uses: mbarriers, TMA tile loads, wgmma, named barriers,
// register reallocation. Each wrapper is one instruction (or one short fixed sequence) so the kernel reads as the
// schedule it is.
#pragma once

#include <cstdint>

namespace zyfa {

// A CUtensorMap as the driver encodes it: 128 opaque bytes, 64-byte aligned, passed by value as a kernel parameter.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarriers --------------------------------------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes the initialised barriers visible to the copy engine before any TMA completes on them.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Waits until the phase with the given parity has completed. A fresh barrier counts its (virtual) previous phase,
// parity 1, as complete, which lets producers wait on "empty" barriers from the first round on.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// Whether the phase of `parity` of the mbarrier at `bar` has completed, without waiting: a probe whose latency can hide
// under other work, long before the wait it may save.
__device__ __forceinline__ bool mbar_test(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done;
}

// ---- TMA ----------------------------------------------------------------------------------------------------------

__device__ __forceinline__ void tma_prefetch_map(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Loads one box of a 4-d tensor map at coordinates (c0 innermost .. c3) into shared memory; completes on `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const TensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// ---- named barriers (id 0 is __syncthreads) -----------------------------------------------------------------------

__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- register reallocation between warpgroups ---------------------------------------------------------------------

template <uint32_t Regs>
__device__ __forceinline__ void regs_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Regs));
}

template <uint32_t Regs>
__device__ __forceinline__ void regs_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Regs));
}

// ---- wgmma --------------------------------------------------------------------------------------------------------

// Shared-memory matrix descriptor for a tile stored as 128-byte rows with the 128-byte swizzle (what TMA writes
// with CU_TENSOR_MAP_SWIZZLE_128B from a 1024-byte aligned address). `leading` and `stride` are byte offsets: for a
// K-major operand `stride` steps over 8 rows (1024) and `leading` is unused; for an MN-major operand `leading` steps
// to the next 64-element column block and `stride` over 8 rows of K.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr, uint32_t leading, uint32_t stride) {
  constexpr uint64_t kSwizzle128B = 1;
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((leading >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((stride >> 4) & 0x3FFF) << 32) | (kSwizzle128B << 62);
}

// The descriptor of `desc`'s tile `bytes` (a multiple of 16) further on: the start address field (bits 0-13, the
// address >> 4) is the low word's low end, and a shared-memory address below 2^18 plus the step stays below it, so
// one 32-bit add on the low word does it (no carry into the leading-offset field).
__device__ __forceinline__ uint64_t smem_desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}

// The compiler must not move accumulator registers across a wgmma wait: tie them to an empty asm statement.
__device__ __forceinline__ void fence_regs(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define ZYFA_ACC64                                                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

#define ZYFA_ACC8_OPS(d, i)                                                                                          \
  "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])

#define ZYFA_ACC64_OPS(d)                                                                                          \
  ZYFA_ACC8_OPS(d, 0), ZYFA_ACC8_OPS(d, 8), ZYFA_ACC8_OPS(d, 16), ZYFA_ACC8_OPS(d, 24), ZYFA_ACC8_OPS(d, 32), \
      ZYFA_ACC8_OPS(d, 40), ZYFA_ACC8_OPS(d, 48), ZYFA_ACC8_OPS(d, 56)

// D(64x128, f32) (+)= A(64x16) * B(16x128), both BF16 operands in shared memory, both K-major.
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                    uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred acc;\n"
      "setp.ne.b32 acc, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ZYFA_ACC64 ", %64, %65, acc, 1, 1, 0, 0;\n"
      "}\n"
      : ZYFA_ACC64_OPS(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D(64x128, f32) += A(64x16, BF16 registers) * B(16x128, BF16 shared memory, MN-major: the N index contiguous).
__device__ __forceinline__ void wgmma_m64n128k16_rs_bt(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred acc;\n"
      "setp.ne.b32 acc, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ZYFA_ACC64 ", {%64, %65, %66, %67}, %68, acc, 1, 1, 1;\n"
      "}\n"
      : ZYFA_ACC64_OPS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1u));
}

// ---- FP8 (e4m3) wgmma ------------------------------------------------------------------------------------------

// D(64x128, f32) (+)= A(64x32) * B(32x128), e4m3 operands in shared memory, both K-major (FP8 wgmma has no other).
__device__ __forceinline__ void wgmma_m64n128k32_ss_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                         uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred acc;\n"
      "setp.ne.b32 acc, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " ZYFA_ACC64 ", %64, %65, acc, 1, 1;\n"
      "}\n"
      : ZYFA_ACC64_OPS(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D(64x128, f32) (+)= A(64x32, e4m3 registers) * B(32x128, e4m3 shared memory, K-major).
__device__ __forceinline__ void wgmma_m64n128k32_rs_e4m3(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                         uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred acc;\n"
      "setp.ne.b32 acc, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " ZYFA_ACC64 ", {%64, %65, %66, %67}, %68, acc, 1, 1;\n"
      "}\n"
      : ZYFA_ACC64_OPS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}


// ---- the staged epilogue's moves ------------------------------------------------------------------------------

// Four 8x8 matrices of 16-bit values, each held as an mma fragment (lane l: row l/4, columns 2(l%4) and 2(l%4) + 1
// in one register, the lower column in the low half), to shared memory in row order: lane l gives the address of
// row l%8 of matrix l/8, 16 bytes.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(m0), "r"(m1),
               "r"(m2), "r"(m3)
               : "memory");
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr)
               : "memory");
  return v;
}

// A 16-byte store to global memory (16-byte aligned) as one instruction: with the row addresses taken from one base,
// the compiler split the first pass's C++ stores of lds128's result into four 4-byte stores.
__device__ __forceinline__ void stg128(void* ptr, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Bulk copies from shared to global memory (the TMA engine, no tensor map): `bytes` (a multiple of 16, both addresses
// 16-byte aligned) in the calling thread's current bulk group. The shared-memory writes before them must be made
// visible to the async proxy first (fence_proxy_async_shared).
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Until this thread's bulk groups have read their shared memory (it may be written again)...
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
// ... or have completed.
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Orders this thread's shared-memory writes before later reads by the async proxy (TMA, wgmma).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---- arithmetic -------------------------------------------------------------------------------------------------

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// log2 by the MUFU unit (absolute error about 2^-22; FA3 takes its lse so)
__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two FP32 values to one register of two BF16, round to nearest even; `lo` goes to the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  // volatile: keeps the write of P fragments after the wait for the wgmma that still reads the previous ones
  asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Four FP32 values to one register of four e4m3 bytes (b0 lowest), round to nearest even, saturating to +-448.
__device__ __forceinline__ uint32_t pack_e4m3x4(float b0, float b1, float b2, float b3) {
  uint32_t r;
  asm volatile(
      "{\n"
      ".reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n"
      "}\n"
      : "=r"(r)
      : "f"(b0), "f"(b1), "f"(b2), "f"(b3));
  return r;
}

// The per-half maximum of two registers, each two unsigned 16-bit integers (ptxas joins two of them into one
// three-input VIMNMX3.U16x2).
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// The four e4m3 bytes of `x` as two f16x2 registers (exact: every e4m3 value is an f16 value); bytes 0, 1 in `lo`.
__device__ __forceinline__ void unpack_e4m3x4(uint32_t x, uint32_t& lo, uint32_t& hi) {
  asm("{\n"
      ".reg .b16 a, b;\n"
      "mov.b32 {a, b}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, a;\n"
      "cvt.rn.f16x2.e4m3x2 %1, b;\n"
      "}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(x));
}

__device__ __forceinline__ uint32_t hadd2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// The sum of the two halves of an f16x2 register, in FP32.
__device__ __forceinline__ float f16x2_sum(uint32_t x) {
  float a, b;
  asm("{\n"
      ".reg .b16 l, h;\n"
      "mov.b32 {l, h}, %2;\n"
      "cvt.f32.f16 %0, l;\n"
      "cvt.f32.f16 %1, h;\n"
      "}\n"
      : "=f"(a), "=f"(b)
      : "r"(x));
  return a + b;
}

// ---- lean P codes (FMA and ALU pipes, no MUFU) ---------------------------------------------------------------

// a * b + c rounded once, clamped to [0, 1] (-inf and NaN give 0): one FFMA.SAT.
__device__ __forceinline__ float fma_sat(float a, float b, float c) {
  float d;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
}

// The low bytes of four registers as one (b0 lowest): three PRMTs.
__device__ __forceinline__ uint32_t gather_low_bytes(uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3) {
  return __byte_perm(__byte_perm(b0, b1, 0x0040), __byte_perm(b2, b3, 0x0040), 0x5410);
}

}  // namespace zyfa
