// FP8 V^T pre-pass: V (batch, seqlen, heads_k, d_v) e4m3, any element strides with a contiguous head dim, into
// V^T (batch, heads_k, d_v, keys) contiguous, keys = seqlen rounded up to 16, zeros after the last key. Within each
// group of 16 keys, position 4t + 2a + b holds key 8a + 2t + b: the order of the FP8 attention kernels' P operand
// (attention_fwd_fp8.cu, pack_p), so that their P needs no exchange between lanes.
//
// One CTA per (tile of ZYFA_TILE_KEYS keys, kv head, batch), eight warps. Load: each thread copies 16-byte chunks
// of V into a shared tile [key][dim] (a quarter warp reads one key's 128 contiguous bytes), chunk c of key k at
// chunk c ^ (k / 16 % 8), so that the reads below find 32 banks. Store: lane l of warp w takes key group l % 8 of the
// tile and dims 4 (4w + l / 8) .. + 3: it reads one word per key of its group, transposes 4x4 byte blocks in
// registers (prmt) and writes its group's 16 keys of each of its 4 dims as one 16-byte store. The eight lanes of one
// dim write the tile's 128 keys of a V^T row next to each other: every store instruction writes four whole rows
// (128 contiguous bytes each), so no 32-byte sector is left half written for another warp to complete. Offsets are
// 64-bit.
#include <cstdint>

#ifndef ZYFA_KERNEL
#define ZYFA_KERNEL zyfa_sm90a_transpose_v_fp8_d128
#endif
#ifndef ZYFA_D_V
#define ZYFA_D_V 128
#endif
#ifndef ZYFA_TILE_KEYS
#define ZYFA_TILE_KEYS 128
#endif
#ifndef ZYFA_THREADS
#define ZYFA_THREADS 256
#endif

constexpr int kDims = ZYFA_D_V;
constexpr int kTileKeys = ZYFA_TILE_KEYS;
constexpr int kGroup = 16;                         // keys permuted within groups of 16
constexpr int kGroups = kTileKeys / kGroup;        // key groups per tile: the lanes of one dim
constexpr int kChunks = kDims / 16;                // 16-byte chunks per key row
constexpr int kThreads = ZYFA_THREADS;             // the manifest entry's threads
constexpr int kQuadsPerWarp = 32 / kGroups;        // dim quads (4 dims) per warp and store
constexpr int kLoads = kTileKeys * kChunks / kThreads;  // 16-byte chunks each thread loads
static_assert(kDims == 128 && kTileKeys == 128, "eight warps of 8 groups x 4 dim quads cover the 128 x 128 tile");
static_assert(kThreads / 32 * kQuadsPerWarp * 4 == kDims, "tile shape");

// Shared-memory chunk of (key, chunk): XOR-swizzled by the key's group, so that the eight lanes reading one word of
// eight groups hit eight different banks.
__device__ __forceinline__ int swizzled(int key, int chunk) { return key * kChunks + (chunk ^ (key / kGroup % 8)); }

// Bytes r of a, b, c, d (r = 0..3) as the four words of a 4x4 byte transpose.
__device__ __forceinline__ void transpose4(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t (&r)[4]) {
    const uint32_t ab01 = __byte_perm(a, b, 0x5140), ab23 = __byte_perm(a, b, 0x7362);  // a0 b0 a1 b1 / a2 b2 a3 b3
    const uint32_t cd01 = __byte_perm(c, d, 0x5140), cd23 = __byte_perm(c, d, 0x7362);
    r[0] = __byte_perm(ab01, cd01, 0x5410);  // a0 b0 c0 d0
    r[1] = __byte_perm(ab01, cd01, 0x7632);
    r[2] = __byte_perm(ab23, cd23, 0x5410);
    r[3] = __byte_perm(ab23, cd23, 0x7632);
}

extern "C" __global__ void __launch_bounds__(kThreads) ZYFA_KERNEL(
    const uint8_t* __restrict__ v, uint8_t* __restrict__ vt, int seqlen, int keys, long long v_stride_b,
    long long v_stride_s, long long v_stride_h) {
    __shared__ __align__(16) uint4 tile[kTileKeys * kChunks];
    const int head = blockIdx.y, batch = blockIdx.z, heads_k = gridDim.y;
    const long long first = static_cast<long long>(blockIdx.x) * kTileKeys;
    const uint8_t* src = v + batch * v_stride_b + head * v_stride_h;

    uint4 data[kLoads];  // all loads in flight before the first shared store
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
        const int i = threadIdx.x + j * kThreads, key = i / kChunks, chunk = i % kChunks;
        data[j] = make_uint4(0, 0, 0, 0);  // keys past the last are zeros
        if (first + key < seqlen) data[j] = *reinterpret_cast<const uint4*>(src + (first + key) * v_stride_s + 16 * chunk);
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
        const int i = threadIdx.x + j * kThreads;
        tile[swizzled(i / kChunks, i % kChunks)] = data[j];
    }
    __syncthreads();

    const int lane = threadIdx.x % 32, group = lane % kGroups;
    const int quad = kQuadsPerWarp * (threadIdx.x / 32) + lane / kGroups;  // dims 4 quad .. 4 quad + 3
    const long long column = first + group * kGroup;
    if (column >= keys) return;  // a group past the padded length: nothing to write
    const uint32_t* words_of = reinterpret_cast<const uint32_t*>(tile);
    uint32_t words[kGroup];  // words[p]: dims 4 quad .. 4 quad + 3 of the key at position p
#pragma unroll
    for (int p = 0; p < kGroup; ++p) {
        const int key = group * kGroup + 8 * ((p >> 1) & 1) + 2 * (p >> 2) + (p & 1);  // 4t + 2a + b <- 8a + 2t + b
        words[p] = words_of[4 * swizzled(key, quad / 4) + quad % 4];
    }
    uint32_t rows[4][4];  // rows[r][q]: positions 4q..4q+3 of dim 4 quad + r
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        uint32_t r[4];
        transpose4(words[4 * q], words[4 * q + 1], words[4 * q + 2], words[4 * q + 3], r);
#pragma unroll
        for (int j = 0; j < 4; ++j) rows[j][q] = r[j];
    }
    uint8_t* dst = vt + (static_cast<long long>(batch) * heads_k + head) * kDims * keys + column;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        *reinterpret_cast<uint4*>(dst + static_cast<long long>(4 * quad + r) * keys) =
            make_uint4(rows[r][0], rows[r][1], rows[r][2], rows[r][3]);
    }
}
