// strata-sim's synthetic device work (tools/sim/busy.h): it keeps the
// device busy at least as long as asked, on each device kind; the CUDA case
// skips visibly without a GPU. And its steady step time (tools/sim/sim.h).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "src/tier/device.h"
#include "tools/sim/busy.h"
#include "tools/sim/sim.h"

namespace strata::sim {
namespace {

double Timed(bool on_cuda, Status* status) {
  const auto start = std::chrono::steady_clock::now();
  *status = Busy(0.05, on_cuda);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

TEST(SimBusyTest, HostLoopLastsAtLeastTheTimeAsked) {
  Status status;
  EXPECT_GE(Timed(false, &status), 0.05);
  EXPECT_TRUE(status.ok()) << status.message();
  EXPECT_TRUE(Busy(0, false).ok());
}

TEST(SimBusyTest, CudaKernelLastsAtLeastTheTimeAsked) {
#ifdef STRATA_HAVE_CUDA
  std::string why;
  if (!tier::CudaAvailable(&why)) GTEST_SKIP() << "no CUDA here: " << why;
  Status status;
  const double seconds = Timed(true, &status);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_GE(seconds, 0.05);
#else
  const Status status = Busy(0.01, true);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("without CUDA"), std::string::npos);
#endif
}

// The steady step is the mean after the first two steps, so a slow step
// every few steps (a redo after clipping) counts in offload_efficiency.
TEST(SimSteadyTest, IsTheMeanAfterTheFirstTwoSteps) {
  std::vector<StepFigures> steps(6);
  const double seconds[] = {9, 9, 1, 1, 1, 5};  // median 1
  for (int i = 0; i < 6; ++i) steps[i].seconds = seconds[i];
  EXPECT_DOUBLE_EQ(SteadySeconds(steps), 2.0);
  steps.resize(2);
  EXPECT_DOUBLE_EQ(SteadySeconds(steps), 9.0);
  EXPECT_EQ(SteadySeconds({}), 0.0);
}

}  // namespace
}  // namespace strata::sim
