// Causal forward attention, BF16 in, BF16 out (+ FP32 log-sum-exp), for Hopper (sm_90a): the kernel's entry point.
//
// One CTA per SM walks a host-built job table (tile_scheduler.cuh). Three warpgroups: the producer loads Q, K and V
// tiles with TMA into shared memory (producer.cuh, pipeline.cuh); two consumers of 64 query rows each compute
// S = Q K^T and O += P V with wgmma (mainloop_bf16.cuh) and the softmax in registers (softmax_bf16.cuh), then
// store O / l and lse (epilogue.cuh). The numerics follow the model of zyfa.numerics (p_mode "bf16"): key tiles in
// increasing order, a lazily rescaled row maximum (rescale only when a tile's maximum exceeds it by more than tau),
// p = 2^(x - m) in FP32, the row sum of unrounded p, P = bf16(p), O += P V in FP32, O / l at the end (as
// O * (1/l)) and lse = ln2 (m + log2 l). Any sequence length: TMA reads rows and keys past seqlen as zeros,
// causality removes keys past a row's own, and rows past seqlen are not stored (masks_tail in the manifest).
//
// "kernel_config.cuh", written by the build for each kernel (config.cuh says what it holds), defines the symbol
// ZYFA_KERNEL and zyfa::Config.

#include "kernel.cuh"
#include "kernel_config.cuh"
#include "mainloop_bf16.cuh"

namespace zyfa {

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

static_assert(Config::kDV == kTileN, "the P V product is one 64x128 accumulator: d_v must be 128");
static_assert(Config::kDQk % Config::kBoxCols == 0, "d_qk must be a multiple of 64");

}  // namespace zyfa

extern "C" __global__ void __launch_bounds__(zyfa::kThreads, 1)
    ZYFA_KERNEL(const __grid_constant__ zyfa::TensorMap q, const __grid_constant__ zyfa::TensorMap k,
                const __grid_constant__ zyfa::TensorMap v, uint16_t* out, float* lse, const int* jobs,
                int num_jobs, int seqlen, int heads, int heads_k, float scale_log2, long long out_stride_b,
                long long out_stride_s, long long out_stride_h) {
  const zyfa::Params p{out, lse, jobs, num_jobs, seqlen, heads, heads_k, scale_log2,
                       out_stride_b, out_stride_s, out_stride_h};
  zyfa::attention_fwd<zyfa::Config>(&q, &k, &v, p);
}
