// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The scored hash table, one semantic definition for the CPU and CUDA backends
// (host-device inline code, no torch): hashing and digests.
//
// # Hashing
//
//   h = bucket_hash(key)                    (murmur3's 64-bit finalizer, fmix64)
//   home bucket = (h % capacity) / W        a key lives only in its home bucket
//   digest      = (h >> 32) & 0xff          compared before the key itself
#pragma once

#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/table/types.h"

namespace dyn_emb {
namespace table {

/// murmur3's 64-bit finalizer: a bijection that spreads every input bit.
DEMB_HD uint64_t bucket_hash(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

DEMB_HD uint8_t digest_of_hash(uint64_t h) { return static_cast<uint8_t>(h >> 32); }

/// Digest stored in a free slot.
DEMB_HD uint8_t empty_digest() {
  return digest_of_hash(bucket_hash(static_cast<uint64_t>(kEmptyKey)));
}

DEMB_HD bool is_reserved_key(int64_t key) { return key < kFirstValidKey; }

/// One bit (0x80) set in each byte of `word` that may equal `d`. A byte above
/// a true match can be flagged too; callers confirm with the key.
DEMB_HD uint64_t match_bytes(uint64_t word, uint8_t d) {
  const uint64_t x = word ^ (0x0101010101010101ULL * d);
  return (x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL;
}

}  // namespace table
}  // namespace dyn_emb
