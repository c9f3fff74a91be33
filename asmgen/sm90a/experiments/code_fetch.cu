// Instruction fetch on one SM sub-partition: loops whose body is N instructions of straight-line code (16 N bytes),
// half FFMA and half IADD3 in sixteen independent chains, so that the two pipes together issue about one instruction
// a cycle and no chain waits on its own latency. While a body fits the instruction caches nearest the scheduler its
// cycles per instruction stay at that rate; past each cache's size the loop streams its code from the next level,
// and the rise says at what rate. The d = 128 BF16 code-test kernel's key loop holds 23 KB of code and a query tile
// runs through about three times that (docs/sm90a.md): microbench.py builds, checks and runs these at 4 KB to 256 KB.
#include <cstdint>

#include "clock.cuh"

namespace {

constexpr int kChains = 8;  // of each kind
constexpr uint32_t kSeed = 2654435761u;

template <int kInstructions>
__device__ __forceinline__ void straight_line(uint32_t* cycles, uint32_t* sink, int iters) {
  static_assert(kInstructions % (2 * kChains) == 0, "whole rounds of both kinds of chain");
  uint32_t u[kChains];
  float f[kChains];
#pragma unroll
  for (int i = 0; i < kChains; ++i) {
    u[i] = kSeed * (threadIdx.x + 7 * i + 1);
    f[i] = __uint_as_float(0x3f000000u + u[i] % 1024);  // in [0.5, 0.51)
  }
  __syncthreads();
  const uint32_t start = clock32();
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int k = 0; k < kInstructions / 2; ++k) {
      const int i = k % kChains, j = (k + 1) % kChains;
      f[i] = fmaf(f[i], 0.999f, f[j]);  // FFMA
      u[i] = u[i] + u[j] + kSeed;       // IADD3
    }
  }
  const uint32_t stop = clock32();
  uint32_t folded = 0;  // keeps every chain live
#pragma unroll
  for (int i = 0; i < kChains; ++i) folded ^= u[i] ^ __float_as_uint(f[i]);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = folded;
  if (threadIdx.x % 32 == 0) cycles[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = stop - start;
}

}  // namespace

// fetch_<K>kb: a loop body of K KB (K * 64 instructions).
#define FETCH_KERNEL(size)                                                                   \
  extern "C" __global__ void fetch_##size##kb(uint32_t* cycles, uint32_t* sink, int iters) { \
    straight_line<size * 64>(cycles, sink, iters);                                           \
  }

FETCH_KERNEL(4)
FETCH_KERNEL(8)
FETCH_KERNEL(16)
FETCH_KERNEL(24)
FETCH_KERNEL(32)
FETCH_KERNEL(48)
FETCH_KERNEL(64)
FETCH_KERNEL(96)
FETCH_KERNEL(128)
FETCH_KERNEL(192)
FETCH_KERNEL(256)
