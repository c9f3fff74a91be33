// Independent chains of arithmetic for the microbenchmarks (pipes.cu, code_fetch.cu): eight integer and eight float
// chains that a loop's body advances, timed with the SM clock; each warp writes its cycles.
#pragma once

#include <cstdint>

#include "clock.cuh"

namespace {

constexpr int kChains = 8;
constexpr uint32_t kSeed = 2654435761u;

// Runs `body(u, f, i)` on chain i of the integer and float chains, each chain kRounds times a loop trip (straight-line
// code), `iters` trips, and writes each warp's cycles.
template <int kRounds = 1, class Body>
__device__ __forceinline__ void chains(uint32_t* cycles, uint32_t* sink, int iters, Body body) {
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
    for (int k = 0; k < kRounds * kChains; ++k) body(u, f, k % kChains);
  }
  const uint32_t stop = clock32();
  uint32_t folded = 0;  // keeps every chain live
#pragma unroll
  for (int i = 0; i < kChains; ++i) folded ^= u[i] ^ __float_as_uint(f[i]);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = folded;
  if (threadIdx.x % 32 == 0) cycles[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = stop - start;
}

}  // namespace
