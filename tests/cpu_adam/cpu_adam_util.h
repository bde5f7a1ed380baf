// Test helpers for cpu_adam: typed buffers at chosen misalignments, random
// gradient data with the edge cases the kernels must survive, and the
// optimizer for one ISA (skipping visibly when the CPU lacks it).
#ifndef STRATA_TESTS_CPU_ADAM_CPU_ADAM_UTIL_H_
#define STRATA_TESTS_CPU_ADAM_CPU_ADAM_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cpu_adam/convert.h"
#include "strata/cpu_adam.h"

namespace strata::test {

// Sizes big enough to be split over two threads (the driver splits from
// 64 Ki elements on). Sanitizer builds (-O0, every access instrumented) use
// the smallest such size; the others also cover many partitions' worth.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr size_t kLargeN = 70001;
inline constexpr int kRandomProbes = 1 << 14;
#else
inline constexpr size_t kLargeN = 300001;
inline constexpr int kRandomProbes = 1 << 20;
#endif

// n elements of `type`, starting `shift` elements past a 64-byte boundary.
class TypedBuffer {
 public:
  TypedBuffer(FloatType type, size_t n, size_t shift)
      : type_(type), n_(n), raw_((n + shift) * FloatTypeSize(type) + 128) {
    auto base = reinterpret_cast<uintptr_t>(raw_.data());
    offset_ = (64 - base % 64) % 64 + shift * FloatTypeSize(type);
  }
  void* data() { return raw_.data() + offset_; }
  const void* data() const { return raw_.data() + offset_; }
  size_t n() const { return n_; }
  size_t bytes() const { return n_ * FloatTypeSize(type_); }
  FloatType type() const { return type_; }

  double Get(size_t i) const {
    const uint8_t* p = raw_.data() + offset_ + i * FloatTypeSize(type_);
    if (type_ == FloatType::kF32) {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return type_ == FloatType::kBF16 ? cpu_adam::Bf16ToF32(h)
                                     : cpu_adam::F16ToF32(h);
  }
  // Stores v rounded to the buffer's type (through fp32).
  void Set(size_t i, double v) {
    uint8_t* p = raw_.data() + offset_ + i * FloatTypeSize(type_);
    float f = static_cast<float>(v);
    if (type_ == FloatType::kF32) return std::memcpy(p, &f, 4), void();
    uint16_t h = type_ == FloatType::kBF16 ? cpu_adam::F32ToBf16(f)
                                           : cpu_adam::F32ToF16(f);
    std::memcpy(p, &h, 2);
  }
  std::vector<uint8_t> Bytes() const {
    const uint8_t* p = raw_.data() + offset_;
    return {p, p + bytes()};
  }

 private:
  FloatType type_;
  size_t n_;
  std::vector<uint8_t> raw_;
  size_t offset_ = 0;
};

// Gradients of mixed magnitude (1e-3..10), with zeros, subnormals
// (1e-40 in fp32, the smallest fp16 ones in fp16) and huge values (1e15;
// fp16 saturates to 6e4) sprinkled in.
inline double RandomGrad(std::mt19937_64& rng, FloatType type) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::uniform_int_distribution<int> kind(0, 99);
  int k = kind(rng);
  if (k < 5) return 0.0;
  if (k < 10) {
    double tiny = type == FloatType::kF16 ? 0x1p-24 : 1e-40;
    return tiny * (1 + 7 * std::fabs(u(rng))) * (u(rng) < 0 ? -1 : 1);
  }
  if (k < 12) return (type == FloatType::kF16 ? 6e4 : 1e15) * u(rng);
  return u(rng) * std::pow(10.0, -3 + 4 * std::fabs(u(rng)));
}

// The optimizer for one path; null (and the test skipped) when the CPU
// lacks it.
inline std::unique_ptr<CpuOptimizer> MakeOptimizer(CpuIsa isa,
                                                   int threads = 2) {
  Result<std::unique_ptr<CpuOptimizer>> opt =
      CpuOptimizer::Create({.isa = isa, .threads = threads});
  if (!opt.ok()) return nullptr;
  return std::move(*opt);
}

#define STRATA_OPTIMIZER_OR_SKIP(var, isa, ...)                          \
  std::unique_ptr<CpuOptimizer> var = MakeOptimizer(isa, ##__VA_ARGS__); \
  if (var == nullptr) {                                                  \
    GTEST_SKIP() << "this CPU lacks the " << CpuIsaName(isa) << " path"; \
  }

}  // namespace strata::test

#endif  // STRATA_TESTS_CPU_ADAM_CPU_ADAM_UTIL_H_
