// Randomized store stress: 100,000 operations (40,000 under ThreadSanitizer)
// over groups of random sizes and placements, under tight budgets on all
// three tiers, from two threads with prefetches running behind them. A
// shadow copy of every chunk checks every byte each time it is fetched, and
// once more at the end; the fetch counters must equal the chunks fetched.
// The second test holds read views across writes of
// their groups at other tiers, in one thread and in three. A watchdog
// fails either when no operation starts for a minute, printing each
// thread's last operations (issue #30: such sequences hung).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/enum_array.h"
#include "strata/engine.h"
#include "tests/testutil/testutil.h"
#include "tests/testutil/watchdog.h"

namespace strata {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr int kThreads = 2;
constexpr int kGroupsPerThread = 12;
// The sanitizers make each operation 3 to 15 times slower; they need
// interleavings more than volume, so they run 40,000 operations. GCC says
// so with __SANITIZE_THREAD__ / __SANITIZE_ADDRESS__, Clang with
// __has_feature.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define STRATA_STRESS_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define STRATA_STRESS_UNDER_SANITIZER 1
#endif
#endif
#ifdef STRATA_STRESS_UNDER_SANITIZER
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

// The host-emulated device and these budgets, swapping in `dir`.
EngineOptions Options(const testutil::ScratchDir& dir, uint64_t device,
                      uint64_t host, uint64_t nvme) {
  EngineOptions o;
  o.device = "host";
  o.device_budget = device;
  o.host_budget = host;
  o.nvme_budget = nvme;
  o.swap_dir = dir.path();
  o.io_threads = 2;
  return o;
}

// Writes random runs of bytes through a write view and into its shadow.
void WriteRandom(const GroupView& view, Shadow& shadow, std::mt19937_64& rng) {
  for (size_t i = 0; i < view.tensors.size(); ++i) {
    std::vector<unsigned char>& bytes = shadow.bytes[i];
    const size_t from = rng() % bytes.size();
    const size_t len = std::min<size_t>(bytes.size() - from, 1 + rng() % 512);
    testutil::FillRandom(bytes.data() + from, len, rng());
    std::memcpy(static_cast<char*>(view.tensors[i].data) + from,
                bytes.data() + from, len);
  }
}

// For the watchdog's log: "fetch g3 on device".
std::string OpName(const char* what, int group, Tier tier) {
  return std::string(what) + " g" + std::to_string(group) + " on " +
         std::string(TierName(tier));
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

// EngineStats counts each chunk of each recorded fetch once (issue #30: a
// fetch placed again after eviction counted its chunks twice).
void ExpectCountersModelFetches(const EngineStats& stats,
                                const std::vector<uint64_t>& chunks) {
  uint64_t fetched = 0;
  for (uint64_t c : chunks) fetched += c;
  EXPECT_EQ(stats.fetches, fetched);
  EXPECT_LE(stats.hits, stats.fetches);
  EXPECT_LE(stats.prefetch_hits, stats.hits);
  EXPECT_LE(stats.late_prefetches, stats.fetches - stats.hits);
}

// One thread's share: its own groups, at most one of them fetched at a
// time, so two threads never pin more than the budgets were sized for.
// `chunks` counts the chunks its fetches asked for (2 a group).
void Drive(Engine* engine, std::vector<Shadow>* shadows, uint64_t seed,
           int thread, testutil::Watchdog* watchdog, uint64_t* chunks) {
  std::mt19937_64 rng(seed);
  for (int op = 0; op < kOpsPerThread; ++op) {
    Shadow& s = (*shadows)[rng() % shadows->size()];
    const unsigned kind = rng() % 10;
    const Tier tier = rng() % 2 ? Tier::kHost : Tier::kDevice;
    if (kind == 0) {
      watchdog->Note(thread, OpName("prefetch", s.id, tier));
      ASSERT_TRUE(engine->Prefetch(s.id, tier).ok());
      continue;
    }
    if (kind == 1) {
      watchdog->Note(thread, OpName("evict", s.id, tier));
      ASSERT_TRUE(engine->Evict(s.id, tier).ok());
      continue;
    }
    const Tier at = rng() % 3 ? Tier::kDevice : Tier::kHost;
    const bool write = rng() % 2;
    watchdog->Note(thread, OpName(write ? "write fetch" : "fetch", s.id, at));
    *chunks += 2;
    auto view = engine->Fetch(s.id, at, {kAllRoles, write});
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    Verify(*view, s);
    if (write) WriteRandom(*view, s, rng);
    ASSERT_TRUE(view->pin.Release().ok());
  }
}

TEST(StoreStress, RandomOperationsUnderTightBudgetsKeepEveryByte) {
  testutil::ScratchDir dir;
  const EngineOptions o = Options(dir, 320 * kKiB, 1024 * kKiB, 1024 * kKiB);
  auto opened = Engine::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<Engine> engine = std::move(*opened);

  std::mt19937_64 rng(20261121);
  std::vector<std::vector<Shadow>> shadows(kThreads);
  std::vector<uint64_t> chunks(kThreads, 0);  // fetched, by each thread
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
      chunks[0] += 2;
      auto view = engine->Fetch(s.id, Tier::kHost);
      ASSERT_TRUE(view.ok()) << view.status().ToString();
      for (const TensorView& tv : view->tensors) {
        s.bytes.emplace_back(tv.bytes, 0);
      }
      ASSERT_TRUE(view->pin.Release().ok());
      shadows[t].push_back(std::move(s));
    }
  }
  testutil::Watchdog watchdog(kThreads, std::chrono::seconds(60));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back(Drive, engine.get(), &shadows[t], 1000 + t, t,
                         &watchdog, &chunks[t]);
  }
  for (std::thread& t : threads) t.join();
  watchdog.Note(0, "drain");
  ASSERT_TRUE(engine->Drain().ok());
  for (const std::vector<Shadow>& mine : shadows) {
    for (const Shadow& s : mine) {
      watchdog.Note(0, OpName("fetch (final check)", s.id, Tier::kHost));
      chunks[0] += 2;
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
  ExpectCountersModelFetches(stats, chunks);
}

// The held-views stress: groups shared by every thread, each write made
// under the group's lock (two writers of one group are the caller's race),
// reads without it; each thread keeps up to kHeld read views across its
// other operations and releases them in random order. A read view keeps
// its bytes while the group is written at another tier; the budgets hold
// every view at once, so every fetch must succeed.
constexpr int kSharedGroups = 16;
constexpr int kHeld = 2;
#ifdef STRATA_STRESS_UNDER_TSAN
constexpr int kHeldOps = 3000;
#else
constexpr int kHeldOps = 12000;
#endif

struct SharedGroup {
  std::mutex mu;
  Shadow shadow;               // guarded by mu
  TierArray<uint64_t> writes;  // write fetches at each tier, guarded by mu
};

struct HeldView {
  SharedGroup* group = nullptr;
  GroupView view;
  std::vector<std::vector<unsigned char>> bytes;  // when fetched
  uint64_t writes_here = 0;  // writes at the view's tier then
};

// A read view, kept: its bytes must be the shadow's now.
HeldView TakeView(Engine* engine, SharedGroup& g, Tier tier) {
  HeldView held;
  std::lock_guard<std::mutex> lock(g.mu);
  auto view = engine->Fetch(g.shadow.id, tier);
  EXPECT_TRUE(view.ok()) << view.status().ToString();
  if (!view.ok()) return held;
  Verify(*view, g.shadow);
  held.group = &g;
  held.view = std::move(*view);
  held.bytes = g.shadow.bytes;
  held.writes_here = g.writes[tier];
  return held;
}

// Unless its group was written at the same tier since (then the view may
// share that memory), the view still holds the bytes it was given.
void ReleaseView(HeldView& held) {
  std::lock_guard<std::mutex> lock(held.group->mu);
  if (held.group->writes[held.view.tier] == held.writes_here) {
    Verify(held.view, Shadow{held.group->shadow.id, held.bytes});
  }
  EXPECT_TRUE(held.view.pin.Release().ok());
}

void WriteGroup(Engine* engine, SharedGroup& g, Tier tier, uint64_t seed) {
  std::lock_guard<std::mutex> lock(g.mu);
  auto view = engine->Fetch(g.shadow.id, tier, {kAllRoles, true});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Verify(*view, g.shadow);
  std::mt19937_64 rng(seed);
  WriteRandom(*view, g.shadow, rng);
  ++g.writes[tier];
  ASSERT_TRUE(view->pin.Release().ok());
}

void DriveHeld(Engine* engine, std::vector<SharedGroup>* groups, uint64_t seed,
               int thread, testutil::Watchdog* watchdog, uint64_t* chunks) {
  std::mt19937_64 rng(seed);
  std::vector<HeldView> held;
  for (int op = 0; op < kHeldOps; ++op) {
    SharedGroup& g = (*groups)[rng() % groups->size()];
    const int id = g.shadow.id;
    const Tier tier = rng() % 2 ? Tier::kHost : Tier::kDevice;
    const unsigned kind = rng() % 10;
    if (kind == 0) {
      watchdog->Note(thread, OpName("prefetch", id, tier));
      ASSERT_TRUE(engine->Prefetch(id, tier).ok());
    } else if (kind == 1) {
      watchdog->Note(thread, OpName("evict", id, tier));
      const Status evicted = engine->Evict(id, tier);
      ASSERT_TRUE(evicted.ok() ||
                  evicted.message().find("is fetched on") != std::string::npos)
          << evicted.ToString();
    } else if (kind <= 4 && held.size() < kHeld) {
      watchdog->Note(thread, OpName("fetch and hold", id, tier));
      *chunks += 2;
      held.push_back(TakeView(engine, g, tier));
      ASSERT_NE(held.back().group, nullptr);
    } else if (kind <= 5 && !held.empty()) {
      const size_t which = rng() % held.size();
      watchdog->Note(thread,
                     OpName("release held view of", held[which].view.group,
                            held[which].view.tier));
      ReleaseView(held[which]);
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(which));
    } else {
      watchdog->Note(thread, OpName("write fetch", id, tier));
      *chunks += 2;
      WriteGroup(engine, g, tier, rng());
    }
    if (testing::Test::HasFatalFailure()) return;
  }
  for (HeldView& h : held) ReleaseView(h);
}

class HeldViewsStress
    : public testing::TestWithParam<std::tuple<int, uint64_t>> {};

TEST_P(HeldViewsStress, ReadViewsKeepTheirBytesAndNothingWaitsForThem) {
  const auto [threads, seed] = GetParam();
  testutil::ScratchDir dir;
  const EngineOptions o = Options(dir, 1024 * kKiB, 2048 * kKiB, 4096 * kKiB);
  auto opened = Engine::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<Engine> engine = std::move(*opened);
  std::mt19937_64 rng(seed);
  std::vector<SharedGroup> groups(kSharedGroups);
  std::vector<uint64_t> chunks(threads, 0);
  for (int i = 0; i < kSharedGroups; ++i) {
    auto id =
        engine->RegisterGroup(RandomGroup("s" + std::to_string(i), rng, false));
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    groups[i].shadow.id = *id;
    chunks[0] += 2;
    auto view = engine->Fetch(*id, Tier::kHost);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    for (const TensorView& tv : view->tensors) {
      groups[i].shadow.bytes.emplace_back(tv.bytes, 0);
    }
  }
  testutil::Watchdog watchdog(threads, std::chrono::seconds(60));
  std::vector<std::thread> drivers;
  for (int t = 0; t < threads; ++t) {
    drivers.emplace_back(DriveHeld, engine.get(), &groups, seed * 100 + t, t,
                         &watchdog, &chunks[t]);
  }
  for (std::thread& t : drivers) t.join();
  for (SharedGroup& g : groups) {
    watchdog.Note(0, OpName("fetch (final check)", g.shadow.id, Tier::kHost));
    chunks[0] += 2;
    auto view = engine->Fetch(g.shadow.id, Tier::kHost);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    Verify(*view, g.shadow);
  }
  const EngineStats stats = engine->stats();
  EXPECT_LE(stats.tiers[0].peak, o.device_budget);
  EXPECT_LE(stats.tiers[1].peak, o.host_budget);
  ExpectCountersModelFetches(stats, chunks);
}

INSTANTIATE_TEST_SUITE_P(
    ThreadsAndSeeds, HeldViewsStress,
    testing::Combine(testing::Values(1, 3),
                     testing::Values(uint64_t{11}, uint64_t{12}, uint64_t{13})),
    [](const testing::TestParamInfo<std::tuple<int, uint64_t>>& info) {
      return std::to_string(std::get<0>(info.param)) + "Threads_Seed" +
             std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace strata
