// Instruction fetch on one SM sub-partition: loops whose body is N instructions of straight-line code (16 N bytes),
// half FFMA and half IADD3 in sixteen independent chains, so that the two pipes together issue about one instruction
// a cycle and no chain waits on its own latency. While a body fits the instruction caches nearest the scheduler its
// cycles per instruction stay at that rate; past each cache's size the loop streams its code from the next level,
// and the rise says at what rate. The d = 128 BF16 code-test kernel's key loop holds 23 KB of code and a query tile
// runs through about three times that (docs/sm90a.md): microbench.py builds, checks and runs these at 4 KB to 256 KB.
#include <cstdint>

#include "chains.cuh"

namespace {

// A round's two instructions on chain i: FFMA on the float chain, IADD3 on the integer one (two pipes).
struct FfmaIadd3 {
  __device__ __forceinline__ void operator()(uint32_t (&u)[kChains], float (&f)[kChains], int i) const {
    const int j = (i + 1) % kChains;
    f[i] = fmaf(f[i], 0.999f, f[j]);
    u[i] = u[i] + u[j] + kSeed;
  }
};

}  // namespace

// fetch_<K>kb: a loop body of K KB, K * 64 instructions of 16 bytes: K * 4 rounds of the eight chains' pairs.
#define FETCH_KERNEL(size)                                                                   \
  extern "C" __global__ void fetch_##size##kb(uint32_t* cycles, uint32_t* sink, int iters) { \
    chains<size * 4>(cycles, sink, iters, FfmaIadd3{});                                      \
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
