// LocalChecks and FinishStep(global): ranks that each hold part of a model
// combine their gradient checks and clip and skip as one optimizer holding
// the whole model would.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "strata/engine.h"
#include "strata/offload_optimizer.h"

namespace strata {
namespace {

constexpr int64_t kElements = 3000;
constexpr uint64_t kMiB = 1 << 20;

// One engine and optimizer over some of the model's groups ("layer.<g>").
struct Part {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<OffloadOptimizer> optimizer;
  std::vector<int> groups;  // the model's group of each of ours
};

float Weight(int group, int64_t i) { return 0.01f * ((i * 7 + group) % 13); }
float Grad(int group, int64_t i, int step) {
  return 0.1f * ((i * 3 + group + step) % 11) - 0.5f;
}

Part Open(const std::vector<int>& groups, bool skip_on_overflow) {
  Part part;
  part.groups = groups;
  EngineOptions options;
  options.device = "host";
  options.device_budget = 4 * kMiB;
  options.host_budget = 16 * kMiB;
  auto engine = Engine::Open(options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  part.engine = std::move(*engine);
  for (int g : groups) {
    GroupSpec spec;
    spec.name = "layer." + std::to_string(g);
    spec.tensors = {{"w", {kElements}, DType::kFloat32, kAllRoles}};
    EXPECT_TRUE(part.engine->RegisterGroup(spec).ok());
  }
  for (size_t id = 0; id < groups.size(); ++id) {
    auto view = part.engine->Fetch(
        id, Tier::kHost,
        {.roles = RoleBit(Role::kCompute) | RoleBit(Role::kMaster),
         .write = true});
    EXPECT_TRUE(view.ok()) << view.status().message();
    for (const TensorView& t : view->tensors) {
      auto* data = static_cast<float*>(t.data);
      for (int64_t i = 0; i < kElements; ++i) data[i] = Weight(groups[id], i);
    }
    EXPECT_TRUE(view->pin.Release().ok());
  }
  OffloadOptimizerOptions o;
  o.clip_norm = 1.0;  // the gradients' norm is far above: clipping fires
  o.skip_on_overflow = skip_on_overflow;
  o.threads = 1;
  auto opt = OffloadOptimizer::Create(part.engine.get(), o);
  EXPECT_TRUE(opt.ok()) << opt.status().message();
  part.optimizer = std::move(*opt);
  return part;
}

// Begins a step and hands off every group's gradients; `poison` (a model
// group) gets a NaN.
void Backward(Part& part, int step, int poison = -1) {
  ASSERT_TRUE(part.optimizer->BeginStep({.lr = 1e-2}).ok());
  for (size_t id = 0; id < part.groups.size(); ++id) {
    auto buffer = part.optimizer->AcquireGradients(id);
    ASSERT_TRUE(buffer.ok()) << buffer.status().message();
    auto* g = static_cast<float*>(buffer->tensors[0].data);
    for (int64_t i = 0; i < kElements; ++i)
      g[i] = Grad(part.groups[id], i, step);
    if (part.groups[id] == poison)
      g[5] = std::numeric_limits<float>::quiet_NaN();
    ASSERT_TRUE(part.optimizer->HandOff(*buffer).ok());
  }
}

std::vector<float> Master(Part& part, int id) {
  auto view =
      part.engine->Fetch(id, Tier::kHost, {.roles = RoleBit(Role::kMaster)});
  EXPECT_TRUE(view.ok()) << view.status().message();
  const auto* data = static_cast<const float*>(view->tensors[0].data);
  std::vector<float> out(data, data + kElements);
  EXPECT_TRUE(view->pin.Release().ok());
  return out;
}

TEST(GlobalChecksTest, TwoPartsWithCombinedChecksStepLikeTheWhole) {
  Part whole = Open({0, 1}, true);
  Part a = Open({0}, true);
  Part b = Open({1}, true);
  for (int step = 0; step < 3; ++step) {
    Backward(whole, step);
    Backward(a, step);
    Backward(b, step);
    auto ca = a.optimizer->LocalChecks();
    auto cb = b.optimizer->LocalChecks();
    ASSERT_TRUE(ca.ok() && cb.ok());
    const StepChecks global{ca->sum_squares + cb->sum_squares,
                            ca->overflow || cb->overflow};
    auto rw = whole.optimizer->FinishStep();
    auto ra = a.optimizer->FinishStep(global);
    auto rb = b.optimizer->FinishStep(global);
    ASSERT_TRUE(rw.ok() && ra.ok() && rb.ok());
    EXPECT_LT(rw->clip_coef, 1.0);
    EXPECT_EQ(ra->grad_norm, rw->grad_norm);
    EXPECT_EQ(rb->clip_coef, rw->clip_coef);
  }
  EXPECT_EQ(Master(a, 0), Master(whole, 0));
  EXPECT_EQ(Master(b, 0), Master(whole, 1));
}

TEST(GlobalChecksTest, AnOverflowOnAnotherRankSkipsTheStepHereToo) {
  Part a = Open({0}, true);
  const std::vector<float> before = Master(a, 0);
  Backward(a, 0);
  auto local = a.optimizer->LocalChecks();
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE(local->overflow);
  auto report = a.optimizer->FinishStep({local->sum_squares, true});
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_TRUE(report->skipped);
  EXPECT_EQ(report->overflow_group, -1);
  EXPECT_EQ(a.optimizer->step(), 0);
  EXPECT_EQ(Master(a, 0), before);
}

TEST(GlobalChecksTest, WithoutSkippingAnOverflowElsewhereFailsNamingIt) {
  Part a = Open({0}, false);
  Backward(a, 0);
  auto local = a.optimizer->LocalChecks();
  ASSERT_TRUE(local.ok());
  auto report = a.optimizer->FinishStep({local->sum_squares, true});
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(report.status().message().find("on another rank"),
            std::string::npos)
      << report.status().message();
}

TEST(GlobalChecksTest, ALocalOverflowIsReportedWithItsGroup) {
  Part a = Open({0, 1}, true);
  Backward(a, 0, 1);
  auto local = a.optimizer->LocalChecks();
  ASSERT_TRUE(local.ok());
  EXPECT_TRUE(local->overflow);
  auto report = a.optimizer->FinishStep(*local);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->skipped);
  EXPECT_EQ(report->overflow_group, 1);
}

TEST(GlobalChecksTest, ChecksNeedAStepAndEveryHandOff) {
  Part a = Open({0, 1}, true);
  auto none = a.optimizer->LocalChecks();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.optimizer->BeginStep({}).ok());
  auto buffer = a.optimizer->AcquireGradients(0);
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE(a.optimizer->HandOff(*buffer).ok());
  auto early = a.optimizer->LocalChecks();
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.status().message().find("layer.1"), std::string::npos)
      << early.status().message();
  ASSERT_TRUE(a.optimizer->AbortStep().ok());
}

}  // namespace
}  // namespace strata
