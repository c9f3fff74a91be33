// Causal forward attention, FP8 e4m3 in, BF16 out (+ FP32 log-sum-exp), for Hopper (sm_90a): the kernel's entry point.
//
// The BF16 kernel's CTA shape, tile walk, producer, ring and epilogue (attention_fwd.cu), with e4m3 operands and
// the FP8 main loop (mainloop_fp8.cuh) and softmax (softmax_fp8.cuh). What FP8 changes:
//   - both GEMMs are e4m3 wgmma (k = 32), whose shared-memory operands are K-major only: V arrives transposed (V^T,
//     keys contiguous), written by the host's pre-pass, with the keys of every 16 permuted so that the S
//     accumulator's registers are the P operand's bytes as they stand (see pack_p);
//   - the numerics are zyfa.numerics with p_shift 8, rowsum "rounded", no per-block scaling, and p_mode "exact"
//     or "lean"; the row sum l adds exactly the rounded P that multiplies V;
//   - two-level accumulation: each key tile's P V lands in a fresh wgmma accumulator that is added into FP32
//     registers O and l;
//   - descales are read on the device per (batch, kv head): c = scale log2(e) q_descale k_descale scales the scores,
//     v_descale the output; lse = ln2 (m - 8 + log2 l).
// Rows and keys past `seqlen` need no masking of their own: TMA reads them as zeros, causality removes keys past a
// row's own, and rows past seqlen are not stored. So any sequence length runs without padding.
//
// "kernel_config.cuh", written by the build for each kernel (config.cuh says what it holds), defines the symbol
// ZYFA_KERNEL and zyfa::Config.

#include "kernel.cuh"
#include "kernel_config.cuh"
#include "mainloop_fp8.cuh"

namespace zyfa {

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

static_assert(Config::kDV == kTileN, "the P V product is one 64x128 accumulator: d_v must be 128");
static_assert(Config::kDQk % Config::kMmaK == 0 && Config::kDQk <= 256, "d_qk must be a multiple of 32, at most 256");

}  // namespace zyfa

extern "C" __global__ void __launch_bounds__(zyfa::kThreads, 1)
    ZYFA_KERNEL(const __grid_constant__ zyfa::TensorMap q, const __grid_constant__ zyfa::TensorMap k,
                const __grid_constant__ zyfa::TensorMap vt, uint16_t* out, float* lse, const int* jobs,
                const float* q_descale, const float* k_descale, const float* v_descale, int q_descale_stride_b,
                int q_descale_stride_h, int k_descale_stride_b, int k_descale_stride_h, int v_descale_stride_b,
                int v_descale_stride_h, int num_jobs, int seqlen, int heads, int heads_k, float scale_log2,
                long long out_stride_b, long long out_stride_s, long long out_stride_h) {
  const zyfa::Params p{out, lse, jobs, q_descale, k_descale, v_descale, q_descale_stride_b, q_descale_stride_h,
                       k_descale_stride_b, k_descale_stride_h, v_descale_stride_b, v_descale_stride_h,
                       num_jobs, seqlen, heads, heads_k, scale_log2, out_stride_b, out_stride_s, out_stride_h};
  zyfa::attention_fwd<zyfa::Config>(&q, &k, &vt, p);
}
