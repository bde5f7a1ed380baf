// optim::Accumulate against cpu_adam's tested conversions on random bits,
// NaN, Inf and subnormals included.
#include "src/optim/accumulate.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace strata::optim {
namespace {

TEST(AccumulateTest, AddsExactlyWhatConvertWidens) {
  auto cpu = CpuOptimizer::Create({CpuIsa::kScalar, 1});
  ASSERT_TRUE(cpu.ok());
  std::mt19937_64 rng(7);
  for (FloatType type : {FloatType::kBF16, FloatType::kF16, FloatType::kF32}) {
    const size_t n = 70001;  // every 16-bit pattern, and more
    std::vector<uint32_t> src(n);
    for (size_t i = 0; i < n; ++i) {
      src[i] = type == FloatType::kF32 ? static_cast<uint32_t>(rng())
                                       : static_cast<uint32_t>(i & 0xffff);
    }
    std::vector<uint16_t> narrow(n);
    for (size_t i = 0; i < n; ++i) narrow[i] = static_cast<uint16_t>(src[i]);
    const void* data = type == FloatType::kF32
                           ? static_cast<const void*>(src.data())
                           : narrow.data();
    std::vector<float> wide(n);
    if (type == FloatType::kF32) {
      std::memcpy(wide.data(), src.data(), n * 4);
    } else {
      ASSERT_TRUE(
          (*cpu)->Convert(data, type, wide.data(), FloatType::kF32, n).ok());
    }
    std::vector<float> acc(n), expect(n);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    for (size_t i = 0; i < n; ++i) acc[i] = expect[i] = dist(rng);
    for (size_t i = 0; i < n; ++i) expect[i] += wide[i];
    Accumulate(acc.data(), data, type, n);
    EXPECT_EQ(std::memcmp(acc.data(), expect.data(), n * 4), 0)
        << FloatTypeName(type);
  }
}

}  // namespace
}  // namespace strata::optim
