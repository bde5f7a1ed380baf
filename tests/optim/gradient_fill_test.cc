// AcquireGradients' fills: a zeroed buffer, and one the caller overwrites
// (GradientFill::kUnwritten), whose tensors keep what the last user left
// while the bytes between and after them, which the step reads as
// gradients of no parameter, are zeroed.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "strata/engine.h"
#include "strata/offload_optimizer.h"

namespace strata {
namespace {

// One host-emulated group of two 100-element bf16 tensors: each starts on
// a 128-element boundary, so there is a gap after each.
std::unique_ptr<Engine> TwoTensorEngine() {
  EngineOptions options;
  options.device = "host";
  options.device_budget = options.host_budget = 4 << 20;
  auto engine = Engine::Open(options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  GroupSpec spec;
  spec.name = "layer.0";
  spec.tensors = {{"a", {100}, DType::kBFloat16, kAllRoles},
                  {"b", {100}, DType::kBFloat16, kAllRoles}};
  EXPECT_TRUE((*engine)->RegisterGroup(spec).ok());
  return std::move(*engine);
}

// Whether buffer bytes [from, to) all equal `byte`.
bool AllBytes(const GradientBuffer& b, uint64_t from, uint64_t to, int byte) {
  const auto* p = static_cast<const unsigned char*>(b.data);
  for (uint64_t i = from; i < to; ++i) {
    if (p[i] != byte) return false;
  }
  return true;
}

TEST(GradientFillTest, UnwrittenBuffersKeepTheTensorsAndZeroTheGaps) {
  auto engine = TwoTensorEngine();
  auto opt = OffloadOptimizer::Create(engine.get(), {.grad_buffers = 1});
  ASSERT_TRUE(opt.ok()) << opt.status().message();
  OffloadOptimizer& o = **opt;
  const uint64_t a_end = 200, b_begin = 256, b_end = 456;
  for (GradientFill fill :
       {GradientFill::kZeros, GradientFill::kUnwritten, GradientFill::kZeros}) {
    ASSERT_TRUE(o.BeginStep({}).ok());
    auto buffer = o.AcquireGradients(0, fill);
    ASSERT_TRUE(buffer.ok()) << buffer.status().message();
    const GradientBuffer& b = *buffer;
    ASSERT_EQ(b.tensors.size(), 2u);
    ASSERT_EQ(
        static_cast<char*>(b.tensors[1].data) - static_cast<char*>(b.data),
        static_cast<ptrdiff_t>(b_begin));
    ASSERT_GE(b.bytes, b_end);
    if (fill == GradientFill::kZeros) {
      EXPECT_TRUE(AllBytes(b, 0, b.bytes, 0));
    } else {  // the last step's 0x01 bytes in the tensors, zeros between
      EXPECT_TRUE(AllBytes(b, 0, a_end, 1));
      EXPECT_TRUE(AllBytes(b, a_end, b_begin, 0));
      EXPECT_TRUE(AllBytes(b, b_begin, b_end, 1));
      EXPECT_TRUE(AllBytes(b, b_end, b.bytes, 0));
    }
    std::memset(b.data, 1, b.bytes);  // bf16 0x0101: tiny, finite
    ASSERT_TRUE(o.HandOff(b).ok());
    auto report = o.FinishStep();
    ASSERT_TRUE(report.ok()) << report.status().message();
  }
}

}  // namespace
}  // namespace strata
