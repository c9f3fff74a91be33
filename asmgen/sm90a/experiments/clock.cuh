// The SM clock for the microbenchmarks (pipes.cu, softmax_alone.cu): a volatile read, so that the compiler keeps it
// where it stands against the other volatile instructions.
#pragma once

#include <cstdint>

__device__ __forceinline__ uint32_t clock32() {
  uint32_t t;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(t)::"memory");
  return t;
}
