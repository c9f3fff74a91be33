// What the gfx950 HIP attention kernels share: tiles, the argument buffer, element offsets and the job walk.
#pragma once
#include "zyfa_hip.h"

#ifndef ZYFA_D_QK
#error "ZYFA_D_QK, ZYFA_D_V, ZYFA_TAU and ZYFA_SYMBOL are set by the build (asmgen/hip/kernels.py)"
#endif

constexpr int D_QK = ZYFA_D_QK;
constexpr int D_V = ZYFA_D_V;
constexpr float TAU = ZYFA_TAU;  // lazy-rescale threshold, binades
constexpr int TILE_M = 256;      // query rows per workgroup tile
constexpr int TILE_N = 64;       // keys per tile (the model's key_tile; for FP8 also the scaling block)
constexpr int WAVES = 8;
constexpr int THREADS = WAVES * WAVE;
constexpr int ROWS = TILE_M / WAVES;  // 32 query rows per wave: the N of one 32x32 MFMA
constexpr int DV_BLOCKS = D_V / 32;   // 32-column blocks of the output
constexpr int LOAD_BYTES = 16;        // bytes per global load of K and V

#ifdef ZYFA_OFFSET64
typedef long long Offset;  // 64-bit element offsets and strides: tensors beyond 4 GiB
typedef long long Stride;
#else
typedef unsigned Offset;   // 32-bit element offsets (the dispatch takes this kernel only when every tensor fits)
typedef int Stride;
#endif

struct Strides { Stride b, s, h; };  // in elements; the dim stride is 1

// The argument buffer (the manifest entry's args, natural alignment): the assembly kernels' layout.
template <class T> struct Params {
  const T* q; const T* k; const T* v; bf16* out; float* lse;
  const float* q_descale; const float* k_descale; const float* v_descale;  // (batch, heads_k); FP8 only
  const int* jobs;  // rows [batch, head, tile_lo, tile_hi] (zyfa.jobs), chiplet-ordered for the grid
  int num_jobs, seqlen, heads, heads_k;
  float softmax_scale;
  Strides q_stride, k_stride, v_stride, out_stride;
};

ZYFA_DEVICE Offset offset(const Strides& st, int b, int s, int h) {
  return (Offset)b * (Offset)st.b + (Offset)s * (Offset)st.s + (Offset)h * (Offset)st.h;
}

// Key index of score register r (0..15) of a 32-key half, in lane group g (the 32x32 MFMA output layout).
ZYFA_DEVICE int key_of_register(int r, int g) { return 8 * (r / 4) + 4 * g + r % 4; }

// The persistent job walk: workgroup w takes jobs w, w + grid, ...; each job is tile_hi then tile_lo (once when
// equal; tile_lo < 0: an empty job). `tile(b, h, hk, t)` computes one 256-row query tile.
template <class T, class F> ZYFA_DEVICE void walk_jobs(const Params<T>& p, F tile) {
  const int grid = grid_work_items() / THREADS;
  const int group = divide_small(p.heads, p.heads_k);
  for (int job = workgroup_id(); job < p.num_jobs; job += grid) {
    const i32x4 row = *(const i32x4*)&p.jobs[4 * job];
    const int b = row[0], h = row[1], lo = row[2], hi = row[3];
    if (lo < 0) continue;
    const int hk = divide_small(h, group);
    tile(b, h, hk, hi);
    if (lo != hi) tile(b, h, hk, lo);
  }
}
