// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Tile-parallel probing of one bucket, for the CUDA backend's kernels.
//
// The find kernels give each key a tile of L lanes (4 by default, the fastest
// on an H200; DEMB_CUDA_FIND_LANES picks 2, 4, 8, 16 or 32 for timing
// variants). In tile_probe a lane reads 8 digests (one 8-byte word) per step,
// so with 16 lanes a 128-slot bucket is one coalesced 128-byte read;
// tile_probe_wide reads 16 bytes or more per lane. The answers are those of
// the sequential function the CPU backend runs (layout.h):
//   tile_probe == probe  (the only key match, or the lowest empty slot)
// The runs of insert and insert_and_evict have tiles of their own
// (tile_run.h, tile_lanes below).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "cc/common/cuda_launch.cuh"
#include "cc/table/layout.h"
#include "cc/table/operations.h"
#include "cc/table/scores.h"

namespace dyn_emb {
namespace table {
namespace cuda {

namespace cg = cooperative_groups;

template <int L, class Tile>
__device__ int64_t tile_probe(const Tile& g, const TableRef& t, const Home& h, int64_t key,
                              uint8_t digest, int64_t from = 0) {
  const int64_t lane_off = static_cast<int64_t>(g.thread_rank()) * 8;
  for (int64_t base = from - from % 8; base < h.width; base += L * 8) {
    const int64_t off = base + lane_off;
    int64_t hit = -1;
    if (off < h.width) {
      uint64_t m =
          match_bytes(*reinterpret_cast<const uint64_t*>(t.digests + h.start + off), digest);
      while (m) {
        const int64_t pos = off + (ctz64(m) >> 3);
        if (t.keys[h.start + pos] == key) {
          hit = pos;
          break;
        }
        m &= m - 1;
      }
    }
    const unsigned b = g.ballot(hit >= 0);
    if (b) return g.shfl(hit, __ffs(b) - 1);
  }
  return -1;
}

/// tile_probe from position 0 with 16-byte digest loads (the digests must
/// be 16-byte aligned): a lane reads max(1, 8 / L) of them per step, all
/// issued before any is looked at, so 2, 4 or 8 lanes cover a 128-slot bucket
/// in one step and one load latency. Same answer as tile_probe.
template <int L, class Tile>
__device__ int64_t tile_probe_wide(const Tile& g, const TableRef& t, const Home& h, int64_t key,
                                   uint8_t digest) {
  constexpr int kLoads = L >= 8 ? 1 : 8 / L;
  constexpr int64_t kLaneSpan = kLoads * 16;
  const int64_t lane_off = static_cast<int64_t>(g.thread_rank()) * kLaneSpan;
  for (int64_t base = 0; base < h.width; base += L * kLaneSpan) {
    uint64_t m[2 * kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int64_t off = base + lane_off + j * 16;
      if (off < h.width) {
        const ulonglong2 v = *reinterpret_cast<const ulonglong2*>(t.digests + h.start + off);
        m[2 * j] = match_bytes(v.x, digest);
        m[2 * j + 1] = match_bytes(v.y, digest);
      } else {
        m[2 * j] = m[2 * j + 1] = 0;
      }
    }
    int64_t hit = -1;
#pragma unroll
    for (int w = 0; w < 2 * kLoads; ++w) {
      while (m[w] && hit < 0) {
        const int64_t pos = base + lane_off + w * 8 + (ctz64(m[w]) >> 3);
        if (t.keys[h.start + pos] == key) hit = pos;
        m[w] &= m[w] - 1;
      }
    }
    const unsigned b = g.ballot(hit >= 0);
    if (b) return g.shfl(hit, __ffs(b) - 1);
  }
  return -1;
}

/// The probe of the find kernels: tile_probe_wide when Wide, else tile_probe.
template <int L, bool Wide, class Tile>
__device__ int64_t tile_find(const Tile& g, const TableRef& t, const Home& h, int64_t key,
                             uint8_t digest) {
  if constexpr (Wide) {
    return tile_probe_wide<L>(g, t, h, key, digest);
  } else {
    return tile_probe<L>(g, t, h, key, digest);
  }
}

template <int L>
__device__ __forceinline__ int64_t tile_index() {
  return global_thread() / L;
}

template <int L>
unsigned tile_grid_for(int64_t n, int block = kBlock) {
  return grid_for(n * L, block);
}
/// Lanes per key of find, from DEMB_CUDA_FIND_LANES (2, 4, 8, 16 or 32;
/// default 4).
int find_lanes();

/// Lanes per run of insert and insert_and_evict, from DEMB_CUDA_RUN_LANES
/// (read once): 4, 8, 16 or 32 lanes of a tile (tile_run.h), 1 for one thread per
/// run with the victim hints (the earlier kernel); unset or anything else:
/// one thread per run for a call of fewer than kTileMinKeysPerBucket keys a
/// bucket on average (runs of a key or two, where a tile's lanes only wait),
/// else 32 lanes for tables whose buckets are wider than 256 slots on average,
/// 8 otherwise. Every choice gives the same slots (the parity tests run each).
/// erase and place run one thread per run.
inline constexpr int64_t kTileMinKeysPerBucket = 4;
int tile_lanes(const TableRef& t, int64_t n, int64_t total_buckets);

/// Calls f(std::integral_constant<int, L>{}) for L == lanes, L one of Ls,
/// else for L == 16: the one switch from a lane count to a kernel instance.
template <int... Ls, class F>
void with_lanes(int lanes, const F& f) {
  const bool found = ((lanes == Ls ? (f(std::integral_constant<int, Ls>{}), true) : false) || ...);
  if (!found) f(std::integral_constant<int, 16>{});
}

/// Calls f(std::integral_constant<int, L>{}, std::bool_constant<Wide>{}) for
/// the find kernels' tiles: L == find_lanes(), Wide (tile_probe_wide) for
/// fewer than 16 lanes when the digests are 16-byte aligned; 16 narrow lanes
/// when they are not.
template <class F>
void with_find_lanes(const TableRef& t, const F& f) {
  const bool aligned = reinterpret_cast<uintptr_t>(t.digests) % 16 == 0;
  with_lanes<2, 4, 8, 16, 32>(find_lanes(), [&](auto lanes) {
    constexpr int L = decltype(lanes)::value;
    if constexpr (L < 16) {
      if (aligned) {
        f(lanes, std::true_type{});
        return;
      }
      f(std::integral_constant<int, 16>{}, std::false_type{});
    } else {
      f(lanes, std::false_type{});
    }
  });
}

}  // namespace cuda
}  // namespace table
}  // namespace dyn_emb
