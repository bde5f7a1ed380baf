// Randomized store stress: 100,000 operations (40,000 under ThreadSanitizer)
// over groups of random sizes and placements, under tight budgets on all
// three tiers, from two threads with prefetches running behind them. A
// shadow copy of every chunk checks every byte each time it is fetched, and
// once more at the end.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "strata/engine.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr int kThreads = 2;
constexpr int kGroupsPerThread = 12;
// ThreadSanitizer makes each operation 5 to 15 times slower; it needs
// interleavings more than volume, so it runs 40,000 operations. GCC says
// so with __SANITIZE_THREAD__, Clang with __has_feature.
#if defined(__SANITIZE_THREAD__)
#define STRATA_STRESS_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STRATA_STRESS_UNDER_TSAN 1
#endif
#endif
#ifdef STRATA_STRESS_UNDER_TSAN
constexpr int kOpsPerThread = 20000;
#else
constexpr int kOpsPerThread = 50000;
#endif

struct Shadow {
  int id = -1;
  // Expected bytes per tensor view, in the order Fetch() lists them.
  std::vector<std::vector<unsigned char>> bytes;
};

// Homes on NVMe or the host; every fourth group keeps a role on the device.
GroupSpec RandomGroup(const std::string& name, std::mt19937_64& rng,
                      bool device_home) {
  GroupSpec spec;
  spec.name = name;
  const int tensors = 1 + static_cast<int>(rng() % 3);
  for (int t = 0; t < tensors; ++t) {
    const int64_t elements = 64 + static_cast<int64_t>(rng() % 3000);
    spec.tensors.push_back({"t" + std::to_string(t),
                            {elements},
                            rng() % 2 ? DType::kBFloat16 : DType::kFloat32,
                            RoleBit(Role::kCompute) | RoleBit(Role::kMaster)});
  }
  spec.use_default_placement = false;
  const Tier homes[] = {Tier::kNvme, Tier::kNvme, Tier::kHost};
  for (Tier& home : spec.placement.home) home = homes[rng() % 3];
  if (device_home) spec.placement.home[rng() % kNumRoles] = Tier::kDevice;
  return spec;
}

void Verify(const GroupView& view, const Shadow& shadow) {
  ASSERT_EQ(view.tensors.size(), shadow.bytes.size());
  for (size_t i = 0; i < view.tensors.size(); ++i) {
    ASSERT_EQ(view.tensors[i].bytes, shadow.bytes[i].size());
    ASSERT_EQ(std::memcmp(view.tensors[i].data, shadow.bytes[i].data(),
                          shadow.bytes[i].size()),
              0)
        << "group " << shadow.id << " tensor " << i << " on "
        << TierName(view.tier);
  }
}

// One thread's share: its own groups, at most one of them fetched at a
// time, so two threads never pin more than the budgets were sized for.
void Drive(Engine* engine, std::vector<Shadow>* shadows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int op = 0; op < kOpsPerThread; ++op) {
    Shadow& s = (*shadows)[rng() % shadows->size()];
    const unsigned kind = rng() % 10;
    if (kind == 0) {
      ASSERT_TRUE(
          engine->Prefetch(s.id, rng() % 2 ? Tier::kHost : Tier::kDevice).ok());
      continue;
    }
    if (kind == 1) {
      const Tier tier = rng() % 2 ? Tier::kHost : Tier::kDevice;
      ASSERT_TRUE(engine->Evict(s.id, tier).ok());
      continue;
    }
    const Tier tier = rng() % 3 ? Tier::kDevice : Tier::kHost;
    const bool write = rng() % 2;
    auto view = engine->Fetch(s.id, tier, {kAllRoles, write});
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    Verify(*view, s);
    if (write) {
      for (size_t i = 0; i < view->tensors.size(); ++i) {
        std::vector<unsigned char>& bytes = s.bytes[i];
        const size_t at = rng() % bytes.size();
        const size_t len = std::min<size_t>(bytes.size() - at, 1 + rng() % 512);
        testutil::FillRandom(bytes.data() + at, len, rng());
        std::memcpy(static_cast<char*>(view->tensors[i].data) + at,
                    bytes.data() + at, len);
      }
    }
    ASSERT_TRUE(view->pin.Release().ok());
  }
}

TEST(StoreStress, RandomOperationsUnderTightBudgetsKeepEveryByte) {
  testutil::ScratchDir dir;
  EngineOptions o;
  o.device = "host";
  o.device_budget = 320 * kKiB;
  o.host_budget = 1024 * kKiB;
  o.nvme_budget = 1024 * kKiB;
  o.swap_dir = dir.path();
  o.io_threads = 2;
  auto opened = Engine::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<Engine> engine = std::move(*opened);

  std::mt19937_64 rng(20261121);
  std::vector<std::vector<Shadow>> shadows(kThreads);
  int rejected = 0;
  for (int t = 0; t < kThreads; ++t) {
    while (static_cast<int>(shadows[t].size()) < kGroupsPerThread) {
      const std::string name = "g" + std::to_string(t) + "." +
                               std::to_string(shadows[t].size()) + "." +
                               std::to_string(rejected);
      const bool device_home = shadows[t].size() % 4 == 3;
      auto id = engine->RegisterGroup(RandomGroup(name, rng, device_home));
      if (!id.ok()) {
        // Placements that can never fit are refused at setup, as designed.
        ASSERT_EQ(id.status().code(), StatusCode::kResourceExhausted)
            << id.status().ToString();
        ASSERT_LT(++rejected, 1000);
        continue;
      }
      Shadow s;
      s.id = *id;
      auto view = engine->Fetch(s.id, Tier::kHost);
      ASSERT_TRUE(view.ok()) << view.status().ToString();
      for (const TensorView& tv : view->tensors) {
        s.bytes.emplace_back(tv.bytes, 0);
      }
      ASSERT_TRUE(view->pin.Release().ok());
      shadows[t].push_back(std::move(s));
    }
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back(Drive, engine.get(), &shadows[t], 1000 + t);
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(engine->Drain().ok());
  for (const std::vector<Shadow>& mine : shadows) {
    for (const Shadow& s : mine) {
      auto view = engine->Fetch(s.id, Tier::kHost);
      ASSERT_TRUE(view.ok()) << view.status().ToString();
      Verify(*view, s);
      ASSERT_TRUE(view->pin.Release().ok());
    }
  }
  const EngineStats stats = engine->stats();
  EXPECT_LE(stats.tiers[0].peak, o.device_budget);
  EXPECT_LE(stats.tiers[1].peak, o.host_budget);
  EXPECT_LE(stats.tiers[2].peak, o.nvme_budget);
  EXPECT_GT(stats.evictions, 1000u);
  EXPECT_GT(stats.writebacks, 100u);
  EXPECT_GT(stats.bytes[1][2], 0u);
  EXPECT_GT(stats.bytes[2][1], 0u);
}

}  // namespace
}  // namespace strata
