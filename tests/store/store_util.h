// Helpers shared by the store tests.
#ifndef STRATA_TESTS_STORE_STORE_UTIL_H_
#define STRATA_TESTS_STORE_STORE_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "strata/engine.h"
#include "tests/testutil/testutil.h"

namespace strata::store_test {

inline constexpr uint64_t kKiB = 1024;

// One tensor "w" of `elements` bf16 elements with a compute copy and an
// fp32 master: 2 and 4 bytes per element, in two chunks.
inline GroupSpec Layer(const std::string& name, int64_t elements) {
  GroupSpec spec;
  spec.name = name;
  spec.tensors.push_back({"w",
                          {elements},
                          DType::kBFloat16,
                          RoleBit(Role::kCompute) | RoleBit(Role::kMaster)});
  return spec;
}

inline uint64_t Seed(uint64_t seed, size_t tensor) {
  return seed * 7919 + tensor;
}

// Writes seeded bytes into every tensor of a fetched view.
inline void Fill(const GroupView& view, uint64_t seed) {
  for (size_t i = 0; i < view.tensors.size(); ++i) {
    testutil::FillRandom(view.tensors[i].data, view.tensors[i].bytes,
                         Seed(seed, i));
  }
}

// Checks that every tensor holds what Fill(view, seed) wrote.
inline void Check(const GroupView& view, uint64_t seed) {
  for (size_t i = 0; i < view.tensors.size(); ++i) {
    const TensorView& t = view.tensors[i];
    std::vector<char> expect(t.bytes);
    testutil::FillRandom(expect.data(), t.bytes, Seed(seed, i));
    EXPECT_EQ(std::memcmp(expect.data(), t.data, t.bytes), 0)
        << "tensor " << t.name << " (" << RoleName(t.role) << ") on "
        << TierName(t.tier) << " differs";
  }
}

// The bytes of `roles` of groups [0, groups), tensor by tensor, once the
// engine's queued work has landed (Drain).
inline std::vector<std::vector<char>> GroupBytes(Engine& engine, int groups,
                                                 RoleMask roles) {
  std::vector<std::vector<char>> out;
  const Status drained = engine.Drain();
  EXPECT_TRUE(drained.ok()) << drained.ToString();
  for (int g = 0; g < groups; ++g) {
    auto view = engine.Fetch(g, Tier::kHost, {.roles = roles});
    EXPECT_TRUE(view.ok()) << view.status().message();
    if (!view.ok()) return out;
    for (const TensorView& t : view->tensors) {
      const char* p = static_cast<const char*>(t.data);
      out.emplace_back(p, p + t.bytes);
    }
    EXPECT_TRUE(view->pin.Release().ok());
  }
  return out;
}

}  // namespace strata::store_test

#endif  // STRATA_TESTS_STORE_STORE_UTIL_H_
