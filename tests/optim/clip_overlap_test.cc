// Issue #18: with clipping and skip-on-overflow on, overlap mode steps the
// groups under the next forward (Note [Steps under the next forward]), or
// with state on NVMe speculatively under backward, undone when clipping
// fires or the step is skipped (Note [Exact steps under overlap]). Fifty
// steps stay bit-identical to in-memory AdamW while clipping fires on some
// steps and not on others and non-finite gradients skip chosen steps, with
// state on the host and on NVMe, 1 and 4 micro-batches, across a save and a
// load in the middle; every forward sees the last step's update.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "strata/engine.h"
#include "strata/offload_optimizer.h"
#include "tests/optim/pipeline_fixture.h"

namespace strata {
namespace {

using optim_test::Config;
using optim_test::kGroups;
using optim_test::Name;
using optim_test::PipelineTest;
using optim_test::Reference;

using ClipOverlapTest = PipelineTest;

// Steps 0..49, with a checkpoint saved before step 25 and loaded again
// after step 29, so that steps 25..29 run twice: the second time from the
// checkpoint, against the reference as it was when the checkpoint was
// saved.
TEST_P(ClipOverlapTest, FiftyStepsWithClippingAndSkipsAcrossALoadAreExact) {
  const std::set<int> poisoned = {5, 17, 18, 27, 33};
  const std::string ckpt = scratch_.File("ckpt");
  Reference saved;
  int saved_taken = 0;
  int saved_clipped = 0;
  bool reloaded = false;
  int skipped = 0;
  for (int s = 0; s < 50; ++s) {
    if (s == 25 && !reloaded) {
      const Status st = optimizer_->Save(ckpt);
      ASSERT_TRUE(st.ok()) << st.message();
      saved = ref_;
      saved_taken = steps_taken_;
      saved_clipped = clipped_;
    }
    if (s == 30 && !reloaded) {
      const Status st = optimizer_->Load(ckpt);
      ASSERT_TRUE(st.ok()) << st.message();
      ref_ = saved;
      steps_taken_ = saved_taken;
      clipped_ = saved_clipped;
      reloaded = true;
      s = 25;
    }
    const bool poison = poisoned.count(s) > 0;
    Result<OptimStepReport> report = Step(s, poison ? s % kGroups : -1);
    ASSERT_TRUE(report.ok())
        << "step " << s << ": " << report.status().message();
    ASSERT_EQ(report->skipped, poison) << "step " << s;
    skipped += report->skipped;
    ASSERT_EQ(report->step, steps_taken_) << "step " << s;
    if (s == 0 || s == 18 || s == 24) ExpectEqualToReference();
  }
  ASSERT_TRUE(reloaded);
  ExpectEqualToReference();
  EXPECT_EQ(skipped, static_cast<int>(poisoned.size()) + 1);  // 27 twice
  EXPECT_GT(clipped_, 0) << "clipping never fired: the test would not "
                            "catch a wrong clip coefficient";
  EXPECT_LT(clipped_, steps_taken_) << "clipping always fired";
  // State on NVMe steps speculatively from its second step on: some
  // speculations stand, and clipping and the skips undo others.
  const Config& c = GetParam();
  if (c.state_on_nvme && c.mode == OptimMode::kOverlap) {
    EXPECT_GT(undone_, 0);
    EXPECT_LT(undone_, speculated_);
  } else {
    EXPECT_EQ(speculated_, 0);
  }
  const EngineStats stats = engine_->stats();
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    const EngineStats::TierStats& tier = stats.tiers[static_cast<int>(t)];
    EXPECT_LE(tier.peak, tier.budget) << TierName(t);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Placements, ClipOverlapTest,
    testing::Values(Config{OptimMode::kOverlap, false, 100, 1, true},
                    Config{OptimMode::kOverlap, true, 100, 1, true},
                    Config{OptimMode::kOverlap, false, 200, 4, true},
                    Config{OptimMode::kOverlap, true, 200, 4, true},
                    Config{OptimMode::kAfterBackward, true, 100, 1, true}),
    Name);

}  // namespace
}  // namespace strata
