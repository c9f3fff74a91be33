// The few device-side declarations the gfx950 HIP kernels need, written against clang's AMDGPU builtins
// (clang -x hip -nogpuinc: no HIP runtime headers). Every builtin used here lowers to one gfx950 instruction.
#pragma once

#define ZYFA_KERNEL extern "C" __attribute__((global)) __attribute__((amdgpu_flat_work_group_size(512, 512)))
#define ZYFA_DEVICE static __attribute__((device)) __attribute__((always_inline)) inline
#define ZYFA_SHARED __attribute__((shared))

typedef __bf16 bf16;
typedef unsigned char fp8;  // e4m3fn bit patterns
typedef __bf16 bf16x4 __attribute__((ext_vector_type(4)));
typedef __bf16 bf16x8 __attribute__((ext_vector_type(8)));
typedef float f32x16 __attribute__((ext_vector_type(16)));
typedef int i32x4 __attribute__((ext_vector_type(4)));
typedef int i32x8 __attribute__((ext_vector_type(8)));

constexpr int WAVE = 64;
constexpr float LOG2E_HI = 1.44269502162933349609375f;  // fp32(log2 e)
constexpr float LOG2E_LO = 1.925963033500011079e-08f;   // log2 e - LOG2E_HI
constexpr float LN2 = 0.693147182464599609375f;
constexpr float NEG_INF = -__builtin_inff();
constexpr int DISPATCH_GRID_SIZE_X = 12;  // byte offset of grid_size_x (work-items) in the HSA dispatch packet

ZYFA_DEVICE int thread_id() { return __builtin_amdgcn_workitem_id_x(); }
ZYFA_DEVICE int workgroup_id() { return __builtin_amdgcn_workgroup_id_x(); }
// A value the compiler may keep in an SGPR: the same in every lane of the wave.
ZYFA_DEVICE int uniform(int x) { return __builtin_amdgcn_readfirstlane(x); }

// Work-items of the launch grid, from the dispatch packet (the kernels walk their job list with this stride).
ZYFA_DEVICE unsigned grid_work_items() {
  const unsigned* packet = (const unsigned*)__builtin_amdgcn_dispatch_ptr();
  return packet[DISPATCH_GRID_SIZE_X / 4];
}

// __syncthreads: LDS writes before the barrier are visible to every wave after it.
ZYFA_DEVICE void barrier() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

ZYFA_DEVICE float exp2(float x) { return __builtin_amdgcn_exp2f(x); }  // v_exp_f32
ZYFA_DEVICE float log2(float x) { return __builtin_amdgcn_logf(x); }   // v_log_f32
ZYFA_DEVICE float rcp(float x) { return __builtin_amdgcn_rcpf(x); }    // v_rcp_f32
ZYFA_DEVICE float fmax(float a, float b) { return __builtin_fmaxf(a, b); }

// The two lanes l and l ^ 32 of a wave hold halves of one query row: the partner's value (ds_bpermute_b32).
// (Not v_permlane32_swap: LLVM 22 folds permlane32_swap(x, x) as if both results were equal, contrary to the ISA.)
ZYFA_DEVICE float partner(float x) {
  const int lane = thread_id() % WAVE;
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(4 * (lane ^ 32), __builtin_bit_cast(int, x)));
}
ZYFA_DEVICE float max_halves(float x) { return fmax(x, partner(x)); }
ZYFA_DEVICE float add_halves(float x) { return x + partner(x); }

// c = softmax_scale * log2(e) rounded once to FP32 (the error of the high product recovered with an FMA).
ZYFA_DEVICE float scale_log2e(float scale) {
  float hi = scale * LOG2E_HI;
  float err = __builtin_fmaf(scale, LOG2E_HI, -hi);
  return hi + __builtin_fmaf(scale, LOG2E_LO, err);
}

// a / b for small non-negative scalars (the GQA group): gfx950 has no integer divide instruction.
ZYFA_DEVICE int divide_small(int a, int b) {
  int q = 0;
  for (; a >= b; a -= b) ++q;
  return q;
}
