// Causal BF16 forward attention for gfx950 (MI355X): a persistent grid walks the paired job table; each job is
// two 256-row query tiles of one (batch, head), computed by 8 waves of 32 rows over 64-key tiles, waves 4-7 one
// barrier behind waves 0-3 so the two waves of each SIMD alternate matrix and other work (key_loop): at d = 128 a
// ping-pong with two score tiles in flight (ZYFA_TWO_TILES), at d_qk = 192 an 8-stage pipeline (ZYFA_STAGES).
//
// Built once per configuration with -D ZYFA_SYMBOL=<name> -D ZYFA_D_QK=<d_qk> -D ZYFA_D_V=<d_v> -D ZYFA_TAU=<tau>
// and the schedule's define (asmgen/hip/kernels.py). The numerics are zyfa.numerics' p_mode "bf16" with key_tile 64, rowsum "fp32".
//
// Layouts (v_mfma_f32_32x32x16_bf16; lane l, g = l / 32):
//  * scores transposed, S^T = K Q^T: A = K (lane l: key l % 32, d slots 8g..8g+7 of each 16-wide chunk), B = Q^T
//    (lane l: query l % 32, the same d slots), held in registers for the whole query tile. Output register r of
//    lane l is key 8(r/4) + 4g + r%4 (of a 32-key half), query l % 32: each lane owns one query's scores, max, sum
//    and output; lanes l and l ^ 32 share a query.
//  * P is then already the B operand of O^T = V^T P^T: MFMA (half h, step j) takes the lane's registers 8j..8j+7,
//    whose slot 8g + i is key 32h + 16j + 8(i/4) + 4g + i%4. The A operand V^T must hold the same keys: V is
//    stored transposed in LDS ([d_v][key]) so a lane reads its 8 keys with two 8-byte reads.
#include "attention.h"

constexpr int CHUNK = 16;  // contraction depth of one MFMA
constexpr int QK_CHUNKS = D_QK / CHUNK;
constexpr int K_STRIDE = D_QK + 8;     // LDS row pitch of K in elements (16 bytes of padding: fewer bank conflicts)
constexpr int VT_STRIDE = TILE_N + 4;  // LDS row pitch of V^T in elements (8-byte aligned reads)
constexpr int VEC = LOAD_BYTES / 2;    // elements per global load
static_assert(D_QK % CHUNK == 0 && D_V % 32 == 0, "head dims must be multiples of 16 (d_qk) and 32 (d_v)");

typedef Params<bf16> P;

constexpr int SLOTS = 2;                                 // K and V^T tiles in LDS: one read while one is written
constexpr int K_LOADS = TILE_N * D_QK / VEC / THREADS;   // 16-byte loads per thread and tile
constexpr int V_LOADS = TILE_N * D_V / VEC / THREADS;
constexpr int GROUP_B = WAVES / 2;                       // waves 4-7: one barrier behind waves 0-3

struct Lds {
  bf16 k[SLOTS][TILE_N * K_STRIDE];
  bf16 vt[SLOTS][D_V * VT_STRIDE];
};

// A thread's share of one key tile, between its global loads and its LDS writes.
struct Staged {
  bf16x8 k[K_LOADS], v[V_LOADS];
};

// A thread's share of a tile: row tid / LANES_PER_ROW, and the 16-byte chunks tid % LANES_PER_ROW + j
// LANES_PER_ROW (j < K_LOADS or V_LOADS) of it, so its loads and LDS writes differ by immediate offsets only.
constexpr int LANES_PER_ROW = THREADS / TILE_N;
static_assert(LANES_PER_ROW * K_LOADS * VEC == D_QK && LANES_PER_ROW * V_LOADS * VEC == D_V, "whole rows per tile");
ZYFA_DEVICE int share_row(int tid) { return tid / LANES_PER_ROW; }
ZYFA_DEVICE int share_col(int tid, int j) { return (tid % LANES_PER_ROW + j * LANES_PER_ROW) * VEC; }

// The K rows of the tile at k_key0 and the V rows of the tile at v_key0 (the same tile but in the two-tile
// pipeline, where a stage holds K one tile ahead of V).
ZYFA_DEVICE void fetch(Staged& st, const P& p, int b, int hk, int k_key0, int v_key0, int tid) {
  const bf16* k = &p.k[offset(p.k_stride, b, k_key0 + share_row(tid), hk)];
  const bf16* v = &p.v[offset(p.v_stride, b, v_key0 + share_row(tid), hk)];
#pragma unroll
  for (int j = 0; j < K_LOADS; ++j) st.k[j] = *(const bf16x8*)&k[share_col(tid, j)];
#pragma unroll
  for (int j = 0; j < V_LOADS; ++j) st.v[j] = *(const bf16x8*)&v[share_col(tid, j)];
}

// K row-major into LDS slot `slot`.
ZYFA_DEVICE void store_k(Lds& lds, int slot, const Staged& st, int tid) {
#pragma unroll
  for (int j = 0; j < K_LOADS; ++j)
    *(bf16x8*)&lds.k[slot][share_row(tid) * K_STRIDE + share_col(tid, j)] = st.k[j];
}

// K row-major, V transposed ([d_v][key]) into LDS slot `slot`.
ZYFA_DEVICE void store(Lds& lds, int slot, const Staged& st, int tid) {
  store_k(lds, slot, st, tid);
#pragma unroll
  for (int j = 0; j < V_LOADS; ++j)
#pragma unroll
    for (int e = 0; e < VEC; ++e) lds.vt[slot][(share_col(tid, j) + e) * VT_STRIDE + share_row(tid)] = st.v[j][e];
}

// s += K Q^T (S^T) of one 64-key tile from the K part of LDS slot `slot`, as two 32-key halves (matrix priority).
ZYFA_DEVICE void scores(const Lds& lds, int slot, const bf16x8 (&qop)[QK_CHUNKS], f32x16 (&s)[2], int g, int lane) {
  __builtin_amdgcn_s_setprio(1);
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int i = 0; i < QK_CHUNKS; ++i) {
      const bf16x8 kop = *(const bf16x8*)&lds.k[slot][(32 * half + lane % 32) * K_STRIDE + CHUNK * i + 8 * g];
      s[half] = __builtin_amdgcn_mfma_f32_32x32x16_bf16(kop, qop[i], s[half], 0, 0, 0);
    }
  __builtin_amdgcn_s_setprio(0);
}

// Softmax of one score tile: x = c s, the causal mask, lazy rescaling, p = 2^(x - m) as the B operands of PV.
ZYFA_DEVICE void softmax(f32x16 (&s)[2], bf16x8 (&pop)[2][2], float& m, float& l, f32x16 (&o)[DV_BLOCKS], float c,
                         int key0, int q0, int query, int g) {
  // x = c s, the causal mask where the tile reaches past the wave's first row, and the tile maximum.
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int r = 0; r < 16; ++r) s[half][r] *= c;
  if (key0 + TILE_N - 1 > q0) {
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int r = 0; r < 16; ++r)
        if (key0 + 32 * half + key_of_register(r, g) > query) s[half][r] = NEG_INF;
  }
  float tile_max = NEG_INF;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int r = 0; r < 16; ++r) tile_max = fmax(tile_max, s[half][r]);
  tile_max = max_halves(tile_max);

  // Lazy rescaling: m moves only when the tile's maximum exceeds it by more than tau.
  if (tile_max > m + TAU) {
    const float alpha = exp2(m - tile_max);
    m = tile_max;
    l *= alpha;
#pragma unroll
    for (int d = 0; d < DV_BLOCKS; ++d) o[d] *= alpha;
  }

  // p = 2^(x - m) in FP32; l adds the tile's sum of it unrounded (as the model: one rounding of l per tile), PV
  // takes it as BF16.
  float tile_sum = 0.0f;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const float pr = exp2(s[half][r] - m);
      tile_sum += pr;
      pop[half][r / 8][r % 8] = (bf16)pr;
    }
  l += add_halves(tile_sum);
}

// The A operand of PV (half h, step j) for output block d: the 8 keys of V^T that pair with P's slots.
ZYFA_DEVICE bf16x8 vt_operand(const Lds& lds, int slot, int d, int half, int j, int g, int lane) {
  const bf16* vt = &lds.vt[slot][(32 * d + lane % 32) * VT_STRIDE + 32 * half + 16 * j + 4 * g];
  const bf16x4 lo = *(const bf16x4*)vt, hi = *(const bf16x4*)(vt + 8);
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7);
}

// Softmax of one score tile and O += bf16(p) V.
ZYFA_DEVICE void softmax_pv(const Lds& lds, int slot, f32x16 (&s)[2], float& m, float& l, f32x16 (&o)[DV_BLOCKS],
                            float c, int key0, int q0, int query, int g, int lane) {
  bf16x8 pop[2][2];
  softmax(s, pop, m, l, o, c, key0, q0, query, g);
#pragma unroll
  for (int d = 0; d < DV_BLOCKS; ++d)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        o[d] = __builtin_amdgcn_mfma_f32_32x32x16_bf16(vt_operand(lds, slot, d, half, j, g, lane), pop[half][j],
                                                      o[d], 0, 0, 0);
}

#ifdef ZYFA_TWO_TILES
// Ping-pong with two score tiles in flight (d = 128). Iteration i issues QK(i+1) (into the other score registers),
// passes barrier B2, then runs softmax and PV of tile i, whose scores QK(i) issued one iteration earlier: the
// softmax never waits for the MFMAs just issued, which run in the matrix pipe under it. LDS slot i % 2 holds
// stage i = {K of tile i+1, V^T of tile i}, so iteration i reads only stage i (K before B2, V^T after), as the
// one-tile ping-pong reads tile i, and the same barrier argument holds with stages for tiles: group B (waves
// 4-7) passes one extra barrier before the loop and group A one after it; every wave writes its share of stage
// i+1 between barriers 2i+1 and 2i+2 (counting from the one after stage 0 is in LDS: A after its B2(i), B before
// its B2(i)), after both groups' last read of stage i-1 and before either group's first read of stage i+1. The
// K of tile 0 (stage -1) sits in slot 1 and is read before barrier 1, the first write of slot 1. K of the last
// stage repeats the last tile (never read), so every stage has the same loads. Iterations are unrolled by two:
// the slot and the roles of the two score tiles are constants.
ZYFA_DEVICE void key_loop(Lds& lds, const P& p, const bf16x8 (&qop)[QK_CHUNKS], float& m, float& l,
                          f32x16 (&o)[DV_BLOCKS], float c, int b, int hk, int tile, int wave, int lane, int tid) {
  const int g = lane / 32, q0 = tile * TILE_M + wave * ROWS, query = q0 + lane % 32;
  const bool late = wave >= GROUP_B;
  const int key_tiles = (tile + 1) * (TILE_M / TILE_N), last = (key_tiles - 1) * TILE_N;
  const auto k_of_stage = [&](int i) { return __builtin_elementwise_min((i + 1) * TILE_N, last); };

  Staged st;
  fetch(st, p, b, hk, 0, 0, tid);
  store_k(lds, 1, st, tid);  // stage -1: K of tile 0
  fetch(st, p, b, hk, k_of_stage(0), 0, tid);
  store(lds, 0, st, tid);
  barrier();  // stages -1 and 0 are in LDS (and every read of the previous query tile is done)
  f32x16 s[2][2] = {};
  scores(lds, 1, qop, s[0], g, lane);  // QK(0): tile 0 is visible to every wave
  if (late) {
    if (key_tiles > 1) fetch(st, p, b, hk, k_of_stage(1), TILE_N, tid);
    barrier();
  }
  const auto step = [&](int kt, int slot, f32x16 (&cur)[2], f32x16 (&nxt)[2]) {
    const int key0 = kt * TILE_N;
    const bool next = kt + 1 < key_tiles, visible = key0 <= q0 + ROWS - 1;
    if (next) {
      if (late)
        store(lds, 1 - slot, st, tid);
      else
        fetch(st, p, b, hk, k_of_stage(kt + 1), key0 + TILE_N, tid);
    }
    if (next && key0 + TILE_N <= q0 + ROWS - 1) {  // QK(kt + 1)
      nxt[0] = nxt[1] = f32x16{};
      scores(lds, slot, qop, nxt, g, lane);
    }
    barrier();  // B2
    if (next) {
      if (late) {
        if (kt + 2 < key_tiles) fetch(st, p, b, hk, k_of_stage(kt + 2), key0 + 2 * TILE_N, tid);
      } else {
        store(lds, 1 - slot, st, tid);
      }
    }
    if (visible) softmax_pv(lds, slot, cur, m, l, o, c, key0, q0, query, g, lane);
    barrier();  // B1
  };
  for (int kt = 0; kt < key_tiles; kt += 2) {  // key_tiles is a multiple of 4
    step(kt, 0, s[0], s[1]);
    step(kt + 1, 1, s[1], s[0]);
  }
  if (!late) barrier();
}
#elif defined(ZYFA_STAGES)
// One stage of the 8-stage pipeline ends: a workgroup barrier that the compiler schedules nothing across.
ZYFA_DEVICE void stage_end() {
  __builtin_amdgcn_sched_barrier(0);
  barrier();
  __builtin_amdgcn_sched_barrier(0);
}

// K operands of QK half `half` (its 32 keys, every chunk of d), read by an LDS stage for the matrix stage after it.
ZYFA_DEVICE void read_k(const Lds& lds, int slot, int half, bf16x8 (&buf)[QK_CHUNKS], int g, int lane) {
#pragma unroll
  for (int i = 0; i < QK_CHUNKS; ++i)
    buf[i] = *(const bf16x8*)&lds.k[slot][(32 * half + lane % 32) * K_STRIDE + CHUNK * i + 8 * g];
}

ZYFA_DEVICE void qk(const bf16x8 (&buf)[QK_CHUNKS], const bf16x8 (&qop)[QK_CHUNKS], f32x16& s) {
  __builtin_amdgcn_s_setprio(1);
  s = f32x16{};
#pragma unroll
  for (int i = 0; i < QK_CHUNKS; ++i) s = __builtin_amdgcn_mfma_f32_32x32x16_bf16(buf[i], qop[i], s, 0, 0, 0);
  __builtin_amdgcn_s_setprio(0);
}

constexpr int STAGES = 8, FETCH_STAGE = 5, STORE_STAGE = 6;
constexpr int PV_BLOCKS = DV_BLOCKS / 2;  // output blocks per PV stage
constexpr int PV_OPERANDS = PV_BLOCKS * 4;  // (block, half, step) operands of one PV stage
static_assert(PV_OPERANDS <= QK_CHUNKS, "a PV stage's V^T operands reuse the K operand registers");

// V^T operands of output blocks d0 .. d0 + PV_BLOCKS - 1.
ZYFA_DEVICE void read_vt(const Lds& lds, int slot, int d0, bf16x8 (&buf)[QK_CHUNKS], int g, int lane) {
#pragma unroll
  for (int d = 0; d < PV_BLOCKS; ++d)
#pragma unroll
    for (int i = 0; i < 4; ++i) buf[4 * d + i] = vt_operand(lds, slot, d0 + d, i / 2, i % 2, g, lane);
}

ZYFA_DEVICE void pv(const bf16x8 (&buf)[QK_CHUNKS], const bf16x8 (&pop)[2][2], f32x16 (&o)[DV_BLOCKS], int d0) {
  __builtin_amdgcn_s_setprio(1);
#pragma unroll
  for (int d = 0; d < PV_BLOCKS; ++d)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      o[d0 + d] = __builtin_amdgcn_mfma_f32_32x32x16_bf16(buf[4 * d + i], pop[i / 2][i % 2], o[d0 + d], 0, 0, 0);
  __builtin_amdgcn_s_setprio(0);
}

// The 8-stage pipeline (d_qk = 192): every key tile is 8 stages, each ended by a workgroup barrier, alternating LDS
// reads into registers (even stages) and the matrix instructions that consume them (odd stages):
//   0 K of keys 0-31 | 1 QK of them | 2 K of keys 32-63 | 3 QK of them | 4 softmax, V^T of output blocks 0-1 |
//   5 PV of blocks 0-1, the global loads of tile i+1 | 6 V^T of blocks 2-3, tile i+1 into the other slot |
//   7 PV of blocks 2-3.
// Group B (waves 4-7) passes one extra barrier before the loop and group A one after it, so B runs one stage
// behind A: while a wave of A issues matrix instructions (odd stage), its SIMD partner of B (w + 4) reads LDS or
// runs the softmax (the even stage before), and the reverse. Counting barriers from the one after tile 0 is in
// LDS, A runs stage s of tile i between barriers 8i+s and 8i+s+1, B between 8i+s+1 and 8i+s+2: both read tile i
// (slot i % 2) between barriers 8i and 8i+8, and write tile i+1 into the other slot in their stage 6 (between
// barriers 8i+6 and 8i+8), after B's last read of tile i-1 (its stage 6, before barrier 8i) and before A's first
// read of tile i+1 (after barrier 8i+8). The global loads of tile i+1 are issued in stage 5, when the scores no
// longer need their registers. A wave whose rows see no key of a tile skips its compute, never a barrier.
ZYFA_DEVICE void key_loop(Lds& lds, const P& p, const bf16x8 (&qop)[QK_CHUNKS], float& m, float& l,
                          f32x16 (&o)[DV_BLOCKS], float c, int b, int hk, int tile, int wave, int lane, int tid) {
  const int g = lane / 32, q0 = tile * TILE_M + wave * ROWS, query = q0 + lane % 32;
  const bool late = wave >= GROUP_B;
  const int key_tiles = (tile + 1) * (TILE_M / TILE_N);
  Staged st;
  fetch(st, p, b, hk, 0, 0, tid);
  store(lds, 0, st, tid);
  barrier();  // tile 0 is in slot 0 (and every read of the previous query tile is done)
  if (late) barrier();
  // The tiles whose keys the wave's rows see come first (keys 0 .. q0 + 31); the rest only refill and keep the
  // barriers: two loops, so the steady state has no branch around its stages.
  const int visible_tiles = (q0 + ROWS - 1) / TILE_N + 1;
  const auto refill = [&](int kt, int stage) {  // the global loads of tile kt + 1, then its LDS writes
    if (kt + 1 < key_tiles && stage == FETCH_STAGE) fetch(st, p, b, hk, (kt + 1) * TILE_N, (kt + 1) * TILE_N, tid);
    if (kt + 1 < key_tiles && stage == STORE_STAGE) store(lds, 1 - kt % SLOTS, st, tid);
  };
  for (int kt = 0; kt < visible_tiles; ++kt) {
    const int key0 = kt * TILE_N, slot = kt % SLOTS;
    bf16x8 buf[QK_CHUNKS];  // the operands an LDS stage reads for the matrix stage after it
    f32x16 s[2];
    bf16x8 pop[2][2];
    read_k(lds, slot, 0, buf, g, lane);
    stage_end();
    qk(buf, qop, s[0]);
    stage_end();
    read_k(lds, slot, 1, buf, g, lane);
    stage_end();
    qk(buf, qop, s[1]);
    stage_end();
    softmax(s, pop, m, l, o, c, key0, q0, query, g);
    read_vt(lds, slot, 0, buf, g, lane);
    stage_end();
    refill(kt, 5);
    pv(buf, pop, o, 0);
    stage_end();
    read_vt(lds, slot, PV_BLOCKS, buf, g, lane);
    refill(kt, 6);
    stage_end();
    pv(buf, pop, o, PV_BLOCKS);
    stage_end();
  }
  for (int kt = visible_tiles; kt < key_tiles; ++kt)  // (idle: the refill's loads and writes in one stage)
#pragma unroll
    for (int stage = 0; stage < STAGES; ++stage) {
      if (stage == STORE_STAGE) {
        refill(kt, FETCH_STAGE);
        refill(kt, STORE_STAGE);
      }
      stage_end();
    }
  if (!late) barrier();
}
#else
#error "a BF16 schedule: ZYFA_TWO_TILES or ZYFA_STAGES (asmgen/hip/kernels.py)"
#endif

// One 256-row query tile of one (batch, head): wave `wave` takes rows tile * 256 + 32 wave + (0..31).
ZYFA_DEVICE void query_tile(Lds& lds, const P& p, float c, int b, int h, int hk, int tile, int wave, int lane,
                            int tid) {
  const int g = lane / 32, query = tile * TILE_M + wave * ROWS + lane % 32;
  bf16x8 qop[QK_CHUNKS];
  const Offset q_at = offset(p.q_stride, b, query, h) + 8 * g;
#pragma unroll
  for (int i = 0; i < QK_CHUNKS; ++i) qop[i] = *(const bf16x8*)&p.q[q_at + CHUNK * i];
  f32x16 o[DV_BLOCKS] = {};
  float m = NEG_INF, l = 0.0f;
  key_loop(lds, p, qop, m, l, o, c, b, hk, tile, wave, lane, tid);

  // out = bf16(O / l), lse = ln 2 (m + log2 l); register r of block d is column 32 d + 8 (r/4) + 4 g + r%4.
  const float inv_l = rcp(l);
  const Offset out_at = offset(p.out_stride, b, query, h) + 4 * g;
#pragma unroll
  for (int d = 0; d < DV_BLOCKS; ++d)
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      bf16x4 y;
#pragma unroll
      for (int e = 0; e < 4; ++e) y[e] = (bf16)(o[d][4 * t + e] * inv_l);
      *(bf16x4*)&p.out[out_at + 32 * d + 8 * t] = y;
    }
  if (g == 0) p.lse[((Offset)b * p.heads + h) * p.seqlen + query] = LN2 * (m + log2(l));
}

ZYFA_KERNEL void ZYFA_SYMBOL(P p) {
  ZYFA_SHARED Lds lds;
  const int tid = thread_id(), lane = tid % WAVE, wave = uniform(tid / WAVE);
  const float c = scale_log2e(p.softmax_scale);
  walk_jobs(p, [&](int b, int h, int hk, int tile) { query_tile(lds, p, c, b, h, hk, tile, wave, lane, tid); });
}
