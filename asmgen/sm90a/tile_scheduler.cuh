// The tile walk over the persistent grid: one CTA per SM walks a host-built job table (zyfa.jobs.balanced_jobs),
// CTA w taking rows w, w + gridDim.x, ...; a row is a pair of causal query tiles of 128 rows, one tile, or nothing.
// The producer and both consumers walk the same rows in the same order, so they meet on the same tiles without
// talking to each other.
#pragma once

namespace zyfa {

// A pair of query tiles, one tile (tile_lo == tile_hi), or nothing (tile_lo < 0: a slot that pads a CTA's share of
// a balanced table).
struct Job {
  int batch, head, tile_lo, tile_hi;
  __device__ int num_tiles() const { return tile_lo < 0 ? 0 : tile_lo == tile_hi ? 1 : 2; }
  __device__ int tile(int i) const { return i == 0 ? tile_lo : tile_hi; }
};

__device__ __forceinline__ Job load_job(const int* jobs, int index) {
  const int4 j = reinterpret_cast<const int4*>(jobs)[index];
  return {j.x, j.y, j.z, j.w};
}

// Calls on_job(job) for each of this CTA's rows of the table, in order.
template <class OnJob>
__device__ __forceinline__ void for_each_job(const int* jobs, int num_jobs, OnJob&& on_job) {
  for (int index = blockIdx.x; index < num_jobs; index += gridDim.x) on_job(load_job(jobs, index));
}

// Calls on_tile(query tile) for each query tile of `job`, in order.
template <class OnTile>
__device__ __forceinline__ void for_each_tile(const Job& job, OnTile&& on_tile) {
  for (int i = 0; i < job.num_tiles(); ++i) on_tile(job.tile(i));
}

}  // namespace zyfa
