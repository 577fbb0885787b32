// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The CUDA backend's runs of insert and insert_and_evict: a tile of 4, 8, 16
// or 32 lanes per bucket run (tile_run.h), the tile's collectives those of a
// cooperative-groups tile.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

#include <type_traits>

#include "cc/common/cuda_launch.cuh"
#include "cc/common/host_device.h"
#include "cc/table/layout.h"
#include "cc/table/table_cuda_shared.cuh"
#include "cc/table/tile_probe.cuh"
#include "cc/table/tile_run.h"

namespace dyn_emb {
namespace table {
namespace cuda {

namespace {

// The Tile of tile_run.h on a cooperative-groups tile of T lanes.
template <int T>
struct DeviceTile {
  cg::thread_block_tile<T> g;
  __device__ int lane() const { return static_cast<int>(g.thread_rank()); }
  __device__ void sync() const { g.sync(); }
  __device__ unsigned ballot(bool p) const { return g.ballot(p); }
  template <class V>
  __device__ V shfl(V v, int src) const {
    if constexpr (std::is_same_v<V, bool>) {
      return g.shfl(static_cast<int>(v), src) != 0;
    } else {
      return g.shfl(v, src);
    }
  }
  template <class V>
  __device__ V shfl_xor(V v, int mask) const {
    return g.shfl_xor(v, mask);
  }
  template <class V>
  __device__ unsigned match_any(V v) const {
    return g.match_any(v);
  }
  __device__ unsigned reduce_min(unsigned v) const {
    return cg::reduce(g, v, cg::less<unsigned>());
  }
};

// Tiles of 32 lanes serve buckets wider than 256 slots on average (tile_lanes),
// whose runs hold dozens of keys: such a tile looks at 32 sorted positions (its
// lanes write the results of those without a bucket and find which start a
// run, and it takes those one after another), so that a run costs one tile's
// start and not one per key; and its block is that one warp, so that a long
// run holds no other tile's block and the runs on every SM do not wait for
// block slots (16 blocks of a warp per SM, up to 128 registers). Narrower
// tiles, whose runs hold a few keys each, keep a tile per sorted position in
// blocks of kBlock (three per SM with one victim word, two with three).
template <int T>
constexpr int64_t kTilePositions = T == kWarp ? T : 1;
template <int T>
constexpr int kTileBlock = T == kWarp ? kWarp : kBlock;
template <int T, int NK>
constexpr int kTileBlocksPerSm = T == kWarp ? 16 : (NK == 1 ? 3 : 2);

// The tile's runs (tile_run_at; the runs of buckets wider than kTileMaxWidth
// are run_kernel's). NK: the words of the victim order (tile_run.h).
template <int T, int NK>
__global__ void __launch_bounds__(kTileBlock<T>, kTileBlocksPerSm<T, NK>)
    tile_run_kernel(TableRef t, RunArgs r, SortedKeys sk, int64_t n, int64_t total_buckets,
                    bool records) {
  constexpr int64_t P = kTilePositions<T>;
  __shared__ BlockCounters counters;
  const DeviceTile<T> g{cg::tiled_partition<T>(cg::this_thread_block())};
  const int64_t q0 = tile_index<T>() * P;
  const int64_t p0 = blockIdx.x * static_cast<int64_t>(kTileBlock<T> / T) * P;
  counters.start([&] { return p0 < n && sk[p0] != total_buckets ? r.table_ids[r.order[p0]] : -1; });
  int64_t table = -1;
  RunDeltas d;
  if constexpr (P == 1) {
    if (q0 < n && tile_run_at<T, NK>(g, t, r, sk, q0, n, total_buckets, records, &table, &d) &&
        g.lane() == 0) {
      counters.add(t, table, d);
    }
  } else {
    // Each lane writes its own entry's results when it has no bucket; the
    // tile visits the run starts.
    const int64_t q = q0 + g.lane();
    bool visit = false;
    if (g.lane() < P && q < n) {
      const int64_t k = sk[q];
      if (k == total_buckets) {
        tile_invalid(r, r.order[q]);
      } else {
        visit = q == 0 || sk[q - 1] != k;
      }
    }
    for (unsigned m = g.ballot(visit); m; m &= m - 1) {
      if (tile_run_at<T, NK>(g, t, r, sk, q0 + ctz32(m), n, total_buckets, records, &table, &d) &&
          g.lane() == 0) {
        counters.add(t, table, d);
      }
    }
  }
  counters.finish(t);
}

}  // namespace

void tile_runs(int lanes, const TableRef& t, const RunArgs& r, SortedKeys sorted, int64_t n,
               int64_t total_buckets, bool records, cudaStream_t stream) {
  const bool words = t.num_scores > 1 || r.victim_scores != nullptr;
  with_lanes<4, 8, 16, 32>(lanes, [&](auto lanes_c) {
    constexpr int T = decltype(lanes_c)::value;
    constexpr int B = kTileBlock<T>;
    const unsigned grid = tile_grid_for<T>((n + kTilePositions<T> - 1) / kTilePositions<T>, B);
    if (words) {
      tile_run_kernel<T, kVictimWords>
          <<<grid, B, 0, stream>>>(t, r, sorted, n, total_buckets, records);
    } else {
      tile_run_kernel<T, 1><<<grid, B, 0, stream>>>(t, r, sorted, n, total_buckets, records);
    }
  });
  check_launch("tile runs");
}

}  // namespace cuda
}  // namespace table
}  // namespace dyn_emb
