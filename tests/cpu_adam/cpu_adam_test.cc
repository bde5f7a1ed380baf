// Every path (scalar, AVX2, AVX-512) against a float64 reference, for every
// optimizer, gradient type, state type and output type, over several steps
// (including step 1 and step 10000), at sizes that are not multiples of the
// vector width and from unaligned starts; and bit-identical to the scalar
// path. Tolerances: Note [Tolerances] in reference.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tests/cpu_adam/cpu_adam_util.h"
#include "tests/cpu_adam/reference.h"

namespace strata::test {
namespace {

::testing::AssertionResult Near(const char* what, size_t i, double got,
                                double want, double tol) {
  if (std::fabs(got - want) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << "[" << i << "] = " << got << ", reference " << want
         << ", error " << std::fabs(got - want) << " > tolerance " << tol
         << " (" << tol / UlpF32(want) << " ulp)";
}

// Checks one element of the step just taken against the reference.
::testing::AssertionResult CheckElement(const StepState& s,
                                        const StepOptions& o, size_t i,
                                        double p0, double g0, double s10,
                                        double s20) {
  RefOut r = RefStep(o.algo, MakeRefConsts(o), p0, g0, s10, s20);
  const bool bf16_state = s.combo.state == FloatType::kBF16;
  auto state_tol = [&](double tol, double got, double want) {
    return bf16_state ? tol + UlpBf16(std::max(std::fabs(got), std::fabs(want)))
                      : tol;
  };
  if (!r.p_sign_ambiguous) {
    auto res = Near("params", i, s.p.Get(i), r.p, r.tol_p);
    if (!res) return res;
  }
  auto res = Near("state1", i, s.s1.Get(i), r.s1,
                  state_tol(r.tol_s1, s.s1.Get(i), r.s1));
  if (!res) return res;
  if (HasState2(s.combo.algo)) {
    res = Near("state2", i, s.s2.Get(i), r.s2,
               state_tol(r.tol_s2, s.s2.Get(i), r.s2));
    if (!res) return res;
  }
  if (s.combo.f32_out) {
    const float p = static_cast<float>(s.p.Get(i));
    float got;
    std::memcpy(&got, static_cast<const uint8_t*>(s.out.data()) + 4 * i, 4);
    if (std::memcmp(&got, &p, 4) != 0) {
      return ::testing::AssertionFailure()
             << "params_out[" << i << "] = " << got << ", params " << p;
    }
  } else if (s.combo.out != FloatType::kF32) {
    float p = static_cast<float>(s.p.Get(i));
    uint16_t want = s.combo.out == FloatType::kBF16 ? cpu_adam::F32ToBf16(p)
                                                    : cpu_adam::F32ToF16(p);
    uint16_t got;
    std::memcpy(&got, static_cast<const uint8_t*>(s.out.data()) + 2 * i, 2);
    if (got != want) {
      return ::testing::AssertionFailure()
             << "params_out[" << i << "] = 0x" << std::hex << got
             << ", round-to-nearest-even of " << p << " is 0x" << want;
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Applied(CpuOptimizer& opt, const StepOptions& o,
                                   StepState& s) {
  Result<StepReport> r = opt.Step(o, s.View());
  if (!r.ok()) return ::testing::AssertionFailure() << r.status().ToString();
  if (r->outcome != StepOutcome::kApplied) {
    return ::testing::AssertionFailure() << "the step was not applied";
  }
  return ::testing::AssertionSuccess();
}

// Runs steps 1, 2, 3 and 10000 on `opt` and on the scalar path side by side.
void RunCombo(CpuOptimizer& opt, CpuOptimizer& scalar, const Combo& c, size_t n,
              size_t shift, uint64_t seed) {
  SCOPED_TRACE(ComboName(c) + " n=" + std::to_string(n) +
               " shift=" + std::to_string(shift));
  std::mt19937_64 rng(seed);
  StepState s(c, n, shift), ref(c, n, shift);
  FillInitial(s, rng);
  const int64_t steps[] = {1, 2, 3, 10000};
  for (int round = 0; round < 4; ++round) {
    for (size_t i = 0; i < n; ++i) s.g.Set(i, RandomGrad(rng, c.grad));
    ref.CopyFrom(s);
    std::vector<double> p0(n), g0(n), s10(n), s20(n);
    for (size_t i = 0; i < n; ++i) {
      p0[i] = s.p.Get(i);
      g0[i] = s.g.Get(i);
      s10[i] = s.s1.Get(i);
      s20[i] = HasState2(c.algo) ? s.s2.Get(i) : 0;
    }
    StepOptions o = OptionsForStep(c.algo, steps[round], round);
    Result<StepReport> a = opt.Step(o, s.View());
    Result<StepReport> b = scalar.Step(o, ref.View());
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_EQ(a->outcome, StepOutcome::kApplied);
    int failures = 0;
    for (size_t i = 0; i < n && failures < 5; ++i) {
      auto res = CheckElement(s, o, i, p0[i], g0[i], s10[i], s20[i]);
      if (!res) {
        ADD_FAILURE() << "step " << o.hyper.step << ": " << res.message();
        ++failures;
      }
    }
    ASSERT_EQ(failures, 0);
    // The reference path now takes the same step; every byte must agree.
    ASSERT_EQ(s.Snapshot(), ref.Snapshot())
        << "differs from the scalar path at step " << o.hyper.step;
  }
}

class KernelTest : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(KernelTest, EveryCombinationMatchesReference) {
  STRATA_OPTIMIZER_OR_SKIP(opt, GetParam());
  STRATA_OPTIMIZER_OR_SKIP(scalar, CpuIsa::kScalar);
  uint64_t seed = 1;
  for (const Combo& c : AllCombos()) {
    for (size_t n : {1, 7, 16, 17, 33, 1003}) {
      RunCombo(*opt, *scalar, c, n, seed % 16, seed);
      if (HasFatalFailure()) return;
      ++seed;
    }
  }
}

// Large enough to be split over threads (page-aligned partitions).
TEST_P(KernelTest, MultiThreadedMatchesReference) {
  STRATA_OPTIMIZER_OR_SKIP(opt, GetParam());
  STRATA_OPTIMIZER_OR_SKIP(scalar, CpuIsa::kScalar, 1);
  RunCombo(
      *opt, *scalar,
      {OptimAlgo::kAdamW, FloatType::kBF16, FloatType::kF32, FloatType::kBF16},
      kLargeN, 3, 99);
  RunCombo(
      *opt, *scalar,
      {OptimAlgo::kAdam, FloatType::kF32, FloatType::kBF16, FloatType::kF16},
      kLargeN + 2, 0, 100);
}

// One inf or NaN gradient, in turn at every position of a few vectors (so
// in every lane of every path, in the unaligned head and in the tail), for
// every combination: kSkipStep writes nothing; kStopAtNonFinite leaves each
// element either untouched or as a clean step leaves it, never updates the
// bad one, and stores nothing non-finite.
TEST_P(KernelTest, NonFiniteGradientInEveryLaneOfEveryCombination) {
  STRATA_OPTIMIZER_OR_SKIP(opt, GetParam());
  constexpr size_t n = 53;
  uint64_t seed = 1;
  for (const Combo& c : AllCombos()) {
    SCOPED_TRACE(ComboName(c));
    std::mt19937_64 rng(seed);
    const size_t shift = seed++ % 16;
    StepState base(c, n, shift), clean(c, n, shift), s(c, n, shift);
    FillInitial(base, rng);
    for (size_t i = 0; i < n; ++i) base.g.Set(i, RandomGrad(rng, c.grad));
    clean.CopyFrom(base);
    StepOptions o = OptionsForStep(c.algo, 7, 0);
    ASSERT_TRUE(Applied(*opt, o, clean));
    for (size_t at = 0; at < n; ++at) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()}) {
        SCOPED_TRACE("at=" + std::to_string(at) + " " + std::to_string(bad));
        for (OverflowPolicy policy :
             {OverflowPolicy::kSkipStep, OverflowPolicy::kStopAtNonFinite}) {
          s.CopyFrom(base);
          s.g.Set(at, bad);
          o.overflow = policy;
          Result<StepReport> r = opt->Step(o, s.View());
          ASSERT_TRUE(r.ok()) << r.status().ToString();
          if (policy == OverflowPolicy::kSkipStep) {
            ASSERT_EQ(r->outcome, StepOutcome::kSkipped);
            ASSERT_EQ(s.Snapshot(), base.Snapshot());
            continue;
          }
          ASSERT_EQ(r->outcome, StepOutcome::kPartial);
          ASSERT_TRUE(s.SameAt(base, at));
          for (size_t i = 0; i < n; ++i) {
            ASSERT_TRUE(s.SameAt(base, i) || s.SameAt(clean, i)) << i;
            ASSERT_TRUE(std::isfinite(s.p.Get(i)) &&
                        std::isfinite(s.s1.Get(i)) &&
                        (!HasState2(c.algo) || std::isfinite(s.s2.Get(i))))
                << i;
          }
        }
      }
    }
  }
}

// Lion's update is sign(beta1 * m + (1 - beta1) * g), and sign(0) is 0 (as
// torch.sign): a parameter with zero momentum and a zero gradient only
// decays. A path that took sign(0) as +1 would move it by lr every step.
TEST_P(KernelTest, LionLeavesZeroMomentumAndZeroGradientAlone) {
  STRATA_OPTIMIZER_OR_SKIP(opt, GetParam());
  const Combo c{OptimAlgo::kLion, FloatType::kF32, FloatType::kF32,
                FloatType::kF32};
  constexpr size_t n = 37;
  StepState s(c, n, 1);
  std::vector<float> p0(n);
  for (size_t i = 0; i < n; ++i) {
    p0[i] = 0.25f * static_cast<float>(i) - 4;
    s.p.Set(i, p0[i]);
    s.g.Set(i, i % 2 == 0 ? 0.0 : -0.0);
    s.s1.Set(i, i % 3 == 0 ? 0.0 : -0.0);
  }
  StepOptions o = OptionsForStep(c.algo, 1, 0);
  ASSERT_TRUE(Applied(*opt, o, s));
  const float decay =
      static_cast<float>(1.0 - o.hyper.lr * o.hyper.weight_decay);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(s.p.Get(i), p0[i] * decay) << i;
    EXPECT_EQ(s.s1.Get(i), 0.0) << i;
  }
}

// The caller owns the step count and every buffer: ten steps in one go give
// the same bytes as five steps, a copy of the buffers into new memory at
// other alignments (as a checkpoint restore does), a new optimizer with
// another thread count, and steps 6 to 10.
TEST_P(KernelTest, ResumedRunIsBitIdentical) {
  for (const Combo& c : {Combo{OptimAlgo::kAdamW, FloatType::kBF16,
                               FloatType::kF32, FloatType::kBF16},
                         Combo{OptimAlgo::kAdam, FloatType::kF16,
                               FloatType::kBF16, FloatType::kF32},
                         Combo{OptimAlgo::kAdagrad, FloatType::kF32,
                               FloatType::kF32, FloatType::kF16},
                         Combo{OptimAlgo::kLion, FloatType::kBF16,
                               FloatType::kBF16, FloatType::kF32}}) {
    SCOPED_TRACE(ComboName(c));
    STRATA_OPTIMIZER_OR_SKIP(first, GetParam(), 2);
    STRATA_OPTIMIZER_OR_SKIP(resumed, GetParam(), 1);
    const size_t n = 70001;  // split in two by `first`
    std::mt19937_64 rng(5);
    StepState straight(c, n, 0), before(c, n, 0), after(c, n, 9);
    FillInitial(straight, rng);
    before.CopyFrom(straight);
    for (int64_t step = 1; step <= 10; ++step) {
      for (size_t i = 0; i < n; ++i) {
        straight.g.Set(i, RandomGrad(rng, c.grad));
      }
      StepOptions o = OptionsForStep(c.algo, step, static_cast<int>(step % 4));
      StepState& s = step <= 5 ? before : after;
      if (step == 6) after.CopyFrom(before);
      std::memcpy(s.g.data(), straight.g.data(), straight.g.bytes());
      ASSERT_TRUE(Applied(*first, o, straight));
      ASSERT_TRUE(Applied(step <= 5 ? *first : *resumed, o, s));
    }
    EXPECT_EQ(after.Snapshot(), straight.Snapshot());
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, KernelTest,
                         ::testing::Values(CpuIsa::kScalar, CpuIsa::kAvx2,
                                           CpuIsa::kAvx512),
                         [](const auto& info) {
                           return std::string(CpuIsaName(info.param));
                         });

}  // namespace
}  // namespace strata::test
