// Throughput of the instruction types of the FP8 softmax on one SM sub-partition: each kernel runs a loop of eight
// independent chains of one instruction (or two, interleaved), so that its cycles per iteration, divided among the
// warps that share a sub-partition, give the pipe's rate. microbench.py builds, checks (the loop's SASS) and runs them.
#include <cstdint>

#include "chains.cuh"

namespace {

__device__ __forceinline__ float ex2(float x) {  // MUFU.EX2
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Two e4m3x2 conversions of FP32 pairs (F2FP.SATFINITE.E4M3.F32.PACK_AB, and a PRMT that merges the halves).
__device__ __forceinline__ uint32_t pack_e4m3(uint32_t a, uint32_t b) {
  uint32_t r;
  asm volatile("{.reg .b16 l, h; .reg .f32 x, y; mov.b32 x, %1; mov.b32 y, %2;\n"
               "cvt.rn.satfinite.e4m3x2.f32 l, x, y; cvt.rn.satfinite.e4m3x2.f32 h, y, x; mov.b32 %0, {l, h};}"
               : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t unpack_e4m3(uint32_t a) {  // F2FP.F16.E4M3.UNPACK_B
  uint32_t r;
  asm volatile("{.reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, l;}" : "=r"(r) : "r"(a));
  return r;
}
__device__ __forceinline__ uint32_t pack_bf16(uint32_t a) {  // F2FP.BF16.F32.PACK_AB
  uint32_t r;
  asm volatile("{.reg .f32 x; mov.b32 x, %1; cvt.rn.bf16x2.f32 %0, x, x;}" : "=r"(r) : "r"(a));
  return r;
}
__device__ __forceinline__ uint32_t hmax2(uint32_t a, uint32_t b) {  // HMNMX2
  uint32_t r;
  asm volatile("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t hadd2(uint32_t a, uint32_t b) {  // HADD2 (ptxas moves some to HFMA2.MMA)
  uint32_t r;
  asm volatile("add.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

}  // namespace

#define PIPE_KERNEL(name, statement)                                                             \
  extern "C" __global__ void name(uint32_t* cycles, uint32_t* sink, int iters) {                 \
    chains(cycles, sink, iters, [](uint32_t(&u)[kChains], float(&f)[kChains], int i) {          \
      const int j = (i + 1) % kChains;                                                           \
      (void)j;                                                                                   \
      statement;                                                                                 \
    });                                                                                          \
  }

PIPE_KERNEL(pipe_ex2, f[i] = ex2(-f[i]))
PIPE_KERNEL(pipe_ffma, f[i] = fmaf(f[i], 0.999f, f[j]))
PIPE_KERNEL(pipe_fadd, f[i] = f[i] + f[j])
PIPE_KERNEL(pipe_fmul, f[i] = f[i] * f[j])
PIPE_KERNEL(pipe_fmnmx, f[i] = fmaxf(f[i], f[j]))
PIPE_KERNEL(pipe_hmnmx2, u[i] = hmax2(u[i], u[j]))
PIPE_KERNEL(pipe_lop3, u[i] = u[i] ^ u[j] ^ kSeed)
PIPE_KERNEL(pipe_iadd3, u[i] = u[i] + u[j] + kSeed)
PIPE_KERNEL(pipe_imad, u[i] = u[i] * u[j] + kSeed)
PIPE_KERNEL(pipe_hadd2, u[i] = hadd2(u[i], u[j]))
PIPE_KERNEL(pipe_prmt, u[i] = __byte_perm(u[i], u[j], 0x5140))
PIPE_KERNEL(pipe_shf, u[i] = __funnelshift_l(u[i], u[j], 7))
PIPE_KERNEL(pipe_pack_e4m3, u[i] = pack_e4m3(u[i], u[j]))
PIPE_KERNEL(pipe_unpack_e4m3, u[i] = unpack_e4m3(u[i]))
PIPE_KERNEL(pipe_pack_bf16, u[i] = pack_bf16(u[i]))
// Pairs: a sum of the two rates means one pipe, their maximum two.
PIPE_KERNEL(pipe_ex2_and_pack_e4m3, if (i % 2) f[i] = ex2(-f[i]); else u[i] = pack_e4m3(u[i], u[j]))
PIPE_KERNEL(pipe_ex2_and_unpack_e4m3, if (i % 2) f[i] = ex2(-f[i]); else u[i] = unpack_e4m3(u[i]))
PIPE_KERNEL(pipe_ex2_and_pack_bf16, if (i % 2) f[i] = ex2(-f[i]); else u[i] = pack_bf16(u[i]))
PIPE_KERNEL(pipe_ex2_and_fmnmx, if (i % 2) f[i] = ex2(-f[i]); else f[i] = fmaxf(f[i], f[(i + 2) % kChains]))
PIPE_KERNEL(pipe_fmnmx_and_ffma, if (i % 2) f[i] = fmaxf(f[i], f[(i + 2) % kChains]); else f[i] = fmaf(f[i], 0.999f, f[j]))
PIPE_KERNEL(pipe_fmnmx_and_hmnmx2, if (i % 2) f[i] = fmaxf(f[i], f[(i + 2) % kChains]); else u[i] = hmax2(u[i], u[j]))
PIPE_KERNEL(pipe_pack_and_unpack_e4m3, if (i % 2) u[i] = pack_e4m3(u[i], u[j]); else u[i] = unpack_e4m3(u[i]))
