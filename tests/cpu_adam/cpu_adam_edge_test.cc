// cpu_adam beyond the arithmetic: overflow policies, the sum of squares,
// fp32 <-> bf16/fp16 conversions bit for bit, bad input, and threading
// (caller arenas, thread counts). Every ISA-dependent case runs per path.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "cpu_adam/dispatch.h"
#include "tests/cpu_adam/cpu_adam_util.h"

namespace strata::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// An AdamW problem with f32 state, bf16 gradients and a bf16 output.
struct Problem {
  explicit Problem(size_t n)
      : p(FloatType::kF32, n, 1),
        g(FloatType::kBF16, n, 2),
        m(FloatType::kF32, n, 3),
        v(FloatType::kF32, n, 4),
        out(FloatType::kBF16, n, 5) {
    std::mt19937_64 rng(n);
    for (size_t i = 0; i < n; ++i) {
      p.Set(i, std::ldexp(1.0, static_cast<int>(i % 7)) - 3);
      g.Set(i, RandomGrad(rng, FloatType::kBF16));
      m.Set(i, 1e-3 * static_cast<double>(i % 13));
      v.Set(i, 1e-4 * static_cast<double>(i % 5));
      out.Set(i, 7.0);
    }
  }
  OptimBuffers View() {
    OptimBuffers b;
    b.params = static_cast<float*>(p.data());
    b.grads = g.data();
    b.grad_type = FloatType::kBF16;
    b.state1 = m.data();
    b.state2 = v.data();
    b.params_out = out.data();
    b.n = p.n();
    return b;
  }
  std::vector<std::vector<uint8_t>> Snapshot() const {
    return {p.Bytes(), m.Bytes(), v.Bytes(), out.Bytes()};
  }
  TypedBuffer p, g, m, v, out;
};

StepOptions Options(OverflowPolicy policy) {
  StepOptions o;
  o.hyper.weight_decay = 0.01;
  o.hyper.step = 7;
  o.overflow = policy;
  return o;
}

class IsaTest : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(IsaTest, SkipOnOverflowLeavesEveryByteUnchanged) {
  STRATA_OPTIMIZER_OR_SKIP(opt, GetParam());
  for (size_t n : {size_t{1}, size_t{1003}, kLargeN}) {
    for (size_t at : {size_t{0}, n / 2, n - 1}) {
      for (float bad : {kNaN, kInf, -kInf}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " at=" + std::to_string(at) +
                     " value=" + std::to_string(bad));
        Problem pr(n);
        pr.g.Set(at, bad);
        auto before = pr.Snapshot();
        Result<StepReport> r =
            opt->Step(Options(OverflowPolicy::kSkipStep), pr.View());
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        EXPECT_EQ(r->outcome, StepOutcome::kSkipped);
        EXPECT_TRUE(r->overflow());
        EXPECT_EQ(pr.Snapshot(), before);
      }
    }
  }
}

// A finite gradient that the unscale multiply turns into inf is overflow too.
TEST_P(IsaTest, OverflowFromScalingIsDetected) {
  STRATA_OPTIMIZER_OR_SKIP(opt, GetParam());
  Problem pr(100);
  pr.g.Set(42, 3e38);
  auto before = pr.Snapshot();
  StepOptions o = Options(OverflowPolicy::kSkipStep);
  o.prep.grad_scale = 4.0f;
  Result<StepReport> r = opt->Step(o, pr.View());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, StepOutcome::kSkipped);
  EXPECT_EQ(pr.Snapshot(), before);
}

// kStopAtNonFinite: every element is either untouched or holds exactly the
// update of a clean run, the bad one is untouched, and nothing non-finite
// is stored.
TEST_P(IsaTest, StopAtNonFiniteNeverStoresPoison) {
  STRATA_OPTIMIZER_OR_SKIP(opt, GetParam());
  const size_t n = kLargeN;
  for (size_t at : {size_t{5}, n / 2, n - 2}) {
    SCOPED_TRACE("at=" + std::to_string(at));
    Problem pr(n), clean(n);
    pr.g.Set(at, kNaN);
    auto before = pr.Snapshot();
    ASSERT_TRUE(
        opt->Step(Options(OverflowPolicy::kStopAtNonFinite), clean.View())
            .ok());
    Result<StepReport> r =
        opt->Step(Options(OverflowPolicy::kStopAtNonFinite), pr.View());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->outcome, StepOutcome::kPartial);
    auto after = pr.Snapshot();
    auto done = clean.Snapshot();
    for (size_t i = 0; i < n; ++i) {
      bool untouched = true, updated = true;
      for (int b = 0; b < 4; ++b) {
        size_t w = b == 3 ? 2 : 4;
        for (size_t k = 0; k < w; ++k) {
          untouched &= after[b][i * w + k] == before[b][i * w + k];
          updated &= after[b][i * w + k] == done[b][i * w + k];
        }
      }
      ASSERT_TRUE(untouched || updated) << "element " << i;
      if (i == at) {
        ASSERT_TRUE(untouched);
      }
      ASSERT_TRUE(std::isfinite(pr.p.Get(i)) && std::isfinite(pr.m.Get(i)) &&
                  std::isfinite(pr.v.Get(i)));
    }
  }
}

TEST_P(IsaTest, SumSquaresIsExactOrderedAndFlagsNonFinite) {
  STRATA_OPTIMIZER_OR_SKIP(opt, GetParam());
  STRATA_OPTIMIZER_OR_SKIP(one, CpuIsa::kScalar, 1);
  for (FloatType t : {FloatType::kF32, FloatType::kBF16, FloatType::kF16}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{1003}, kLargeN}) {
      SCOPED_TRACE(std::string(FloatTypeName(t)) + " n=" + std::to_string(n));
      TypedBuffer g(t, n, 3);
      std::mt19937_64 rng(n);
      long double want = 0;
      for (size_t i = 0; i < n; ++i) {
        g.Set(i, RandomGrad(rng, t));
        want += static_cast<long double>(g.Get(i)) * g.Get(i);
      }
      Result<SumSquaresResult> a = opt->SumSquares(g.data(), t, n);
      Result<SumSquaresResult> b = one->SumSquares(g.data(), t, n);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_TRUE(a->finite);
      EXPECT_NEAR(a->sum, static_cast<double>(want),
                  1e-12 * static_cast<double>(want));
      EXPECT_EQ(std::bit_cast<uint64_t>(a->sum),
                std::bit_cast<uint64_t>(b->sum))
          << "the sum must not depend on the ISA or the thread count";
      if (n == 0) continue;
      g.Set(n / 2, kInf);
      EXPECT_FALSE(opt->SumSquares(g.data(), t, n)->finite);
      g.Set(n / 2, kNaN);
      EXPECT_FALSE(opt->SumSquares(g.data(), t, n)->finite);
    }
  }
}

// Floats that probe every rounding decision of a 16-bit format: for each
// 16-bit value, the midpoint to its successor and its two neighbours, plus
// NaN payloads, infinities, zeros and random bit patterns.
std::vector<float> RoundingProbes(float (*decode)(uint16_t)) {
  std::vector<float> probes = {0.0f, -0.0f, kInf, -kInf, kNaN};
  for (uint32_t bits : {0x7F800001u, 0x7FBFFFFFu, 0xFFC00001u, 0x7FC0DEADu,
                        0x00000001u, 0x807FFFFFu, 0x477FF000u, 0x477FEFFFu}) {
    probes.push_back(std::bit_cast<float>(bits));
  }
  for (uint32_t h = 0; h < 0xFFFF; ++h) {
    double a = decode(static_cast<uint16_t>(h));
    double b = decode(static_cast<uint16_t>(h + 1));
    if (!std::isfinite(a) || !std::isfinite(b) || (h & 0x7FFF) == 0x7FFF) {
      continue;
    }
    float mid = static_cast<float>((a + b) / 2);
    probes.insert(probes.end(),
                  {mid, std::nextafter(mid, -kInf), std::nextafter(mid, kInf)});
  }
  std::mt19937 rng(7);
  for (int i = 0; i < kRandomProbes; ++i) {
    probes.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  }
  return probes;
}

// Round to nearest even into bf16 from the two bf16 neighbours of x and
// their exact distances in double, independently of convert.h's integer
// trick. x must not be NaN.
uint16_t Bf16Oracle(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  auto lo = static_cast<uint16_t>(bits >> 16);  // the neighbour towards 0
  if ((bits & 0xFFFFu) == 0) return lo;
  double below = std::fabs(std::bit_cast<float>(uint32_t{lo} << 16));
  int biased_exp = std::max((lo >> 7) & 0xFF, 1);
  double above = below + std::ldexp(1.0, biased_exp - 127 - 7);
  double to_below = std::fabs(x) - below, to_above = above - std::fabs(x);
  bool up = to_above < to_below || (to_above == to_below && (lo & 1) != 0);
  return up ? lo + 1 : lo;  // lo + 1 is the next bf16 away from 0 (or inf)
}

// The compiler's own fp32 -> _Float16 conversion (libgcc, round to nearest
// even).
uint16_t F16Oracle(float x) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(x));
}

bool IsNan16(FloatType type, uint16_t h) {
  return type == FloatType::kBF16 ? (h & 0x7FFF) > 0x7F80
                                  : (h & 0x7FFF) > 0x7C00;
}

// Every path against the reference conversions of convert.h, and those
// against independent oracles; a NaN must stay a NaN of the same sign.
TEST_P(IsaTest, ConversionsAreBitExact) {
  STRATA_OPTIMIZER_OR_SKIP(opt, GetParam());
  struct Format {
    FloatType type;
    uint16_t (*encode)(float);
    float (*decode)(uint16_t);
    uint16_t (*oracle)(float);
  };
  for (Format f : {Format{FloatType::kBF16, cpu_adam::F32ToBf16,
                          cpu_adam::Bf16ToF32, Bf16Oracle},
                   Format{FloatType::kF16, cpu_adam::F32ToF16,
                          cpu_adam::F16ToF32, F16Oracle}}) {
    SCOPED_TRACE(FloatTypeName(f.type));
    std::vector<uint16_t> all(65536);
    for (size_t h = 0; h < all.size(); ++h) all[h] = static_cast<uint16_t>(h);
    std::vector<float> wide(all.size());
    ASSERT_TRUE(opt->Convert(all.data(), f.type, wide.data(), FloatType::kF32,
                             all.size())
                    .ok());
    for (size_t h = 0; h < all.size(); ++h) {
      ASSERT_EQ(std::bit_cast<uint32_t>(wide[h]),
                std::bit_cast<uint32_t>(f.decode(all[h])))
          << "decoding 0x" << std::hex << h;
    }
    std::vector<float> probes = RoundingProbes(f.decode);
    std::vector<uint16_t> narrow(probes.size());
    ASSERT_TRUE(opt->Convert(probes.data(), FloatType::kF32, narrow.data(),
                             f.type, probes.size())
                    .ok());
    for (size_t i = 0; i < probes.size(); ++i) {
      uint32_t bits = std::bit_cast<uint32_t>(probes[i]);
      ASSERT_EQ(narrow[i], f.encode(probes[i]))
          << "encoding 0x" << std::hex << bits;
      if (std::isnan(probes[i])) {
        ASSERT_TRUE(IsNan16(f.type, narrow[i]) &&
                    (narrow[i] >> 15) == (bits >> 31))
            << "NaN 0x" << std::hex << bits << " became 0x" << narrow[i];
      } else {
        ASSERT_EQ(narrow[i], f.oracle(probes[i]))
            << "encoding 0x" << std::hex << bits;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, IsaTest,
                         ::testing::Values(CpuIsa::kScalar, CpuIsa::kAvx2,
                                           CpuIsa::kAvx512),
                         [](const auto& info) {
                           return std::string(CpuIsaName(info.param));
                         });

void ExpectInvalid(Result<StepReport> r, const std::string& words) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(words), std::string::npos)
      << r.status().message();
}

TEST(CpuAdamInput, BadBuffersAreRejectedBeforeAnyWrite) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto);
  Problem pr(1000);
  auto before = pr.Snapshot();
  StepOptions o = Options(OverflowPolicy::kSkipStep);
  OptimBuffers b = pr.View();
  b.params = nullptr;
  ExpectInvalid(opt->Step(o, b), "must not be null");
  b = pr.View();
  b.state1 = static_cast<float*>(pr.p.data()) + 999;
  ExpectInvalid(opt->Step(o, b), "params and state1 overlap");
  b = pr.View();
  b.params_out = static_cast<uint8_t*>(pr.v.data()) + 2;
  ExpectInvalid(opt->Step(o, b), "state2 and params_out overlap");
  b = pr.View();
  b.state2 = nullptr;
  ExpectInvalid(opt->Step(o, b), "state2 (exp_avg_sq) must not be null");
  b = pr.View();
  o.algo = OptimAlgo::kLion;
  ExpectInvalid(opt->Step(o, b), "pass state2 = null");
  o.algo = OptimAlgo::kAdamW;
  b.state_format = static_cast<StateFormat>(7);
  ExpectInvalid(opt->Step(o, b), "not a StateFormat");
  b = pr.View();
  b.state1_scale = static_cast<float*>(pr.out.data());
  ExpectInvalid(opt->Step(o, b), "for 8-bit state only");
  b = pr.View();
  b.state_format = StateFormat::kQ8;
  ExpectInvalid(opt->Step(o, b), "needs state1_scale and state2_scale");
  o.algo = OptimAlgo::kLion;
  b.state2 = nullptr;
  ExpectInvalid(opt->Step(o, b), "for Adam and AdamW");
  o.algo = OptimAlgo::kAdamW;
  b = pr.View();
  b.out_type = static_cast<FloatType>(9);
  ExpectInvalid(opt->Step(o, b), "out_type is not a FloatType");
  b.out_type = FloatType::kF32;
  b.grad_type = FloatType::kBF16;
  ExpectInvalid(opt->Step(o, b), "an fp32 params_out needs fp32 grads");
  EXPECT_EQ(pr.Snapshot(), before);
}

// An n whose bytes would wrap around the address space cannot be a buffer's
// length; the overlap check must not be fooled by the wrapped end.
TEST(CpuAdamInput, AnImpossibleLengthIsRejected) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto);
  Problem pr(1000);
  auto before = pr.Snapshot();
  OptimBuffers b = pr.View();
  b.n = SIZE_MAX / 4 + 2;
  b.state1 = static_cast<float*>(pr.p.data()) + 1;
  ExpectInvalid(opt->Step(Options(OverflowPolicy::kSkipStep), b),
                "run past the end of the address space");
  EXPECT_EQ(pr.Snapshot(), before);
  Result<SumSquaresResult> ss =
      opt->SumSquares(pr.g.data(), FloatType::kBF16, SIZE_MAX / 2 + 1);
  ASSERT_FALSE(ss.ok());
  EXPECT_EQ(ss.status().code(), StatusCode::kInvalidArgument);
  Status cv = opt->Convert(pr.p.data(), FloatType::kF32, pr.out.data(),
                           FloatType::kBF16, SIZE_MAX / 4 + 2);
  EXPECT_EQ(cv.code(), StatusCode::kInvalidArgument);
}

// An empty step reads and writes nothing, so its buffers may be null (as
// the data pointer of an empty tensor is); its types are still checked.
TEST(CpuAdamInput, AnEmptyStepAcceptsNullBuffers) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto);
  OptimBuffers empty;
  Result<StepReport> r = opt->Step(Options(OverflowPolicy::kSkipStep), empty);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, StepOutcome::kApplied);
  empty.state_format = static_cast<StateFormat>(7);
  ExpectInvalid(opt->Step(Options(OverflowPolicy::kSkipStep), empty),
                "not a StateFormat");
  empty.state_format = StateFormat::kQ8;  // no scales needed for none
  EXPECT_TRUE(opt->Step(Options(OverflowPolicy::kSkipStep), empty).ok());
}

TEST(CpuAdamInput, BadHyperparametersAreRejected) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto);
  Problem pr(10);
  auto check = [&](auto mutate, const std::string& words) {
    StepOptions o = Options(OverflowPolicy::kSkipStep);
    mutate(o);
    ExpectInvalid(opt->Step(o, pr.View()), words);
  };
  check([](StepOptions& o) { o.hyper.lr = std::nan(""); }, "lr must be");
  check([](StepOptions& o) { o.hyper.eps = 0; }, "eps must be");
  check([](StepOptions& o) { o.hyper.beta2 = 1.0; }, "beta1 and beta2");
  check([](StepOptions& o) { o.hyper.step = 0; }, "step must be >= 1");
  check([](StepOptions& o) { o.hyper.weight_decay = -1; }, "weight_decay");
  check([](StepOptions& o) { o.prep.grad_scale = 0; }, "grad_scale");
  check([](StepOptions& o) { o.prep.clip_coef = kInf; }, "clip_coef");
  check([](StepOptions& o) { o.hyper.lr = 1e39; }, "overflows fp32");
  check([](StepOptions& o) { o.hyper.eps = 1e-46; }, "eps rounds to 0");
  check(
      [](StepOptions& o) {
        o.prep.grad_scale = 1e30f;
        o.prep.clip_coef = 1e30f;
      },
      "overflows fp32");
  check([](StepOptions& o) { o.overflow = static_cast<OverflowPolicy>(7); },
        "not an OverflowPolicy");
}

TEST(CpuAdamInput, BadIsaAndThreadRequestsAreExplained) {
  setenv("STRATA_CPU_ISA", "sse9", 1);
  auto bad = CpuOptimizer::Create();
  unsetenv("STRATA_CPU_ISA");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'sse9'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("scalar, avx2 or avx512"),
            std::string::npos);
  // A CPU with neither AVX2 nor AVX-512, acted out with a fake CPUID.
  auto scalar_only = [](CpuIsa isa) {
    return isa == CpuIsa::kScalar || isa == CpuIsa::kAuto;
  };
  EXPECT_EQ(*cpu_adam::ChooseIsa(CpuIsa::kAuto, nullptr, scalar_only),
            CpuIsa::kScalar);
  EXPECT_EQ(*cpu_adam::ChooseIsa(CpuIsa::kAuto, "scalar", scalar_only),
            CpuIsa::kScalar);
  for (const char* env : {"avx2", "avx512"}) {
    Result<CpuIsa> lacking =
        cpu_adam::ChooseIsa(CpuIsa::kAuto, env, scalar_only);
    ASSERT_FALSE(lacking.ok());
    EXPECT_EQ(lacking.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(lacking.status().message().find("this CPU lacks it"),
              std::string::npos);
  }
  EXPECT_FALSE(cpu_adam::ChooseIsa(CpuIsa::kAvx512, nullptr, scalar_only).ok());
  for (int threads : {-2, 1 << 20}) {
    auto bad_threads = CpuOptimizer::Create({.threads = threads});
    ASSERT_FALSE(bad_threads.ok());
    EXPECT_EQ(bad_threads.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(CpuAdamInput, ConvertRejectsBadRequests) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto);
  std::vector<float> a(64), b(64);
  Status same =
      opt->Convert(a.data(), FloatType::kF32, b.data(), FloatType::kF32, 64);
  EXPECT_NE(same.message().find("exactly one side must be f32"),
            std::string::npos);
  Status overlap = opt->Convert(a.data(), FloatType::kF32, a.data() + 8,
                                FloatType::kBF16, 64);
  EXPECT_NE(overlap.message().find("overlap"), std::string::npos);
}

// The same step in a private arena of 2 and 3 threads and in a caller's
// 1-thread arena: identical bytes, and the caller's arena is used.
TEST(CpuAdamThreads, ResultDoesNotDependOnThreadsOrArena) {
  const size_t n = kLargeN;
  Problem two(n), three(n), caller(n);
  STRATA_OPTIMIZER_OR_SKIP(opt2, CpuIsa::kAuto, 2);
  STRATA_OPTIMIZER_OR_SKIP(opt3, CpuIsa::kAuto, 3);
  STRATA_OPTIMIZER_OR_SKIP(in_caller, CpuIsa::kAuto,
                           CpuOptimizerOptions::kCallerArena);
  StepOptions o = Options(OverflowPolicy::kSkipStep);
  ASSERT_TRUE(opt2->Step(o, two.View()).ok());
  ASSERT_TRUE(opt3->Step(o, three.View()).ok());
  EXPECT_EQ(opt3->threads(), 3);
  tbb::task_arena arena(1);
  arena.execute([&] {
    EXPECT_EQ(in_caller->threads(), 1);
    ASSERT_TRUE(in_caller->Step(o, caller.View()).ok());
  });
  EXPECT_EQ(two.Snapshot(), three.Snapshot());
  EXPECT_EQ(two.Snapshot(), caller.Snapshot());
}

// bf16 state rounds stochastically (StateFormat::kBF16): m = 1 times beta1
// = 0.999 lies between the bf16 values 0.99609375 and 1, and rounded to
// nearest it would stay 1 for good; rounded stochastically each element
// takes one of the two and their mean is 0.999 (its standard error here is
// 7e-6). The same seed and step give the same bytes, another seed others.
TEST(CpuAdamBf16State, RoundsStochasticallyAndDecaysOnAverage) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto);
  constexpr size_t kN = 1 << 16;
  auto run = [&](uint32_t seed) {
    std::vector<float> p(kN, 0.0f), g(kN, 0.0f);
    std::vector<uint16_t> m(kN, cpu_adam::F32ToBf16(1.0f)), v(kN, 0);
    OptimBuffers b;
    b.params = p.data();
    b.grads = g.data();
    b.state1 = m.data();
    b.state2 = v.data();
    b.state_format = StateFormat::kBF16;
    b.seed = seed;
    b.n = kN;
    StepOptions o = Options(OverflowPolicy::kSkipStep);
    o.algo = OptimAlgo::kAdam;
    o.hyper = {.lr = 0.0, .beta1 = 0.999, .beta2 = 0.999, .step = 1};
    EXPECT_TRUE(opt->Step(o, b).ok());
    return m;
  };
  const std::vector<uint16_t> m = run(7);
  double sum = 0;
  for (uint16_t h : m) {
    const float x = cpu_adam::Bf16ToF32(h);
    ASSERT_TRUE(x == 1.0f || x == 0.99609375f) << x;
    sum += x;
  }
  EXPECT_NEAR(sum / kN, 0.999, 5e-5);
  EXPECT_EQ(run(7), m);
  EXPECT_NE(run(8), m);
}

}  // namespace
}  // namespace strata::test
