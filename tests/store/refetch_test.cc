// Note [Updates below the device] in src/store/residency_holds.cc: a write
// below the device of a role the trace fetches to the device (the optimizer's
// update of a compute copy at its home) queues a planned prefetch, so the
// next step's first fetches find the new bytes on the device.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "src/store/engine_internal.h"
#include "src/store/residency.h"
#include "strata/engine.h"
#include "tests/store/store_util.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

using store_test::Check;
using store_test::Fill;
using store_test::kKiB;
using store_test::Layer;
constexpr RoleMask kCompute = RoleBit(Role::kCompute);
constexpr int kGroups = 4;

class RefetchTest : public ::testing::TestWithParam<bool> {
 protected:
  // The device holds every compute copy: the plan prefetches nothing.
  void SetUp() override {
    EngineOptions o;
    o.device = "host";
    o.device_budget = 1024 * kKiB;
    o.host_budget = 4096 * kKiB;
    o.placement.home.fill(Tier::kHost);
    o.placement.device_roles = kCompute;
    o.prefetch = GetParam();
    auto engine = internal::EngineAccess::Open(o, {});
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    for (int g = 0; g < kGroups; ++g) {
      ASSERT_TRUE(
          engine_->RegisterGroup(Layer("layer." + std::to_string(g), 8000))
              .ok());
    }
  }

  // A forward: each group's compute copy fetched to the device in turn.
  void Forward(uint64_t seed) {
    engine_->BeginStep();
    for (int g = 0; g < kGroups; ++g) {
      auto view = engine_->Fetch(g, Tier::kDevice, {.roles = kCompute});
      ASSERT_TRUE(view.ok()) << view.status().ToString();
      if (seed > 0) Check(*view, seed + g);
      ASSERT_TRUE(view->pin.Release().ok());
    }
    ASSERT_TRUE(engine_->EndStep().ok());
  }

  // What the optimizer does: new bytes written into each compute copy at
  // its home.
  void Update(uint64_t seed) {
    store::Residency& residency = *internal::PartsOf(*engine_).residency;
    for (int g = 0; g < kGroups; ++g) {
      auto f = residency.FetchToHost(g, {.update = kCompute}, false);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      const store::TensorLayout& t = residency.layout(g).tensors[0];
      testutil::FillRandom(f->base[Role::kCompute] + t.offset[Role::kCompute],
                           t.elements * 2, store_test::Seed(seed + g, 0));
      ASSERT_TRUE(f->pin.Release().ok());
    }
    ASSERT_TRUE(engine_->Drain().ok());
  }

  std::unique_ptr<Engine> engine_;
};

TEST_P(RefetchTest, UpdatedComputeCopiesArePrefetchedForTheNextForward) {
  Forward(0);
  Forward(0);  // the trace: nothing to prefetch, every copy stays
  const EngineStats before = engine_->stats();
  Update(10);
  Forward(10);
  const EngineStats after = engine_->stats();
  if (GetParam()) {
    EXPECT_EQ(after.prefetches - before.prefetches, kGroups);
    EXPECT_EQ(after.prefetch_hits - before.prefetch_hits, kGroups);
  } else {  // prefetch off: demand fetches only
    EXPECT_EQ(after.prefetches, before.prefetches);
    EXPECT_EQ(after.hits - before.hits, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Prefetch, RefetchTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "on" : "off";
                         });

}  // namespace
}  // namespace strata
