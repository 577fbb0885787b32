// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The routing rule of routing.h: its hash against SplitMix64's published
// outputs, and the rank of each dist type.
#include "cc/routing/routing.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

namespace dyn_emb {
namespace routing {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// route_hash(key) is SplitMix64's next() from state `key`, shifted right by
// one. From state 0 next() gives the generator's published first outputs
// (Vigna, splitmix64.c): 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4,
// 0x06c45d188009454f, i.e. states 0, kGolden and 2 kGolden; the other values
// are computed independently in Python from the definition.
TEST(RouteHash, IsSplitMix64ShiftedRightByOne) {
  const std::pair<uint64_t, uint64_t> kats[] = {
      {0, 0xe220a8397b1dcdafULL},           {kGolden, 0x6e789e6aa1b965f4ULL},
      {2 * kGolden, 0x06c45d188009454fULL}, {1, 0x910a2dec89025cc1ULL},
      {42, 0xbdd732262feb6e95ULL},          {~uint64_t{0}, 0xe4d971771b652c20ULL},
  };
  for (const auto& [state, next] : kats) {
    const int64_t h = route_hash(static_cast<int64_t>(state));
    EXPECT_GE(h, 0);
    EXPECT_EQ(static_cast<uint64_t>(h), next >> 1) << "state " << state;
  }
}

TEST(RouteKey, EachDistTypeRoutesByItsRule) {
  const auto kContinuous = static_cast<int64_t>(DistType::kContinuous);
  const auto kRoundRobin = static_cast<int64_t>(DistType::kRoundRobin);
  const auto kHash = static_cast<int64_t>(DistType::kHashRoundRobin);
  // continuous: key / block inside the declared rows, floor_mod outside.
  EXPECT_EQ(route_key(0, kContinuous, 10, 4), 0);
  EXPECT_EQ(route_key(39, kContinuous, 10, 4), 3);
  EXPECT_EQ(route_key(41, kContinuous, 10, 4), 1);
  EXPECT_EQ(route_key(-3, kContinuous, 10, 4), 1);
  // roundrobin: floor_mod, negative keys included.
  EXPECT_EQ(route_key(7, kRoundRobin, 0, 4), 3);
  EXPECT_EQ(route_key(-1, kRoundRobin, 0, 4), 3);
  // hash_roundrobin: the hash modulo the world size.
  EXPECT_EQ(route_key(42, kHash, 0, 5), route_hash(42) % 5);
}

}  // namespace
}  // namespace routing
}  // namespace dyn_emb
