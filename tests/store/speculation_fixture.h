// The fixture of the tests of a chunk homed on NVMe (speculation_test.cc
// and unchecked_test.cc, one binary): an engine on the host-emulated
// device with every role homed on NVMe, and one group "layer.0" of 16384
// bf16 elements with a master.
#ifndef STRATA_TESTS_STORE_SPECULATION_FIXTURE_H_
#define STRATA_TESTS_STORE_SPECULATION_FIXTURE_H_

#include <gtest/gtest.h>

#include <memory>

#include "src/store/engine_internal.h"
#include "src/store/residency.h"
#include "strata/engine.h"
#include "tests/store/store_util.h"
#include "tests/testutil/testutil.h"

namespace strata::store_test {

using store::Residency;
inline constexpr RoleMask kMaster = RoleBit(Role::kMaster);

class SpeculationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions o;
    o.device = "host";
    o.device_budget = 256 * kKiB;
    o.host_budget = 512 * kKiB;
    o.nvme_budget = nvme_budget_;
    o.swap_dir = dir_.path();
    o.placement.home.fill(Tier::kNvme);
    auto engine =
        internal::EngineAccess::Open(o, {.fault_injector = injector_});
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    residency_ = internal::PartsOf(*engine_).residency;
    auto g = engine_->RegisterGroup(Layer("layer.0", 16384));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    group_ = *g;
  }

  // Writes seeded bytes into the group's master (a plain write fetch).
  void Write(uint64_t seed) {
    auto view =
        engine_->Fetch(group_, Tier::kHost, {.roles = kMaster, .write = true});
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    Fill(*view, seed);
    ASSERT_TRUE(view->pin.Release().ok());
  }
  // Writes seeded bytes into the master speculatively.
  void Speculate(uint64_t seed) {
    auto fetched = residency_->FetchToHost(group_, {.update = kMaster}, true);
    ASSERT_TRUE(fetched.ok()) << fetched.status().ToString();
    char* data = fetched->base[Role::kMaster];
    testutil::FillRandom(data, 16384 * 4, store_test::Seed(seed, 0));
    ASSERT_TRUE(fetched->pin.Release().ok());
  }
  // The master holds what Write(seed) wrote, on the host and then read back
  // from NVMe.
  void ExpectMaster(uint64_t seed) {
    for (int pass = 0; pass < 2; ++pass) {
      auto view = engine_->Fetch(group_, Tier::kHost, {.roles = kMaster});
      ASSERT_TRUE(view.ok()) << view.status().ToString();
      Check(*view, seed);
      ASSERT_TRUE(view->pin.Release().ok());
      ASSERT_TRUE(engine_->Evict(group_, Tier::kHost).ok());
    }
  }
  void ExpectZeros() {
    auto view = engine_->Fetch(group_, Tier::kHost, {.roles = kMaster});
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    const auto* bytes =
        static_cast<const unsigned char*>(view->tensors[0].data);
    for (uint64_t i = 0; i < view->tensors[0].bytes; ++i)
      ASSERT_EQ(bytes[i], 0);
    ASSERT_TRUE(view->pin.Release().ok());
  }
  uint64_t NvmeReads() const {
    return engine_->stats().bytes[2][1];  // nvme -> host
  }
  uint64_t NvmeWrites() const {
    return engine_->stats().bytes[1][2];  // host -> nvme
  }
  Status Discard() { return residency_->Discard(group_, kMaster); }

  uint64_t nvme_budget_ = 4096 * kKiB;
  aio::FaultInjector* injector_ = nullptr;  // outlives the engine
  testutil::ScratchDir dir_;
  std::unique_ptr<Engine> engine_;
  Residency* residency_ = nullptr;
  int group_ = -1;
};

}  // namespace strata::store_test

#endif  // STRATA_TESTS_STORE_SPECULATION_FIXTURE_H_
