// The optimizer's C ABI hands gradients off behind the caller's stream
// (strata_optimizer_hand_off's fence): on the host-emulated device with a
// late-completing stream (testutil::FakeStream), the gradients written by
// work still queued when the call returns are the ones the step uses: bf16
// ones copied at the hand-off, and fp32 ones that the worker copies
// straight into the accumulator (Note [Gradients straight into the
// accumulator] in src/optim/pipeline_worker.cc: with clipping on).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "strata/strata.h"
#include "tests/testutil/fake_stream.h"

namespace strata {
namespace {

constexpr int64_t kElements = 4096;
constexpr uint16_t kBf16One = 0x3f80;
constexpr float kOne = 1.0f;

struct Case {
  int32_t dtype;
  double clip_norm;  // a bound never reached: clip_coef 1
};
constexpr auto kWhile = std::chrono::milliseconds(100);

// A C output struct, zeroed, with its struct_size set.
template <typename T>
T Sized() {
  T out{};
  out.struct_size = sizeof(out);
  return out;
}

#define ASSERT_C_OK(call) \
  ASSERT_EQ((call), STRATA_OK) << #call << ": " << strata_last_error()

class OptimFenceTest : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    strata_engine_options o;
    ASSERT_C_OK(strata_engine_options_init(&o));
    o.device = STRATA_DEVICE_HOST;
    o.device_budget = 1 << 20;
    o.host_budget = 4 << 20;
    ASSERT_C_OK(strata_engine_open(&o, &engine_));
    const int64_t shape[1] = {kElements};
    strata_tensor_spec w = {"w", shape, 1, GetParam().dtype, STRATA_ALL_ROLES,
                            0};
    strata_group_spec spec;
    ASSERT_C_OK(strata_group_spec_init(&spec));
    spec.name = "layer.0";
    spec.tensors = &w;
    spec.num_tensors = 1;
    int32_t id = -1;
    ASSERT_C_OK(strata_group_register(engine_, &spec, &id));
    strata_optimizer_options opt;
    ASSERT_C_OK(strata_optimizer_options_init(&opt));
    opt.threads = 1;
    opt.clip_norm = GetParam().clip_norm;
    ASSERT_C_OK(strata_optimizer_create(engine_, &opt, &optimizer_));
  }
  void TearDown() override {
    if (optimizer_ != nullptr) {
      EXPECT_EQ(strata_optimizer_close(optimizer_), STRATA_OK);
    }
    if (engine_ != nullptr) {
      EXPECT_EQ(strata_engine_close(engine_), STRATA_OK);
    }
  }

  strata_engine* engine_ = nullptr;
  strata_optimizer* optimizer_ = nullptr;
};

TEST_P(OptimFenceTest, HandOffWaitsForTheStreamThatWritesTheGradients) {
  strata_step_hyper hyper;
  ASSERT_C_OK(strata_step_hyper_init(&hyper));
  ASSERT_C_OK(strata_optimizer_begin_step(optimizer_, &hyper));
  strata_gradients* grads = nullptr;
  ASSERT_C_OK(strata_optimizer_acquire_gradients(optimizer_, 0, &grads));
  auto info = Sized<strata_gradients_info>();
  ASSERT_C_OK(strata_gradients_get_info(grads, &info));
  testutil::FakeStream stream;  // the "backward kernel", not run yet
  const bool fp32 = GetParam().dtype == STRATA_DTYPE_FLOAT32;
  stream.Queue([g = info.data, fp32] {
    for (int64_t i = 0; i < kElements; ++i) {
      if (fp32) {
        std::memcpy(static_cast<float*>(g) + i, &kOne, sizeof(kOne));
      } else {
        static_cast<uint16_t*>(g)[i] = kBf16One;
      }
    }
  });
  ASSERT_C_OK(strata_optimizer_hand_off(optimizer_, grads, &stream, nullptr));
  std::this_thread::sleep_for(kWhile);  // time for a copy that ran too early
  stream.Run();
  auto report = Sized<strata_step_report>();
  ASSERT_C_OK(strata_optimizer_finish_step(optimizer_, &report));
  // AdamW's first step from zero with gradient 1 moves the weight by -lr;
  // with the zeros the buffer held at the hand-off it would not move.
  strata_view* view = nullptr;
  ASSERT_C_OK(strata_group_fetch(engine_, 0, STRATA_TIER_HOST,
                                 STRATA_ROLE_BIT(STRATA_ROLE_MASTER), 0,
                                 &view));
  auto master = Sized<strata_tensor_info>();
  ASSERT_C_OK(strata_view_get_tensor(view, 0, &master));
  const auto* w = static_cast<const float*>(master.data);
  EXPECT_NEAR(w[0], -hyper.lr, 1e-7);
  EXPECT_NEAR(w[kElements - 1], -hyper.lr, 1e-7);
  ASSERT_C_OK(strata_view_release(view));
}

// A fence the host-emulated device cannot use (an event) is refused and
// ends the handle; the step then fails naming the missing hand-off.
TEST_P(OptimFenceTest, AnEventOnTheHostDeviceIsRefused) {
  strata_step_hyper hyper;
  ASSERT_C_OK(strata_step_hyper_init(&hyper));
  ASSERT_C_OK(strata_optimizer_begin_step(optimizer_, &hyper));
  strata_gradients* grads = nullptr;
  ASSERT_C_OK(strata_optimizer_acquire_gradients(optimizer_, 0, &grads));
  int not_an_event = 0;
  EXPECT_EQ(
      strata_optimizer_hand_off(optimizer_, grads, nullptr, &not_an_event),
      STRATA_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(strata_last_error(), "HostStream"), nullptr)
      << strata_last_error();
  auto report = Sized<strata_step_report>();
  EXPECT_NE(strata_optimizer_finish_step(optimizer_, &report), STRATA_OK);
}

INSTANTIATE_TEST_SUITE_P(Gradients, OptimFenceTest,
                         testing::Values(Case{STRATA_DTYPE_BFLOAT16, 0},
                                         Case{STRATA_DTYPE_FLOAT32, 1e6}),
                         [](const testing::TestParamInfo<Case>& info) {
                           return std::string(
                               info.param.dtype == STRATA_DTYPE_FLOAT32
                                   ? "fp32_straight_into_the_accumulator"
                                   : "bf16_through_the_staging");
                         });

}  // namespace
}  // namespace strata
