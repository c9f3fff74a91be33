// A kernel that reports what it received, for checking the loader on a real NVIDIA GPU (sm_90a).
// Its parameters cover every argument type, in an order where nvcc's placement of the tensor map differs from
// natural alignment. Each block writes one record of RECORD_WORDS 64-bit words.
#include <cuda.h>

constexpr int RECORD_WORDS = 24;
constexpr int MAP_WORDS = 16;

extern "C" __global__ void loader_probe(unsigned long long* out, int n, float scale, long long big,
                                        const __grid_constant__ CUtensorMap map, unsigned flag) {
    extern __shared__ unsigned char dynamic_shared[];
    unsigned dynamic_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
    if (threadIdx.x == 0 && dynamic_bytes > 0) dynamic_shared[dynamic_bytes - 1] = 1;  // the last byte is usable
    __syncthreads();
    if (threadIdx.x != 0) return;
    unsigned long long* record = out + (blockIdx.y * gridDim.x + blockIdx.x) * RECORD_WORDS;
    record[0] = blockIdx.x;
    record[1] = blockIdx.y;
    record[2] = blockDim.x;
    record[3] = static_cast<unsigned long long>(n);
    record[4] = __float_as_uint(scale);
    record[5] = static_cast<unsigned long long>(big);
    record[6] = flag;
    record[7] = dynamic_bytes + (dynamic_bytes > 0 ? dynamic_shared[dynamic_bytes - 1] : 0);
    const unsigned long long* words = reinterpret_cast<const unsigned long long*>(&map);
    for (int i = 0; i < MAP_WORDS; ++i) record[8 + i] = words[i];
}
