// Test helpers for cpu_adam: typed buffers at chosen misalignments, random
// gradient data with the edge cases the kernels must survive, and the
// optimizer for one ISA (skipping visibly when the CPU lacks it).
#ifndef STRATA_TESTS_CPU_ADAM_CPU_ADAM_UTIL_H_
#define STRATA_TESTS_CPU_ADAM_CPU_ADAM_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
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
  // Whether element i holds the same bytes here and in `other`.
  bool SameAt(const TypedBuffer& other, size_t i) const {
    size_t w = FloatTypeSize(type_);
    return std::memcmp(raw_.data() + offset_ + i * w,
                       other.raw_.data() + other.offset_ + i * w, w) == 0;
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

struct Combo {
  OptimAlgo algo;
  FloatType grad, state;
  FloatType out;         // kF32 here means "no params_out", unless f32_out
  bool f32_out = false;  // an fp32 params_out (with fp32 grads only)
};

inline bool HasState2(OptimAlgo a) {
  return a == OptimAlgo::kAdam || a == OptimAlgo::kAdamW;
}

inline std::string ComboName(const Combo& c) {
  return std::string(OptimAlgoName(c.algo)) +
         " grad=" + std::string(FloatTypeName(c.grad)) +
         " state=" + std::string(FloatTypeName(c.state)) + " out=" +
         (c.f32_out                  ? "f32"
          : c.out == FloatType::kF32 ? "none"
                                     : std::string(FloatTypeName(c.out)));
}

// The buffers of one step, each at its own misalignment.
struct StepState {
  StepState(const Combo& c, size_t n, size_t shift)
      : combo(c),
        p(FloatType::kF32, n, shift % 16),
        g(c.grad, n, (shift + 3) % 16),
        s1(c.state, n, (shift + 5) % 16),
        s2(c.state, HasState2(c.algo) ? n : 0, (shift + 1) % 16),
        out(c.f32_out                  ? FloatType::kF32
            : c.out == FloatType::kF32 ? FloatType::kBF16
                                       : c.out,
            n, (shift + 7) % 16) {}

  OptimBuffers View() {
    OptimBuffers b;
    b.params = static_cast<float*>(p.data());
    b.grads = g.data();
    b.grad_type = g.type();
    b.state1 = s1.data();
    b.state2 = HasState2(combo.algo) ? s2.data() : nullptr;
    b.state_format =
        s1.type() == FloatType::kBF16 ? StateFormat::kBF16 : StateFormat::kF32;
    const bool has_out = combo.f32_out || combo.out != FloatType::kF32;
    b.params_out = has_out ? out.data() : nullptr;
    b.out_type = out.type();
    b.n = p.n();
    return b;
  }

  // Copies every buffer of `other` (the same combo and n) into this one.
  void CopyFrom(const StepState& other) {
    for (auto [to, from] : {std::pair{&p, &other.p},
                            {&g, &other.g},
                            {&s1, &other.s1},
                            {&s2, &other.s2},
                            {&out, &other.out}}) {
      std::memcpy(to->data(), from->data(), from->bytes());
    }
  }
  // The bytes a step may write.
  std::vector<std::vector<uint8_t>> Snapshot() const {
    return {p.Bytes(), s1.Bytes(), s2.Bytes(), out.Bytes()};
  }
  // Whether element i of every buffer a step may write equals `other`'s.
  bool SameAt(const StepState& other, size_t i) const {
    return p.SameAt(other.p, i) && s1.SameAt(other.s1, i) &&
           (!HasState2(combo.algo) || s2.SameAt(other.s2, i)) &&
           out.SameAt(other.out, i);
  }

  Combo combo;
  TypedBuffer p, g, s1, s2, out;
};

inline void FillInitial(StepState& s, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  for (size_t i = 0; i < s.p.n(); ++i) {
    s.p.Set(i, i % 97 == 5 ? 1e6 * u(rng) : 2 * u(rng));
    bool sum_state = s.combo.algo == OptimAlgo::kAdagrad;
    s.s1.Set(i, sum_state ? std::fabs(u(rng)) : 0.1 * u(rng));
    if (HasState2(s.combo.algo)) {
      s.s2.Set(i, i % 10 == 0 ? 0.0 : 0.01 * std::fabs(u(rng)));
    }
  }
}

inline StepOptions OptionsForStep(OptimAlgo algo, int64_t step, int round) {
  StepOptions o;
  o.algo = algo;
  o.hyper.step = step;
  o.hyper.lr = 1e-3 * (1 + round);
  o.hyper.weight_decay = round % 2 == 0 ? 0.01 : 0.0;
  o.hyper.lr_decay = algo == OptimAlgo::kAdagrad ? 1e-4 : 0.0;
  o.hyper.eps = algo == OptimAlgo::kAdagrad ? 1e-10 : 1e-8;
  if (algo == OptimAlgo::kLion) o.hyper.beta2 = 0.99;
  o.prep.grad_scale = round == 1 ? 1.0f / 1024 : 1.0f;
  o.prep.clip_coef = round == 2 ? 0.75f : 1.0f;
  return o;
}

inline std::vector<Combo> AllCombos() {
  std::vector<Combo> combos;
  for (OptimAlgo a : {OptimAlgo::kAdam, OptimAlgo::kAdamW, OptimAlgo::kAdagrad,
                      OptimAlgo::kLion}) {
    for (FloatType g : {FloatType::kF32, FloatType::kBF16, FloatType::kF16}) {
      for (FloatType s : {FloatType::kF32, FloatType::kBF16}) {
        for (FloatType out :
             {FloatType::kF32, FloatType::kBF16, FloatType::kF16}) {
          combos.push_back({a, g, s, out});
        }
        if (g == FloatType::kF32) combos.push_back({a, g, s, g, true});
      }
    }
  }
  return combos;
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
