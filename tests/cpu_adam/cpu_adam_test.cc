// Every path (scalar, AVX2, AVX-512) against a float64 reference, for every
// optimizer, gradient type, state type and output type, over several steps
// (including step 1 and step 10000), at sizes that are not multiples of the
// vector width and from unaligned starts; and bit-identical to the scalar
// path. Tolerances: Note [Tolerances] in reference.h.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tests/cpu_adam/cpu_adam_util.h"
#include "tests/cpu_adam/reference.h"

namespace strata::test {
namespace {

struct Combo {
  OptimAlgo algo;
  FloatType grad, state;
  FloatType out;  // kF32 here means "no params_out"
};

bool HasState2(OptimAlgo a) {
  return a == OptimAlgo::kAdam || a == OptimAlgo::kAdamW;
}

std::string ComboName(const Combo& c) {
  return std::string(OptimAlgoName(c.algo)) +
         " grad=" + std::string(FloatTypeName(c.grad)) +
         " state=" + std::string(FloatTypeName(c.state)) + " out=" +
         (c.out == FloatType::kF32 ? "none"
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
        out(c.out == FloatType::kF32 ? FloatType::kBF16 : c.out, n,
            (shift + 7) % 16) {}

  OptimBuffers View() {
    OptimBuffers b;
    b.params = static_cast<float*>(p.data());
    b.grads = g.data();
    b.grad_type = g.type();
    b.state1 = s1.data();
    b.state2 = HasState2(combo.algo) ? s2.data() : nullptr;
    b.state_type = s1.type();
    b.params_out = combo.out == FloatType::kF32 ? nullptr : out.data();
    b.out_type = out.type();
    b.n = p.n();
    return b;
  }

  Combo combo;
  TypedBuffer p, g, s1, s2, out;
};

void FillInitial(StepState& s, std::mt19937_64& rng) {
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

StepOptions OptionsForStep(OptimAlgo algo, int64_t step, int round) {
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
    return bf16_state
               ? tol + 0.5 * UlpBf16(std::max(std::fabs(got), std::fabs(want)))
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
  if (s.combo.out != FloatType::kF32) {
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
    for (TypedBuffer* b : {&s.p, &s.g, &s.s1, &s.s2}) {
      TypedBuffer* r = b == &s.p    ? &ref.p
                       : b == &s.g  ? &ref.g
                       : b == &s.s1 ? &ref.s1
                                    : &ref.s2;
      std::memcpy(r->data(), b->data(), b->bytes());
    }
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
    for (auto [x, y] : {std::pair{&s.p, &ref.p},
                        {&s.s1, &ref.s1},
                        {&s.s2, &ref.s2},
                        {&s.out, &ref.out}}) {
      ASSERT_EQ(x->Bytes(), y->Bytes())
          << "differs from the scalar path at step " << o.hyper.step;
    }
  }
}

std::vector<Combo> AllCombos() {
  std::vector<Combo> combos;
  for (OptimAlgo a : {OptimAlgo::kAdam, OptimAlgo::kAdamW, OptimAlgo::kAdagrad,
                      OptimAlgo::kLion}) {
    for (FloatType g : {FloatType::kF32, FloatType::kBF16, FloatType::kF16}) {
      for (FloatType s : {FloatType::kF32, FloatType::kBF16}) {
        for (FloatType out :
             {FloatType::kF32, FloatType::kBF16, FloatType::kF16}) {
          combos.push_back({a, g, s, out});
        }
      }
    }
  }
  return combos;
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

INSTANTIATE_TEST_SUITE_P(Isa, KernelTest,
                         ::testing::Values(CpuIsa::kScalar, CpuIsa::kAvx2,
                                           CpuIsa::kAvx512),
                         [](const auto& info) {
                           return std::string(CpuIsaName(info.param));
                         });

}  // namespace
}  // namespace strata::test
