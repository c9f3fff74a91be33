// Causal FP8 (e4m3) forward attention for gfx950 (MI355X) with 64-bit element offsets: for tensors whose byte
// offsets exceed 32 bits (the assembly kernels address each (batch, head) slice with 32-bit buffer offsets). Same
// job walk, tiles and numerics as those kernels: zyfa.numerics with key_tile = scale_block = 64, p_shift 8,
// rowsum "rounded", P lean (-D ZYFA_LEAN) or exact.
//
// Built with -D ZYFA_SYMBOL -D ZYFA_D_QK -D ZYFA_D_V -D ZYFA_TAU -D ZYFA_P_SHIFT [-D ZYFA_LEAN] -D ZYFA_OFFSET64
// (asmgen/hip/kernels.py).
//
// Layouts (v_mfma_f32_32x32x64_f8f6f4, e4m3 A and B; lane l, g = l / 32; the k labelling of an unscaled MFMA's
// slots is unobservable, so only the pairing of A and B slots matters):
//  * S^T = K Q^T: lane l of A holds 32 consecutive d bytes 64c + 32g.. of key l % 32, B the same bytes of query
//    l % 32 (held in registers). Score register r is key 8(r/4) + 4g + r%4 of its 32-key half, query l % 32.
//  * O^T = V^T P^T with one MFMA per 64-key tile and 32-column block: the B operand is the lane's 32 P bytes in
//    register order (byte b: half b / 16, register b % 16). V^T is stored in LDS with each lane group's keys in
//    that order (key 32h + 8t + 4g + i at byte 32g + 16h + 4t + i of its row), so a lane reads its A operand with
//    two 16-byte reads.
//  * The row sum is one more MFMA with an A operand of e4m3 ones: every row of ones^T P^T is the column sum of P,
//    exactly the rounded probabilities that multiply V (a sum of 64 e4m3 values <= 2^p_shift is exact in FP32).
#include "attention.h"

constexpr int P_SHIFT = ZYFA_P_SHIFT;
constexpr int CHUNK = 64;  // contraction depth of one MFMA
constexpr int QK_CHUNKS = D_QK / CHUNK;
constexpr int K_STRIDE = D_QK + 16;     // LDS row pitch of K in bytes (16 bytes of padding)
constexpr int VT_STRIDE = TILE_N + 16;  // LDS row pitch of V^T in bytes
constexpr int E4M3_ONES = 0x38383838;   // four e4m3 1.0 bytes
constexpr float LEAN_OFFSET = 56.0f + 8.0f * P_SHIFT;  // lean code = max(0, rne(8 y + 56 + 8 p_shift))
static_assert(D_QK % CHUNK == 0 && D_V % 32 == 0, "head dims must be multiples of 64 (d_qk) and 32 (d_v)");

typedef Params<fp8> P;
typedef unsigned char u8x16 __attribute__((ext_vector_type(16)));

struct Lds {
  fp8 k[TILE_N * K_STRIDE];
  fp8 vt[D_V * VT_STRIDE];
};

ZYFA_DEVICE int vt_position(int key) {  // byte of a V^T row that holds `key` (see the layout above)
  const int h = key / 32, t = key % 32 / 8, g = key % 8 / 4, i = key % 4;
  return 32 * g + 16 * h + 4 * t + i;
}

ZYFA_DEVICE void load_tile(Lds& lds, const P& p, int b, int hk, int key0, int tid) {
  for (int i = tid; i < TILE_N * D_QK / LOAD_BYTES; i += THREADS) {
    const int row = i / (D_QK / LOAD_BYTES), col = i % (D_QK / LOAD_BYTES) * LOAD_BYTES;
    *(u8x16*)&lds.k[row * K_STRIDE + col] = *(const u8x16*)&p.k[offset(p.k_stride, b, key0 + row, hk) + col];
  }
  for (int i = tid; i < TILE_N * D_V / LOAD_BYTES; i += THREADS) {
    const int row = i / (D_V / LOAD_BYTES), col = i % (D_V / LOAD_BYTES) * LOAD_BYTES;
    const u8x16 x = *(const u8x16*)&p.v[offset(p.v_stride, b, key0 + row, hk) + col];
    const int at = vt_position(row);
#pragma unroll
    for (int e = 0; e < LOAD_BYTES; ++e) lds.vt[(col + e) * VT_STRIDE + at] = x[e];
  }
}

ZYFA_DEVICE i32x8 read32(const fp8* at) {  // 32 bytes of LDS as an MFMA operand
  const i32x4 lo = *(const i32x4*)at, hi = *(const i32x4*)(at + 16);
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7);
}

ZYFA_DEVICE i32x8 read32_global(const fp8* at) { return *(const i32x8*)at; }

ZYFA_DEVICE f32x16 mfma(i32x8 a, i32x8 b, f32x16 c) {  // unscaled e4m3 x e4m3 (scale operands 0: the plain form)
  return __builtin_amdgcn_mfma_scale_f32_32x32x64_f8f6f4(a, b, c, 0, 0, 0, 0, 0, 0);
}

// The e4m3 byte of P for exponent y <= 0 (scaled by 2^p_shift).
ZYFA_DEVICE unsigned p_code(float y) {
#ifdef ZYFA_LEAN
  return (unsigned)fmax(__builtin_rintf(y * 8.0f + LEAN_OFFSET), 0.0f);  // -inf -> 0
#else
  const float p = exp2(y) * (float)(1 << P_SHIFT);
  return __builtin_amdgcn_cvt_pk_fp8_f32(p, p, 0, false) & 0xFF;  // round to nearest even
#endif
}

ZYFA_DEVICE void query_tile(Lds& lds, const P& p, float c_scale, int b, int h, int hk, int tile, int wave, int lane,
                            int tid) {
  const int g = lane / 32, q0 = tile * TILE_M + wave * ROWS, query = q0 + lane % 32;
  const int bh = b * p.heads_k + hk;
  const float c = (c_scale * p.q_descale[bh]) * p.k_descale[bh];
  i32x8 qop[QK_CHUNKS];
  const Offset q_at = offset(p.q_stride, b, query, h) + 32 * g;
#pragma unroll
  for (int i = 0; i < QK_CHUNKS; ++i) qop[i] = read32_global(&p.q[q_at + CHUNK * i]);

  f32x16 o[DV_BLOCKS] = {};
  float m = NEG_INF, l = 0.0f;
  const i32x8 ones = {E4M3_ONES, E4M3_ONES, E4M3_ONES, E4M3_ONES, E4M3_ONES, E4M3_ONES, E4M3_ONES, E4M3_ONES};
  const int key_tiles = (tile + 1) * (TILE_M / TILE_N);
  for (int kt = 0; kt < key_tiles; ++kt) {
    const int key0 = kt * TILE_N;
    barrier();  // every wave has finished reading the previous tile
    load_tile(lds, p, b, hk, key0, tid);
    barrier();
    if (key0 > q0 + ROWS - 1) continue;  // no row of this wave sees a key of the tile

    f32x16 s[2] = {};
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int i = 0; i < QK_CHUNKS; ++i)
        s[half] = mfma(read32(&lds.k[(32 * half + lane % 32) * K_STRIDE + CHUNK * i + 32 * g]), qop[i], s[half]);

    const bool masked = key0 + TILE_N - 1 > q0;
    float tile_max = NEG_INF;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        float x = c * s[half][r];
        if (masked && key0 + 32 * half + key_of_register(r, g) > query) x = NEG_INF;
        s[half][r] = x;
        tile_max = fmax(tile_max, x);
      }
    tile_max = max_halves(tile_max);
    if (tile_max > m + TAU) {  // lazy rescaling
      const float alpha = exp2(m - tile_max);
      m = tile_max;
      l *= alpha;
#pragma unroll
      for (int d = 0; d < DV_BLOCKS; ++d) o[d] *= alpha;
    }

    // The tile is one scaling block: e = floor(m - block max) (0 for a row that sees no key), y = (x - m) + e.
    const float e = tile_max == NEG_INF ? 0.0f : __builtin_floorf(m - tile_max);
    i32x8 pop;
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      unsigned word = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = 4 * (w % 4) + j;
        word |= p_code((s[w / 4][r] - m) + e) << (8 * j);
      }
      pop[w] = (int)word;
    }
    // O += 2^-e (P V), l += 2^-e sum P: each product rounded once to FP32, then scaled exactly and added.
    const float weight = __builtin_ldexpf(1.0f, -(int)e);
    const f32x16 zero = {};
    const f32x16 sums = mfma(ones, pop, zero);
    l += weight * sums[0];
#pragma unroll
    for (int d = 0; d < DV_BLOCKS; ++d) {
      const f32x16 pv = mfma(read32(&lds.vt[(32 * d + lane % 32) * VT_STRIDE + 32 * g]), pop, zero);
      o[d] += weight * pv;
    }
  }

  // out = bf16((O / l) v_descale), lse = ln 2 (m - p_shift + log2 l); register r of block d is column
  // 32 d + 8 (r/4) + 4 g + r%4.
  const float scale_out = rcp(l);
  const float vd = p.v_descale[bh];
  const Offset out_at = offset(p.out_stride, b, query, h) + 4 * g;
#pragma unroll
  for (int d = 0; d < DV_BLOCKS; ++d)
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      bf16x4 y;
#pragma unroll
      for (int i = 0; i < 4; ++i) y[i] = (bf16)((o[d][4 * t + i] * scale_out) * vd);
      *(bf16x4*)&p.out[out_at + 32 * d + 8 * t] = y;
    }
  if (g == 0) p.lse[((Offset)b * p.heads + h) * p.seqlen + query] = LN2 * ((m - (float)P_SHIFT) + log2(l));
}

ZYFA_KERNEL void ZYFA_SYMBOL(P p) {
  ZYFA_SHARED Lds lds;
  const int tid = thread_id(), lane = tid % WAVE, wave = uniform(tid / WAVE);
  const float c = scale_log2e(p.softmax_scale);
  walk_jobs(p, [&](int b, int h, int hk, int tile) { query_tile(lds, p, c, b, h, hk, tile, wave, lane, tid); });
}
