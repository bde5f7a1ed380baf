// The tiered store through the public C++ API, on the host-emulated device.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <stop_token>
#include <thread>
#include <vector>

#include "src/store/engine_internal.h"
#include "strata/engine.h"
#include "tests/store/store_util.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

using store_test::Check;
using store_test::Fill;
using store_test::kKiB;
using store_test::Layer;

class StoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> Open(uint64_t device, uint64_t host, uint64_t nvme,
                               Tier home = Tier::kNvme,
                               aio::FaultInjector* injector = nullptr) {
    EngineOptions o;
    o.device = "host";
    o.device_budget = device;
    o.host_budget = host;
    o.nvme_budget = nvme;
    o.swap_dir = nvme > 0 ? dir_.path() : "";
    o.placement.home.fill(home);
    auto engine = internal::EngineAccess::Open(o, {.fault_injector = injector});
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  testutil::ScratchDir dir_;
};

// What engine.h and strata.h say of info(), Explain() and shapes, held to
// the code (issue #17 found them disagreeing).
TEST_F(StoreTest, InfoExplainAndShapesAreAsTheHeadersSay) {
  auto engine = Open(256 * kKiB, 512 * kKiB, 0, Tier::kHost);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->info().device, "host");
  EXPECT_EQ(engine->info().device_name, "host-emulated");
  EXPECT_EQ(engine->Explain().rfind("no trace yet", 0), 0u)
      << engine->Explain();
  GroupSpec empty = Layer("empty", 10);
  empty.tensors[0].shape = {4, 0};
  auto refused = engine->RegisterGroup(empty);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("empty"), std::string::npos)
      << refused.status().message();
}

TEST_F(StoreTest, NewChunksReadAsZeros) {
  auto engine = Open(256 * kKiB, 512 * kKiB, 1024 * kKiB);
  ASSERT_NE(engine, nullptr);
  const int g = *engine->RegisterGroup(Layer("layer.0", 10000));
  for (Tier tier : {Tier::kHost, Tier::kDevice}) {
    auto view = engine->Fetch(g, tier);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    for (const TensorView& t : view->tensors) {
      const auto* bytes = static_cast<const unsigned char*>(t.data);
      for (uint64_t i = 0; i < t.bytes; ++i) ASSERT_EQ(bytes[i], 0);
    }
    ASSERT_TRUE(view->pin.Release().ok());
  }
}

// The same bytes survive every path: device -> host -> NVMe -> host ->
// device, and host -> NVMe -> device.
TEST_F(StoreTest, CrossTierRoundTrip) {
  auto engine = Open(256 * kKiB, 512 * kKiB, 1024 * kKiB);
  ASSERT_NE(engine, nullptr);
  const int g = *engine->RegisterGroup(Layer("layer.0", 20000));
  auto view = engine->Fetch(g, Tier::kDevice, {kAllRoles, true});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Fill(*view, 1);
  ASSERT_TRUE(view->pin.Release().ok());
  ASSERT_TRUE(engine->Evict(g, Tier::kDevice).ok());  // device -> host
  ASSERT_TRUE(engine->Evict(g, Tier::kHost).ok());    // host -> NVMe
  EngineStats s = engine->stats();
  EXPECT_GT(s.bytes[0][1], 0u);
  EXPECT_GT(s.bytes[1][2], 0u);
  view = engine->Fetch(g, Tier::kHost);  // NVMe -> host
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Check(*view, 1);
  ASSERT_TRUE(view->pin.Release().ok());
  view = engine->Fetch(g, Tier::kDevice);  // host -> device
  ASSERT_TRUE(view.ok());
  Check(*view, 1);
  ASSERT_TRUE(view->pin.Release().ok());
  // Written on the host, dropped to NVMe, read straight up to the device.
  view = engine->Fetch(g, Tier::kHost, {kAllRoles, true});
  ASSERT_TRUE(view.ok());
  Fill(*view, 2);
  ASSERT_TRUE(view->pin.Release().ok());
  ASSERT_TRUE(engine->Evict(g, Tier::kDevice).ok());
  ASSERT_TRUE(engine->Evict(g, Tier::kHost).ok());
  view = engine->Fetch(g, Tier::kDevice);
  ASSERT_TRUE(view.ok());
  Check(*view, 2);
  ASSERT_TRUE(view->pin.Release().ok());
  s = engine->stats();
  EXPECT_GT(s.bytes[2][1], 0u);
  EXPECT_GT(s.bytes[1][0], 0u);
}

// EngineStats::role_bytes puts each byte on the role of the chunk that
// moved: a master-only round trip through NVMe moves the master's bytes
// and nothing of the compute copy's, then a compute-only fetch to the
// device moves the compute copy's only. The roles sum to `bytes`.
TEST_F(StoreTest, RoleBytesCountEachRoleApart) {
  auto engine = Open(256 * kKiB, 512 * kKiB, 1024 * kKiB);
  ASSERT_NE(engine, nullptr);
  const int g = *engine->RegisterGroup(Layer("layer.0", 16 * 1024));
  const uint64_t compute = 32 * kKiB, master = 64 * kKiB;  // bf16, fp32
  const int kDev = 0, kHost = 1, kNvme = 2;
  const int kC = static_cast<int>(Role::kCompute);
  const int kM = static_cast<int>(Role::kMaster);
  EngineStats::TierBytes want_c = {}, want_m = {};
  auto expect = [&](const char* after) {
    const EngineStats s = engine->stats();
    EXPECT_EQ(s.role_bytes[kC], want_c) << "compute, after " << after;
    EXPECT_EQ(s.role_bytes[kM], want_m) << "master, after " << after;
    for (int r = 0; r < kNumRoles; ++r) {
      if (r == kC || r == kM) continue;
      EXPECT_EQ(s.role_bytes[r], EngineStats::TierBytes{}) << "role " << r;
    }
    for (int a = 0; a < kNumTiers; ++a) {
      for (int b = 0; b < kNumTiers; ++b) {
        EXPECT_EQ(s.bytes[a][b], want_c[a][b] + want_m[a][b]) << after;
      }
    }
  };
  auto view = engine->Fetch(g, Tier::kHost, {RoleBit(Role::kMaster), true});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Fill(*view, 1);
  ASSERT_TRUE(view->pin.Release().ok());
  ASSERT_TRUE(engine->Evict(g, Tier::kHost).ok());  // master: host -> NVMe
  want_m[kHost][kNvme] = master;
  expect("the master's write-down");
  view = engine->Fetch(g, Tier::kHost, {RoleBit(Role::kMaster)});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Check(*view, 1);
  ASSERT_TRUE(view->pin.Release().ok());
  want_m[kNvme][kHost] = master;
  expect("the master's read");
  view = engine->Fetch(g, Tier::kDevice, {RoleBit(Role::kCompute), true});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Fill(*view, 2);
  ASSERT_TRUE(view->pin.Release().ok());
  ASSERT_TRUE(engine->Evict(g, Tier::kDevice).ok());  // compute: to the host
  ASSERT_TRUE(engine->Evict(g, Tier::kHost).ok());    // ... and to NVMe
  want_c[kDev][kHost] = want_c[kHost][kNvme] = compute;
  expect("the compute copy's write-down");
  view = engine->Fetch(g, Tier::kDevice, {RoleBit(Role::kCompute)});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Check(*view, 2);
  ASSERT_TRUE(view->pin.Release().ok());
  want_c[kNvme][kHost] = want_c[kHost][kDev] = compute;
  expect("the compute copy's read to the device");
}

// A prefetch pins nothing, so it used to make room for a group's master by
// evicting the compute copy it had just read for the same group: the
// bytes came from NVMe twice. Now it gives up instead (an abandoned
// prefetch, not an error) and what it read stays.
TEST_F(StoreTest, APrefetchKeepsWhatItReadOfItsGroup) {
  // Room for one group (32 KiB compute, 64 KiB master) and a third more.
  auto engine = Open(256 * kKiB, 160 * kKiB, 1024 * kKiB);
  ASSERT_NE(engine, nullptr);
  const int a = *engine->RegisterGroup(Layer("layer.0", 16 * 1024));
  const int b = *engine->RegisterGroup(Layer("layer.1", 16 * 1024));
  for (int g : {a, b}) {
    auto view = engine->Fetch(g, Tier::kHost, {kAllRoles, true});
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    Fill(*view, g);
    ASSERT_TRUE(view->pin.Release().ok());
    ASSERT_TRUE(engine->Evict(g, Tier::kHost).ok());
  }
  auto held = engine->Fetch(b, Tier::kHost);  // 96 KiB pinned
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  const EngineStats before = engine->stats();
  ASSERT_TRUE(engine->Prefetch(a, Tier::kHost).ok());
  ASSERT_TRUE(engine->Drain().ok());
  auto compute = engine->Fetch(a, Tier::kHost, {RoleBit(Role::kCompute)});
  ASSERT_TRUE(compute.ok()) << compute.status().ToString();
  Check(*compute, a);
  const EngineStats after = engine->stats();
  const int kC = static_cast<int>(Role::kCompute);
  const int kNvme = 2, kHost = 1;
  EXPECT_EQ(
      after.role_bytes[kC][kNvme][kHost] - before.role_bytes[kC][kNvme][kHost],
      32 * kKiB)
      << "the compute copy was read twice";
  EXPECT_EQ(after.abandoned_prefetches - before.abandoned_prefetches, 1u);
  EXPECT_EQ(after.hits - before.hits, 1u);
}

TEST_F(StoreTest, HostAndDeviceHomesRoundTrip) {
  for (Tier home : {Tier::kHost, Tier::kDevice}) {
    auto engine = Open(512 * kKiB, 512 * kKiB, 0, home);
    ASSERT_NE(engine, nullptr);
    const int g = *engine->RegisterGroup(Layer("layer.0", 9000));
    const Tier other = home == Tier::kHost ? Tier::kDevice : Tier::kHost;
    auto view = engine->Fetch(g, other, {kAllRoles, true});
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    Fill(*view, 3);
    ASSERT_TRUE(view->pin.Release().ok());
    ASSERT_TRUE(engine->Evict(g, other).ok());  // written back to the home
    view = engine->Fetch(g, home);
    ASSERT_TRUE(view.ok());
    Check(*view, 3);
    ASSERT_TRUE(view->pin.Release().ok());
  }
}

TEST_F(StoreTest, InfeasibleGroupFailsAtRegistrationNamingTheBytes) {
  auto engine = Open(512 * kKiB, 4096 * kKiB, 8192 * kKiB);
  ASSERT_NE(engine, nullptr);
  // 812 KiB of bf16 compute plus its fp32 master on the device: too big.
  auto id = engine->RegisterGroup(Layer("layer.17", 812 * 1024 / 2));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(id.status().message().find("group 'layer.17' needs"),
            std::string::npos)
      << id.status().message();
  EXPECT_NE(id.status().message().find("device budget is 512.0 KiB"),
            std::string::npos)
      << id.status().message();
  EXPECT_EQ(engine->group_count(), 0);
  EXPECT_TRUE(engine->RegisterGroup(Layer("layer.0", 1000)).ok());
}

// With only the compute copy allowed on the device, the master does not
// count against the device budget, and fetching it there is refused.
TEST_F(StoreTest, DeviceRolesBoundWhatTheDeviceMustHold) {
  auto engine = Open(512 * kKiB, 4096 * kKiB, 8192 * kKiB);
  ASSERT_NE(engine, nullptr);
  GroupSpec spec = Layer("layer.17", 200 * 1024 / 2);  // 200 + 400 KiB
  ASSERT_FALSE(engine->RegisterGroup(spec).ok());
  spec.use_default_placement = false;
  spec.placement.home.fill(Tier::kNvme);
  spec.placement.device_roles = RoleBit(Role::kCompute);
  auto id = engine->RegisterGroup(spec);
  ASSERT_TRUE(id.ok()) << id.status().message();
  auto compute = engine->Fetch(*id, Tier::kDevice, {RoleBit(Role::kCompute)});
  ASSERT_TRUE(compute.ok()) << compute.status().message();
  ASSERT_TRUE(compute->pin.Release().ok());
  auto master = engine->Fetch(*id, Tier::kDevice, {RoleBit(Role::kMaster)});
  ASSERT_FALSE(master.ok());
  EXPECT_NE(master.status().message().find("device_roles"), std::string::npos)
      << master.status().message();
  spec.name = "layer.18";
  spec.placement.home.fill(Tier::kDevice);
  auto bad = engine->RegisterGroup(spec);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not in device_roles"),
            std::string::npos)
      << bad.status().message();
}

TEST_F(StoreTest, NvmePlacementWithoutNvmeTierFails) {
  auto engine = Open(512 * kKiB, 512 * kKiB, 0, Tier::kNvme);
  ASSERT_NE(engine, nullptr);
  auto id = engine->RegisterGroup(Layer("layer.0", 1000));
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("--nvme-budget"), std::string::npos);
}

TEST_F(StoreTest, MissingSwapDirectoryIsAClearError) {
  EngineOptions o;
  o.device = "host";
  o.device_budget = o.host_budget = o.nvme_budget = 1 << 20;
  o.swap_dir = dir_.path() + "/does-not-exist";
  auto engine = Engine::Open(o);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kNotFound);
  EXPECT_NE(engine.status().message().find("does-not-exist"),
            std::string::npos);
}

// Two groups fill the device; while both are fetched a third cannot come
// in, and the pinned ones keep their bytes. Releasing one makes room.
TEST_F(StoreTest, PinnedGroupsAreNeverEvicted) {
  auto engine = Open(100 * kKiB, 1024 * kKiB, 2048 * kKiB);
  ASSERT_NE(engine, nullptr);
  std::vector<int> g;
  for (int i = 0; i < 3; ++i) {
    g.push_back(*engine->RegisterGroup(Layer("layer." + std::to_string(i),
                                             8000)));  // 48 KiB each
  }
  std::vector<GroupView> held;
  for (int i = 0; i < 2; ++i) {
    auto view = engine->Fetch(g[i], Tier::kDevice, {kAllRoles, true});
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    Fill(*view, 10 + i);
    held.push_back(std::move(*view));
  }
  auto third = engine->Fetch(g[2], Tier::kDevice);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("pinned"), std::string::npos)
      << third.status().message();
  ASSERT_TRUE(held[0].pin.Release().ok());
  third = engine->Fetch(g[2], Tier::kDevice);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  ASSERT_TRUE(third->pin.Release().ok());
  ASSERT_TRUE(held[1].pin.Release().ok());
  for (int i = 0; i < 2; ++i) {
    auto view = engine->Fetch(g[i], Tier::kHost);
    ASSERT_TRUE(view.ok());
    Check(*view, 10 + i);
    ASSERT_TRUE(view->pin.Release().ok());
  }
  EXPECT_LE(engine->stats().tiers[0].peak, 100 * kKiB);
}

// A write fetch hands out a copy only once no transfer is still copying
// from it: writing under a copy in flight is a data race (TSan reports it)
// and could tear the bytes the transfer moves.
TEST_F(StoreTest, WriteFetchWaitsForTransfersCopyingFromItsCopy) {
  auto engine = Open(8192 * kKiB, 16384 * kKiB, 0, Tier::kHost);
  ASSERT_NE(engine, nullptr);
  const int g = *engine->RegisterGroup(Layer("big", 1 << 20));  // 6 MiB
  constexpr int kWrites = 40;
  {
    // Stopped and joined on every way out of this block, failures included.
    std::jthread mover([&](std::stop_token stop) {
      while (!stop.stop_requested()) {
        ASSERT_TRUE(engine->Prefetch(g, Tier::kDevice).ok());
        ASSERT_TRUE(engine->Drain().ok());
        ASSERT_TRUE(engine->Evict(g, Tier::kDevice).ok());
      }
    });
    for (int i = 0; i < kWrites; ++i) {
      auto view = engine->Fetch(g, Tier::kHost, {kAllRoles, true});
      ASSERT_TRUE(view.ok()) << view.status().ToString();
      Fill(*view, i);
      ASSERT_TRUE(view->pin.Release().ok());
    }
  }
  auto view = engine->Fetch(g, Tier::kDevice);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Check(*view, kWrites - 1);
  ASSERT_TRUE(view->pin.Release().ok());
}

TEST_F(StoreTest, LruBeforeATrace) {
  auto engine = Open(150 * kKiB, 2048 * kKiB, 0, Tier::kHost);
  ASSERT_NE(engine, nullptr);
  std::vector<int> g;  // 48 KiB each: 3 fit on the device
  for (int i = 0; i < 4; ++i) {
    g.push_back(*engine->RegisterGroup(Layer("l" + std::to_string(i), 8000)));
  }
  auto touch = [&](int i) {
    auto view = engine->Fetch(g[i], Tier::kDevice);
    ASSERT_TRUE(view.ok());
    ASSERT_TRUE(view->pin.Release().ok());
  };
  touch(0), touch(1), touch(2), touch(0);  // 1 is now least recent
  touch(3);                                // evicts 1
  const uint64_t hits = engine->stats().hits;
  touch(0), touch(2), touch(3);
  EXPECT_EQ(engine->stats().hits - hits, 6u);  // 2 chunks per group
  touch(1);
  EXPECT_EQ(engine->stats().hits - hits, 6u);
}

// An agent's fetches (record = false), like the optimizer's, are not the
// training thread's: they stay out of the fetch, hit and stall figures.
TEST_F(StoreTest, UnrecordedFetchesAreNotCounted) {
  auto engine = Open(150 * kKiB, 2048 * kKiB, 0, Tier::kHost);
  ASSERT_NE(engine, nullptr);
  std::vector<int> g;
  for (int i = 0; i < 4; ++i) {
    g.push_back(*engine->RegisterGroup(Layer("l" + std::to_string(i), 8000)));
  }
  auto fetch = [&](int i, bool record) {
    FetchOptions o;
    o.record = record;
    auto view = engine->Fetch(g[i], Tier::kDevice, o);
    ASSERT_TRUE(view.ok());
    ASSERT_TRUE(view->pin.Release().ok());
  };
  for (int i = 0; i < 4; ++i) fetch(i, false);
  EngineStats stats = engine->stats();
  EXPECT_EQ(stats.fetches, 0u);
  EXPECT_EQ(stats.hits, 0u);
  EXPECT_EQ(stats.stall_seconds, 0.0);
  EXPECT_GT(stats.tiers[0].peak, 0u) << "the fetches filled nothing";
  for (int i = 0; i < 4; ++i) fetch(i, true);
  stats = engine->stats();
  EXPECT_EQ(stats.fetches, 8u);  // 2 chunks per group
  EXPECT_GT(stats.stall_seconds, 0.0);
}

TEST_F(StoreTest, TracePrefetchesAheadAndChangesAreLogged) {
  auto engine = Open(200 * kKiB, 4096 * kKiB, 8192 * kKiB);
  ASSERT_NE(engine, nullptr);
  std::vector<int> g;
  for (int i = 0; i < 12; ++i) {
    g.push_back(*engine->RegisterGroup(Layer("l" + std::to_string(i), 8000)));
  }
  auto step = [&](const std::vector<int>& order) {
    engine->BeginStep();
    for (int i : order) {
      auto view = engine->Fetch(g[i], Tier::kDevice, {kAllRoles, true});
      ASSERT_TRUE(view.ok()) << view.status().ToString();
      Fill(*view, i);
      ASSERT_TRUE(engine->Drain().ok());  // let the prefetches land
      ASSERT_TRUE(view->pin.Release().ok());
    }
    ASSERT_TRUE(engine->EndStep().ok());
  };
  std::vector<int> order;
  for (int i = 0; i < 12; ++i) order.push_back(i);
  for (int i = 11; i >= 0; --i) order.push_back(i);
  EXPECT_NE(engine->Explain().find("no trace"), std::string::npos);
  step(order);
  EXPECT_NE(engine->Explain().find("prefetch #"), std::string::npos)
      << engine->Explain();
  step(order);
  const EngineStats before = engine->stats();
  step(order);
  const EngineStats after = engine->stats();
  const uint64_t fetches = after.fetches - before.fetches;
  EXPECT_EQ(fetches, 48u);
  EXPECT_GE(after.hits - before.hits, fetches * 9 / 10);
  EXPECT_GT(after.prefetch_hits, before.prefetch_hits);
  EXPECT_EQ(after.trace_invalidations, 0u);

  std::vector<int> changed = order;
  std::swap(changed[3], changed[4]);
  const std::string log = testutil::CaptureStderr([&] { step(changed); });
  EXPECT_NE(log.find("re-recording the trace"), std::string::npos) << log;
  EXPECT_EQ(engine->stats().trace_invalidations, 1u);
  for (int i = 0; i < 12; ++i) {
    auto view = engine->Fetch(g[i], Tier::kHost);
    ASSERT_TRUE(view.ok());
    Check(*view, i);
    ASSERT_TRUE(view->pin.Release().ok());
  }
}

TEST_F(StoreTest, MisuseIsAnError) {
  auto engine = Open(256 * kKiB, 512 * kKiB, 1024 * kKiB);
  ASSERT_NE(engine, nullptr);
  const int g = *engine->RegisterGroup(Layer("layer.0", 1000));
  EXPECT_EQ(Pin().Release().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->Fetch(g, Tier::kNvme).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Fetch(7, Tier::kHost).status().code(),
            StatusCode::kInvalidArgument);
  auto view = engine->Fetch(g, Tier::kDevice);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(engine->Evict(g, Tier::kDevice).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(view->pin.Release().ok());
  EXPECT_EQ(view->pin.Release().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(engine->RegisterGroup(GroupSpec{}).ok());
}

// A write-back to NVMe that fails (EIO) is reported by the call that
// needed it, and the host copy stays the valid one: a fetch still returns
// the bytes, and the next eviction writes them down.
TEST_F(StoreTest, FailedWriteBackKeepsTheHostCopy) {
  testutil::ErrnoInjector eio(EIO, 0, uint64_t{1} << 40, /*times=*/1,
                              /*writes_only=*/true);
  auto engine = Open(256 * kKiB, 512 * kKiB, 1024 * kKiB, Tier::kNvme, &eio);
  ASSERT_NE(engine, nullptr);
  const int g = *engine->RegisterGroup(Layer("layer.0", 8000));
  auto view = engine->Fetch(g, Tier::kHost, {kAllRoles, true});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Fill(*view, 7);
  ASSERT_TRUE(view->pin.Release().ok());
  const Status failed = engine->Evict(g, Tier::kHost);
  EXPECT_EQ(failed.code(), StatusCode::kIoError) << failed.ToString();
  ASSERT_EQ(eio.injected.load(), 1u);
  view = engine->Fetch(g, Tier::kHost);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Check(*view, 7);
  ASSERT_TRUE(view->pin.Release().ok());
  ASSERT_TRUE(engine->Evict(g, Tier::kHost).ok());
  view = engine->Fetch(g, Tier::kDevice);  // NVMe -> host -> device
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Check(*view, 7);
  ASSERT_TRUE(view->pin.Release().ok());
  EXPECT_GT(engine->stats().bytes[2][1], 0u);
}

// Acceptance: one flipped byte in a swap file fails the next read with a
// checksum error naming the extent, and never hands out the bytes.
TEST_F(StoreTest, FlippedByteInASwapFileIsDataLoss) {
  auto engine = Open(256 * kKiB, 512 * kKiB, 1024 * kKiB);
  ASSERT_NE(engine, nullptr);
  GroupSpec spec = Layer("layer.0", 2048);
  spec.tensors[0].roles = RoleBit(Role::kCompute);
  const int g = *engine->RegisterGroup(spec);
  auto view = engine->Fetch(g, Tier::kHost, {kAllRoles, true});
  ASSERT_TRUE(view.ok());
  Fill(*view, 5);
  ASSERT_TRUE(view->pin.Release().ok());
  ASSERT_TRUE(engine->Evict(g, Tier::kHost).ok());
  int flipped = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
    if (entry.path().filename().string().rfind("strata-swap-", 0) != 0) {
      continue;
    }
    const int fd = ::open(entry.path().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, 100), 1);
    byte ^= 0x40;
    ASSERT_EQ(::pwrite(fd, &byte, 1, 100), 1);
    ::close(fd);
    ++flipped;
  }
  ASSERT_GT(flipped, 0);
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto bad = engine->Fetch(g, Tier::kHost);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(bad.status().message().find("extent"), std::string::npos)
        << bad.status().message();
    EXPECT_NE(bad.status().message().find("strata-swap-"), std::string::npos)
        << bad.status().message();
  }
}

}  // namespace
}  // namespace strata
