// 8-bit state (Note [8-bit state] in strata/cpu_adam.h): the code books,
// every path bit-identical to the scalar one at every thread count, each
// step against a float64 reference of the same quantized algorithm, a zero
// state that steps as fp32's does, non-finite gradients and states that
// stop the step at their block, and blocks too small to scale.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu_adam/qmap.h"
#include "tests/cpu_adam/cpu_adam_util.h"
#include "tests/cpu_adam/reference.h"

namespace strata::test {
namespace {

using cpu_adam::QMap;

// Adam's buffers with 8-bit state: fp32 params and gradients, codes and
// scales. Gradients vary in scale from block to block (1e-6 to 10, some
// blocks zero), so every decade of the code books is used.
struct Q8Problem {
  explicit Q8Problem(size_t n, uint64_t seed = 1)
      : p(n), g(n), m(n), v(n), ms(Q8Blocks(n)), vs(Q8Blocks(n)), out(n) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    for (size_t i = 0; i < n; ++i) p[i] = normal(rng);
    Regrad(seed + 1);
  }
  void Regrad(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    for (size_t b = 0; b < ms.size(); ++b) {
      const float scale = b % 7 == 3 ? 0.0f : std::pow(10.0f, b % 8 - 6.0f);
      for (size_t i = b * kQ8Block; i < std::min(g.size(), (b + 1) * kQ8Block);
           ++i) {
        g[i] = normal(rng) * scale;
      }
    }
  }
  OptimBuffers View(bool with_out = false) {
    OptimBuffers b;
    b.params = p.data();
    b.grads = g.data();
    b.state1 = m.data();
    b.state2 = v.data();
    b.state_format = StateFormat::kQ8;
    b.state1_scale = ms.data();
    b.state2_scale = vs.data();
    b.params_out = with_out ? out.data() : nullptr;
    b.n = p.size();
    return b;
  }
  bool operator==(const Q8Problem& o) const {
    auto same = [](const auto& a, const auto& b) {
      return a.size() == b.size() &&
             std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    return same(p, o.p) && same(m, o.m) && same(v, o.v) && same(ms, o.ms) &&
           same(vs, o.vs) && same(out, o.out);
  }
  std::vector<float> p, g;
  std::vector<uint8_t> m, v;
  std::vector<float> ms, vs;
  std::vector<uint16_t> out;
};

StepOptions AdamW(int64_t step, OverflowPolicy overflow) {
  StepOptions o;
  o.algo = OptimAlgo::kAdamW;
  o.hyper = {.lr = 1e-3,
             .beta1 = 0.9,
             .beta2 = 0.95,
             .eps = 1e-8,
             .weight_decay = 0.1,
             .step = step};
  o.overflow = overflow;
  return o;
}

void Steps(CpuOptimizer& opt, Q8Problem& pr, int steps, bool with_out) {
  for (int s = 1; s <= steps; ++s) {
    pr.Regrad(100 + s);
    Result<StepReport> r = opt.Step(
        AdamW(s == steps ? 10000 : s, OverflowPolicy::kStopAtNonFinite),
        pr.View(with_out));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->outcome, StepOutcome::kApplied);
  }
}

// The lower edge of each magnitude index's bucket, in double (qmap.h):
// index 0 is the magnitude 0, the last is 1.
std::vector<double> Edges(const QMap& map) {
  std::vector<double> edges = {0.0};
  for (int d = 0; d < 7; ++d) {
    const int n = map.is_signed ? 1 << d : 2 << d;
    for (int j = 0; j < n; ++j) {
      edges.push_back(std::pow(10.0, d - 7) +
                      j * 0.9 * std::pow(10.0, d - 6) / n);
    }
  }
  edges.push_back(map.one_threshold);
  return edges;
}

TEST(Q8CodeBooks, AreTheDynamicTreeMapsBucketByBucket) {
  for (const QMap* map : {&cpu_adam::SignedMap(), &cpu_adam::UnsignedMap()}) {
    const bool is_signed = map->is_signed;
    EXPECT_EQ(map->code[255], 1.0f);
    EXPECT_EQ(map->code[is_signed ? 127 : 0], 0.0f);
    for (int k = 0; k < 255; ++k)
      ASSERT_LT(map->code[k], map->code[k + 1]) << k;
    // Each magnitude's value is the middle of its bucket, within 2 fp32
    // ulps; the smallest is the middle of decade 0's first bucket.
    const std::vector<double> edges = Edges(*map);
    ASSERT_EQ(edges.size(), is_signed ? 129u : 256u);
    const int zero = is_signed ? 127 : 0;
    // (The last bucket of decade 6 ends at 1, not at one_threshold.)
    for (size_t k = 1; k + 2 < edges.size(); ++k) {
      const double mid = (edges[k] + edges[k + 1]) / 2;
      EXPECT_NEAR(map->code[zero + k], mid, 2 * UlpF32(mid)) << k;
    }
    EXPECT_NEAR(map->code[zero + 1], is_signed ? 0.55e-6 : 0.325e-6, 1e-12);
  }
  const QMap& s = cpu_adam::SignedMap();
  for (int k = 0; k < 127; ++k) EXPECT_EQ(s.code[k], -s.code[254 - k]) << k;
}

// Every ISA at 1 and 2 threads gives the scalar path's bytes, over steps
// 1, 2, 3 and 10000, with a tail block and with a bf16 copy of the params.
class Q8IsaTest : public testing::TestWithParam<CpuIsa> {};

TEST_P(Q8IsaTest, BitIdenticalToScalarAtEveryThreadCount) {
  STRATA_OPTIMIZER_OR_SKIP(probe, GetParam());
  STRATA_OPTIMIZER_OR_SKIP(scalar, CpuIsa::kScalar, 1);
  for (size_t n : {size_t{1000}, kLargeN}) {
    for (bool with_out : {false, true}) {
      Q8Problem want(n);
      Steps(*scalar, want, 4, with_out);
      for (int threads : {1, 2}) {
        std::unique_ptr<CpuOptimizer> opt = MakeOptimizer(GetParam(), threads);
        Q8Problem got(n);
        Steps(*opt, got, 4, with_out);
        EXPECT_TRUE(got == want)
            << threads << " threads, n " << n << (with_out ? ", bf16 out" : "");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, Q8IsaTest,
                         testing::Values(CpuIsa::kScalar, CpuIsa::kAvx2,
                                         CpuIsa::kAvx512),
                         [](const testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(CpuIsaName(info.param));
                         });

// The code of x (a value relative to its block's scale) by the bucket
// rule in double, and whether x lies within `slack` (relative) of a bucket
// edge, where fp32 rounding may pick the bucket beside it.
int RefCode(const QMap& map, double x, double slack, bool* near_edge) {
  const std::vector<double> edges = Edges(map);
  const double a = std::fabs(x);
  int mag = 0;
  *near_edge = false;
  for (size_t k = 1; k < edges.size(); ++k) {
    if (a >= edges[k]) mag = static_cast<int>(k);
    *near_edge = *near_edge || std::fabs(a - edges[k]) <= slack * a;
  }
  if (!map.is_signed) return mag;
  return x < 0 ? 127 - std::min(mag, 127) : 127 + mag;
}

// One block against the float64 reference: the state it started from
// (dequantized), RefStep for each element, the new scales and the codes by
// the bucket rule. Bounds: params within RefStep's tolerance; a scale
// within 8 fp32 ulps (it is a stored m or v); a code equal, or adjacent
// where the value lies within rounding of a bucket edge.
void CheckBlock(const Q8Problem& before, const Q8Problem& after,
                const StepOptions& o, size_t b) {
  const RefConsts c = MakeRefConsts(o);
  const QMap& m_map = cpu_adam::SignedMap();
  const QMap& v_map = cpu_adam::UnsignedMap();
  const size_t lo = b * kQ8Block;
  const size_t hi = std::min(before.p.size(), lo + kQ8Block);
  std::vector<RefOut> ref;
  double m_max = 0, v_max = 0;
  for (size_t i = lo; i < hi; ++i) {
    const double m0 = double(m_map.code[before.m[i]]) * before.ms[b];
    const double v0 = double(v_map.code[before.v[i]]) * before.vs[b];
    ref.push_back(RefStep(o.algo, c, before.p[i], before.g[i], m0, v0));
    m_max = std::max(m_max, std::fabs(ref.back().s1));
    v_max = std::max(v_max, ref.back().s2);
  }
  ASSERT_NEAR(after.ms[b], m_max, 8 * UlpF32(m_max)) << "block " << b;
  ASSERT_NEAR(after.vs[b], v_max, 8 * UlpF32(v_max)) << "block " << b;
  for (size_t i = lo; i < hi; ++i) {
    const RefOut& r = ref[i - lo];
    ASSERT_NEAR(after.p[i], r.p, r.tol_p) << "params[" << i << "]";
    for (auto [map, got, x, scale] :
         {std::tuple{&m_map, after.m[i], r.s1, m_max},
          std::tuple{&v_map, after.v[i], r.s2, v_max}}) {
      if (scale == 0) {
        ASSERT_EQ(map->code[got], 0.0f) << "element " << i;
        continue;
      }
      bool near_edge = false;
      const int want = RefCode(*map, x / scale, 1e-5, &near_edge);
      ASSERT_LE(std::abs(got - want), near_edge ? 1 : 0)
          << "element " << i << " of block " << b << ": value " << x / scale;
    }
  }
}

TEST(Q8Step, EachStepIsTheFloat64ReferenceQuantized) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto);
  Q8Problem pr(5 * kQ8Block + 77);
  for (int s = 1; s <= 6; ++s) {
    pr.Regrad(200 + s);
    const Q8Problem before = pr;
    const StepOptions o = AdamW(s, OverflowPolicy::kSkipStep);
    ASSERT_TRUE(opt->Step(o, pr.View()).ok());
    for (size_t b = 0; b < pr.ms.size(); ++b) CheckBlock(before, pr, o, b);
  }
}

// Values at and around every bucket edge of both code books, positive and
// negative, quantize to their bucket: Adam with betas 0 and lr 0 makes the
// new m the gradient and v its square, and each block's first gradient, 1,
// makes the scales 1. A value 1e-5 (relative) from an edge gets its
// bucket exactly; one within an ulp or two, that bucket or the one beside.
TEST(Q8Step, EveryBucketEdgeQuantizesToItsBucket) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto);
  const QMap& m_map = cpu_adam::SignedMap();
  const QMap& v_map = cpu_adam::UnsignedMap();
  // Each entry: the gradient, and whether it is to be checked against m's
  // book (else v's, through its square).
  std::vector<std::pair<float, bool>> probes;
  for (const QMap* map : {&m_map, &v_map}) {
    for (double edge : Edges(*map)) {
      if (edge == 0 || edge >= map->one_threshold) continue;
      std::vector<float> at = {static_cast<float>(edge * (1 - 1e-5)),
                               static_cast<float>(edge * (1 + 1e-5))};
      for (int ulps = -2; ulps <= 2; ++ulps) {
        float x = static_cast<float>(edge);
        for (int u = 0; u < std::abs(ulps); ++u) {
          x = std::nextafter(x, ulps < 0 ? 0.0f : 2.0f);
        }
        at.push_back(x);
      }
      for (float x : at) {
        if (map == &m_map) {
          probes.push_back({x, true});
          probes.push_back({-x, true});
        } else {
          probes.push_back({std::sqrt(x), false});
        }
      }
    }
  }
  const size_t per_block = kQ8Block - 1;
  const size_t blocks = (probes.size() + per_block - 1) / per_block;
  Q8Problem pr(blocks * kQ8Block);
  std::fill(pr.g.begin(), pr.g.end(), 0.0f);
  std::fill(pr.m.begin(), pr.m.end(), 127);
  std::fill(pr.v.begin(), pr.v.end(), 0);
  std::fill(pr.ms.begin(), pr.ms.end(), 0.0f);
  std::fill(pr.vs.begin(), pr.vs.end(), 0.0f);
  for (size_t k = 0; k < probes.size(); ++k) {
    const size_t b = k / per_block;
    pr.g[b * kQ8Block] = 1.0f;
    pr.g[b * kQ8Block + 1 + k % per_block] = probes[k].first;
  }
  StepOptions o;
  o.algo = OptimAlgo::kAdam;
  o.hyper = {.lr = 0.0, .beta1 = 0.0, .beta2 = 0.0, .eps = 1.0, .step = 1};
  ASSERT_TRUE(opt->Step(o, pr.View()).ok());
  for (size_t k = 0; k < probes.size(); ++k) {
    const size_t i = k / per_block * kQ8Block + 1 + k % per_block;
    const auto [g, is_m] = probes[k];
    const float x = is_m ? g : g * g;
    bool near_edge = false;
    const int want = RefCode(is_m ? m_map : v_map, x, 2e-6, &near_edge);
    const int got = is_m ? pr.m[i] : pr.v[i];
    ASSERT_LE(std::abs(got - want), near_edge ? 1 : 0)
        << (is_m ? "m" : "v") << " value " << x;
  }
  for (size_t b = 0; b < blocks; ++b) {
    ASSERT_EQ(pr.ms[b], 1.0f);
    ASSERT_EQ(pr.vs[b], 1.0f);
  }
}

// A zero state (zero codes and scales) steps exactly as a zero fp32 state:
// the first step's params are the fp32 path's, bit for bit.
TEST(Q8Step, AZeroStateStepsAsFp32) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto);
  Q8Problem pr(3000);
  std::vector<float> p = pr.p, m(pr.p.size()), v(pr.p.size());
  const StepOptions o = AdamW(1, OverflowPolicy::kSkipStep);
  ASSERT_TRUE(opt->Step(o, pr.View()).ok());
  OptimBuffers fp32;
  fp32.params = p.data();
  fp32.grads = pr.g.data();
  fp32.state1 = m.data();
  fp32.state2 = v.data();
  fp32.n = p.size();
  ASSERT_TRUE(opt->Step(o, fp32).ok());
  EXPECT_EQ(std::memcmp(p.data(), pr.p.data(), p.size() * 4), 0);
  for (size_t b = 0; b < pr.ms.size(); ++b) {
    if (b % 7 == 3) {
      EXPECT_EQ(pr.ms[b], 0.0f) << "a zero block stays zero";
    }
  }
}

// Dequantization gives the code books' values bit for bit, and a state a
// step only halves keeps its codes (each value sits mid-bucket). Adam with
// lr 1, betas 0.5, zero gradients, eps 1 and step 1 makes the new params
// -m exactly where v is 0 (bias corrections 2 cancel the halving), and
// -1 / (sqrt(v / 2) * fl(sqrt 2) + eps) where m is 1.
TEST(Q8Step, TheKernelsDequantizeToTheCodeBooks) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto);
  const QMap& m_map = cpu_adam::SignedMap();
  const QMap& v_map = cpu_adam::UnsignedMap();
  Q8Problem pr(2 * kQ8Block);
  std::fill(pr.p.begin(), pr.p.end(), 0.0f);
  std::fill(pr.g.begin(), pr.g.end(), 0.0f);
  for (size_t k = 0; k < kQ8Block; ++k) {
    pr.m[k] = static_cast<uint8_t>(k);  // block 0: every m code, v = 0
    pr.v[k] = 0;
    pr.m[kQ8Block + k] = 255;  // block 1: m = 1, every v code
    pr.v[kQ8Block + k] = static_cast<uint8_t>(k);
  }
  pr.ms = {1.0f, 1.0f};
  pr.vs = {0.0f, 1.0f};
  StepOptions o;
  o.algo = OptimAlgo::kAdam;
  o.hyper = {.lr = 1.0, .beta1 = 0.5, .beta2 = 0.5, .eps = 1.0, .step = 1};
  const std::vector<uint8_t> codes = pr.m;
  ASSERT_TRUE(opt->Step(o, pr.View()).ok());
  const auto inv = static_cast<float>(1 / std::sqrt(0.5));
  for (size_t k = 0; k < kQ8Block; ++k) {
    EXPECT_EQ(pr.p[k], -m_map.code[k]) << "m code " << k;
    const float v = 0.5f * v_map.code[k];
    EXPECT_EQ(pr.p[kQ8Block + k], -1.0f / (std::sqrt(v) * inv + 1.0f))
        << "v code " << k;
  }
  EXPECT_TRUE(std::equal(codes.begin(), codes.end(), pr.m.begin()));
  EXPECT_EQ(pr.ms[0], 0.5f);
  for (size_t k = 0; k < kQ8Block; ++k) EXPECT_EQ(pr.v[kQ8Block + k], k);
}

// A NaN gradient in block 3: kStopAtNonFinite updates whole blocks before
// it and nothing from it on; kSkipStep nothing at all.
TEST(Q8Step, ANonFiniteGradientStopsAtItsBlock) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto);
  for (OverflowPolicy policy :
       {OverflowPolicy::kStopAtNonFinite, OverflowPolicy::kSkipStep}) {
    Q8Problem pr(6 * kQ8Block);
    pr.g[3 * kQ8Block + 100] = std::numeric_limits<float>::quiet_NaN();
    const Q8Problem before = pr;
    Result<StepReport> r = opt->Step(AdamW(1, policy), pr.View());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const bool stop = policy == OverflowPolicy::kStopAtNonFinite;
    EXPECT_EQ(r->outcome, stop ? StepOutcome::kPartial : StepOutcome::kSkipped);
    const size_t cut = stop ? 3 * kQ8Block : 0;
    EXPECT_EQ(std::memcmp(pr.p.data() + cut, before.p.data() + cut,
                          (pr.p.size() - cut) * 4),
              0);
    EXPECT_EQ(std::memcmp(pr.m.data() + cut, before.m.data() + cut,
                          pr.m.size() - cut),
              0);
    if (stop) {
      EXPECT_NE(std::memcmp(pr.p.data(), before.p.data(), cut * 4), 0);
      EXPECT_GT(pr.vs[2], 0.0f);
      EXPECT_EQ(pr.vs[3], 0.0f);
    }
  }
}

// A finite gradient whose square overflows: its block's new v would not
// be finite, so the step stops there as at a non-finite gradient (blocks
// before it updated, none from it on), and no param becomes NaN. The
// same step with fp32 state stores an inf v and goes on.
TEST(Q8Step, AStateThatWouldOverflowStopsTheStepAtItsBlock) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto);
  Q8Problem pr(4 * kQ8Block);
  pr.g[2 * kQ8Block + 5] = 1e30f;
  const Q8Problem before = pr;
  Result<StepReport> r =
      opt->Step(AdamW(1, OverflowPolicy::kStopAtNonFinite), pr.View());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, StepOutcome::kPartial);
  const size_t cut = 2 * kQ8Block;
  EXPECT_NE(std::memcmp(pr.p.data(), before.p.data(), cut * 4), 0);
  EXPECT_EQ(std::memcmp(pr.p.data() + cut, before.p.data() + cut, cut * 4), 0);
  EXPECT_EQ(std::memcmp(pr.v.data() + cut, before.v.data() + cut, cut), 0);
  EXPECT_EQ(pr.vs[2], before.vs[2]);
  for (float p : pr.p) ASSERT_TRUE(std::isfinite(p));
}

// A block whose largest m is below FLT_MIN (its inverse would be inf)
// stores zeros with a zero scale, and comes back as zeros.
TEST(Q8Step, ABlockTooSmallToScaleStoresZeros) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto);
  Q8Problem pr(2 * kQ8Block);
  std::fill(pr.g.begin(), pr.g.end(), 0.0f);
  for (size_t k = 0; k < kQ8Block; ++k) pr.g[k] = 1e-38f;  // m = 1e-39
  ASSERT_TRUE(opt->Step(AdamW(1, OverflowPolicy::kSkipStep), pr.View()).ok());
  EXPECT_EQ(pr.ms[0], 0.0f);
  for (size_t k = 0; k < kQ8Block; ++k) {
    ASSERT_EQ(cpu_adam::SignedMap().code[pr.m[k]], 0.0f) << k;
  }
  for (float p : pr.p) ASSERT_TRUE(std::isfinite(p));
}

// An fp32 copy-out (a model whose compute copy is fp32 beside its master)
// is the params, bit for bit, and changes nothing else the step writes,
// on every path.
TEST(Q8Step, AnFp32CopyOutIsTheParamsOnEveryPath) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    std::unique_ptr<CpuOptimizer> opt = MakeOptimizer(isa);
    if (opt == nullptr) continue;  // the CPU lacks it
    const size_t n = 3 * kQ8Block + 77;
    Q8Problem with(n), without(n);
    std::vector<float> copy(n, -1.0f);
    OptimBuffers b = with.View();
    b.params_out = copy.data();
    b.out_type = FloatType::kF32;
    const StepOptions o = AdamW(1, OverflowPolicy::kStopAtNonFinite);
    ASSERT_TRUE(opt->Step(o, b).ok());
    ASSERT_TRUE(opt->Step(o, without.View()).ok());
    EXPECT_EQ(std::memcmp(copy.data(), with.p.data(), n * sizeof(float)), 0)
        << CpuIsaName(isa);
    EXPECT_TRUE(with == without) << CpuIsaName(isa);
  }
}

// The observer (CpuOptimizer::Step's hooks) sees the fixed pieces, which
// tile the step, after their bytes are final: a copy taken in the
// observer equals the step's result. The same pieces at 1, 2 and 3
// threads.
TEST(Q8Step, TheObserverSeesEveryPieceOnceWithItsFinalBytes) {
  for (int threads : {1, 3}) {
    STRATA_OPTIMIZER_OR_SKIP(other, CpuIsa::kAuto, threads);
    const size_t n = 3 * kStepPiece + 5;
    Q8Problem pr(n);
    std::vector<std::pair<size_t, size_t>> pieces;
    std::mutex mu;
    CpuOptimizer::StepHooks hooks;
    hooks.observer = [&](size_t begin, size_t end) {
      std::lock_guard<std::mutex> lock(mu);
      pieces.emplace_back(begin, end);
    };
    ASSERT_TRUE(
        other
            ->Step(AdamW(1, OverflowPolicy::kStopAtNonFinite), pr.View(), hooks)
            .ok());
    std::sort(pieces.begin(), pieces.end());
    const std::vector<std::pair<size_t, size_t>> fixed = {
        {0, kStepPiece},
        {kStepPiece, 2 * kStepPiece},
        {2 * kStepPiece, 3 * kStepPiece},
        {3 * kStepPiece, n}};
    EXPECT_EQ(pieces, fixed) << threads << " threads";
  }
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto, 2);
  const size_t n = 5 * 65536 + 3 * kQ8Block + 17;
  Q8Problem pr(n);
  std::vector<float> seen_p(n);
  std::vector<uint8_t> seen_m(n);
  std::vector<std::pair<size_t, size_t>> pieces;
  std::mutex mu;
  CpuOptimizer::StepHooks observe;
  observe.observer = [&](size_t begin, size_t end) {
    std::memcpy(&seen_p[begin], &pr.p[begin], (end - begin) * sizeof(float));
    std::memcpy(&seen_m[begin], &pr.m[begin], end - begin);
    std::lock_guard<std::mutex> lock(mu);
    pieces.emplace_back(begin, end);
  };
  Result<StepReport> r =
      opt->Step(AdamW(1, OverflowPolicy::kStopAtNonFinite), pr.View(), observe);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::sort(pieces.begin(), pieces.end());
  size_t at = 0;
  for (const auto& [begin, end] : pieces) {
    ASSERT_EQ(begin, at);
    ASSERT_EQ(end, std::min(n, begin + kStepPiece));
    at = end;
  }
  EXPECT_EQ(at, n);
  EXPECT_EQ(seen_p, pr.p);
  EXPECT_EQ(seen_m, pr.m);

  // A step stopped at a non-finite gradient shows no piece that holds it.
  pieces.clear();
  pr.g[n / 2] = std::numeric_limits<float>::infinity();
  r = opt->Step(AdamW(2, OverflowPolicy::kStopAtNonFinite), pr.View(), observe);
  ASSERT_TRUE(r.ok() && r->outcome == StepOutcome::kPartial);
  for (const auto& [begin, end] : pieces) {
    EXPECT_FALSE(begin <= n / 2 && n / 2 < end) << begin << ".." << end;
  }
}

// The check sees each piece before it is stepped (a copy taken there
// holds the old bytes); one that fails stops the step: kPartial, and that
// piece unchanged.
TEST(Q8Step, TheCheckSeesEachPieceBeforeItIsSteppedAndCanStopTheStep) {
  STRATA_OPTIMIZER_OR_SKIP(opt, CpuIsa::kAuto, 2);
  const size_t n = 4 * kStepPiece + 3 * kQ8Block;
  Q8Problem pr(n);
  const std::vector<float> before_p = pr.p;
  const std::vector<uint8_t> before_m = pr.m;
  std::vector<float> seen_p(n);
  std::vector<uint8_t> seen_m(n);
  CpuOptimizer::StepHooks hooks;
  hooks.check = [&](size_t begin, size_t end) {
    std::memcpy(&seen_p[begin], &pr.p[begin], (end - begin) * sizeof(float));
    std::memcpy(&seen_m[begin], &pr.m[begin], end - begin);
    return true;
  };
  Result<StepReport> r =
      opt->Step(AdamW(1, OverflowPolicy::kStopAtNonFinite), pr.View(), hooks);
  ASSERT_TRUE(r.ok() && r->outcome == StepOutcome::kApplied);
  EXPECT_EQ(seen_p, before_p);
  EXPECT_EQ(seen_m, before_m);
  EXPECT_NE(pr.p, before_p);

  const std::vector<float> stepped = pr.p;
  const size_t bad = 2 * kStepPiece;
  hooks.check = [&](size_t begin, size_t) { return begin != bad; };
  r = opt->Step(AdamW(2, OverflowPolicy::kStopAtNonFinite), pr.View(), hooks);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, StepOutcome::kPartial);
  EXPECT_TRUE(std::equal(stepped.begin() + bad,
                         stepped.begin() + bad + kStepPiece,
                         pr.p.begin() + bad));
}

}  // namespace
}  // namespace strata::test
