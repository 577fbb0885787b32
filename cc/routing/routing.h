// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Row-wise routing of a sharded dynamic table: which rank owns a key. One
// definition for the CPU and CUDA kernels of the `route_keys` op, and the rule
// incremental dump / replay recompute ownership with.
//
// Keys stay raw global ids on their rank (nothing is divided or re-indexed), so
// the rank is a function of the key alone:
//
//   continuous       key // block for 0 <= key < block * world_size (TorchRec's
//                    block bucketization, block = ceil(num_embeddings /
//                    world_size)); any other key (negative, or past the
//                    declared rows): floor_mod(key, world_size).
//   roundrobin       floor_mod(key, world_size).
//   hash_roundrobin  route_hash(key) % world_size.
//
// route_hash is deliberately not the table's bucket hash (bucket_hash in
// cc/table/hash.h): with the same hash, the keys one rank owns would
// share residues of the bucket hash and crowd a subset of its buckets.
#pragma once

#include <cstdint>

#include "cc/common/host_device.h"

namespace dyn_emb {
namespace routing {

/// Values of DistType, in the order of dynamicemb_config.DIST_TYPES.
enum class DistType : int64_t {
  kContinuous = 0,
  kRoundRobin = 1,
  kHashRoundRobin = 2,
};

/// SplitMix64's finalizer (Stafford's variant 13) after a golden-ratio offset,
/// shifted right by one so that the result is a non-negative int64: then
/// `route_hash(key) % world_size` means the same in C++ and in torch.
DEMB_HD int64_t route_hash(int64_t key) {
  uint64_t x = static_cast<uint64_t>(key) + 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<int64_t>(x >> 1);
}

/// a mod m in [0, m) for m > 0 (torch.remainder), negative a included.
DEMB_HD int64_t floor_mod(int64_t a, int64_t m) {
  const int64_t r = a % m;
  return r < 0 ? r + m : r;
}

/// The rank in [0, world_size) that owns `key`. `block` is used by
/// kContinuous only and must be positive there; world_size > 0.
DEMB_HD int64_t route_key(int64_t key, int64_t dist_type, int64_t block, int64_t world_size) {
  if (dist_type == static_cast<int64_t>(DistType::kHashRoundRobin)) {
    return route_hash(key) % world_size;
  }
  if (dist_type == static_cast<int64_t>(DistType::kContinuous) && key >= 0 &&
      key / block < world_size) {
    return key / block;
  }
  return floor_mod(key, world_size);
}

}  // namespace routing
}  // namespace dyn_emb
