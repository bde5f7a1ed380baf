// Issue #17 §3: OffloadOptimizer::Create accepts exactly the host budgets
// that then run. For small models with the optimizer state on NVMe, the
// smallest host budget Create accepts (found by bisection, in 4 KiB pages)
// runs three steps, and one page less is refused, naming the host budget.
// Create used to count chunk bytes where the host pool takes size classes,
// and accepted budgets that failed at step 1.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "strata/engine.h"
#include "strata/offload_optimizer.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

constexpr uint64_t kPage = 4096;

struct Model {
  DType dtype;
  int groups;
  int64_t n;  // elements of the group's tensor "w"
  bool bias;  // a second tensor "b" of n / 7 + 1 elements
};

class BudgetTest : public testing::TestWithParam<Model> {
 protected:
  // Rig members are destroyed optimizer first, then the engine.
  struct Rig {
    std::unique_ptr<Engine> engine;
    std::unique_ptr<OffloadOptimizer> optimizer;
    Status status;
  };

  Rig Open(uint64_t host_budget) {
    Rig rig;
    EngineOptions o;
    o.device = "host";
    o.device_budget = 4 << 20;
    o.host_budget = host_budget;
    o.nvme_budget = 8 << 20;
    o.swap_dir = dir_.path();
    o.swap_files = 1;
    o.placement.home = {Tier::kHost, Tier::kNvme, Tier::kNvme, Tier::kNvme,
                        Tier::kNvme};
    o.placement.device_roles = RoleBit(Role::kCompute);
    auto engine = Engine::Open(o);
    rig.status = engine.status();
    if (!engine.ok()) return rig;
    rig.engine = std::move(*engine);
    const Model& m = GetParam();
    for (int g = 0; g < m.groups; ++g) {
      GroupSpec spec;
      spec.name = "layer." + std::to_string(g);
      spec.tensors = {{"w", {m.n}, m.dtype, kAllRoles}};
      if (m.bias)
        spec.tensors.push_back({"b", {m.n / 7 + 1}, m.dtype, kAllRoles});
      rig.status = rig.engine->RegisterGroup(spec).status();
      if (!rig.status.ok()) return rig;
    }
    auto optimizer = OffloadOptimizer::Create(rig.engine.get(), {});
    rig.status = optimizer.status();
    if (optimizer.ok()) rig.optimizer = std::move(*optimizer);
    return rig;
  }

  static Status Step(Rig& rig) {
    Engine& engine = *rig.engine;
    engine.BeginStep();
    STRATA_RETURN_IF_ERROR(rig.optimizer->BeginStep({.lr = 1e-3}));
    for (int g = engine.group_count() - 1; g >= 0; --g) {
      STRATA_ASSIGN_OR_RETURN(
          GroupView w,
          engine.Fetch(g, Tier::kDevice, {.roles = RoleBit(Role::kCompute)}));
      STRATA_ASSIGN_OR_RETURN(GradientBuffer grads,
                              rig.optimizer->AcquireGradients(g));
      STRATA_RETURN_IF_ERROR(w.pin.Release());
      STRATA_RETURN_IF_ERROR(rig.optimizer->HandOff(grads));
    }
    STRATA_RETURN_IF_ERROR(rig.optimizer->FinishStep().status());
    return engine.EndStep();
  }

  // The smallest host budget, in whole pages, that Create accepts.
  uint64_t SmallestAccepted() {
    uint64_t lo = kPage, hi = 16 << 20;
    while (lo < hi) {
      const uint64_t mid = (lo + hi) / 2 / kPage * kPage;
      if (Open(mid).optimizer != nullptr) {
        hi = mid;
      } else {
        lo = mid + kPage;
      }
    }
    return lo;
  }

  testutil::ScratchDir dir_;
};

TEST_P(BudgetTest, TheSmallestBudgetCreateAcceptsRuns) {
  const uint64_t smallest = SmallestAccepted();
  {
    Rig rig = Open(smallest);
    ASSERT_NE(rig.optimizer, nullptr) << rig.status.ToString();
    for (int step = 0; step < 3; ++step) {
      const Status s = Step(rig);
      ASSERT_TRUE(s.ok()) << "step " << step + 1 << " at a host budget of "
                          << smallest << " bytes: " << s.ToString();
    }
  }
  Rig below = Open(smallest - kPage);
  EXPECT_EQ(below.status.code(), StatusCode::kResourceExhausted);
  // Refused by registration or by Create, whichever needs more.
  EXPECT_NE(below.status.message().find("aise the host budget"),
            std::string::npos)
      << below.status.message();
}

INSTANTIATE_TEST_SUITE_P(
    Models, BudgetTest,
    testing::Values(Model{DType::kFloat32, 2, 12345, false},
                    Model{DType::kFloat32, 4, 12345, false},
                    Model{DType::kBFloat16, 3, 33333, true},
                    Model{DType::kFloat32, 5, 5000, true}));

}  // namespace
}  // namespace strata
