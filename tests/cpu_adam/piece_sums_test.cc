// The sums of squares a step takes of its gradients in its pass
// (CpuOptimizer::StepHooks::piece_sums): each piece's is SumSquares' of the
// same range bit for bit, so SumPieces of a whole step is SumSquares of the
// buffer, on every ISA, state format, gradient type and alignment; a step
// that stops leaves the pieces it did not step as they were.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/cpu_adam/cpu_adam_util.h"

namespace strata::test {
namespace {

// Never a sum of squares: marks a piece the step left alone.
constexpr double kUntouched = -1.0;

size_t Pieces(size_t n) { return (n + kStepPiece - 1) / kStepPiece; }

// Each piece's sum is SumSquares' of its range, and together SumSquares'.
void ExpectSumSquares(CpuOptimizer& opt, const void* grads, FloatType type,
                      size_t n, const std::vector<double>& sums) {
  const size_t width = FloatTypeSize(type);
  for (size_t k = 0; k < sums.size(); ++k) {
    const size_t begin = k * kStepPiece;
    const size_t end = std::min(n, begin + kStepPiece);
    Result<SumSquaresResult> want = opt.SumSquares(
        static_cast<const char*>(grads) + begin * width, type, end - begin);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(std::bit_cast<uint64_t>(sums[k]),
              std::bit_cast<uint64_t>(want->sum))
        << "piece " << k;
  }
  Result<SumSquaresResult> whole = opt.SumSquares(grads, type, n);
  ASSERT_TRUE(whole.ok());
  const SumSquaresResult got = SumPieces(sums.data(), sums.size());
  EXPECT_EQ(std::bit_cast<uint64_t>(got.sum),
            std::bit_cast<uint64_t>(whole->sum));
  EXPECT_TRUE(got.finite);
}

// 8-bit state from zero (zero codes and scales), fp32 params.
struct Q8Buffers {
  explicit Q8Buffers(size_t n)
      : p(n, 0.5f), m(n), v(n), ms(Q8Blocks(n)), vs(Q8Blocks(n)) {}
  OptimBuffers View(const TypedBuffer& g) {
    OptimBuffers b;
    b.params = p.data();
    b.grads = g.data();
    b.grad_type = g.type();
    b.state1 = m.data();
    b.state2 = v.data();
    b.state_format = StateFormat::kQ8;
    b.state1_scale = ms.data();
    b.state2_scale = vs.data();
    b.n = p.size();
    return b;
  }
  std::vector<float> p;
  std::vector<uint8_t> m, v;
  std::vector<float> ms, vs;
};

TypedBuffer Grads(FloatType type, size_t n, size_t shift) {
  TypedBuffer g(type, n, shift);
  std::mt19937_64 rng(n + shift);
  for (size_t i = 0; i < n; ++i) g.Set(i, RandomGrad(rng, type));
  return g;
}

class PieceSumsTest : public testing::TestWithParam<CpuIsa> {};

TEST_P(PieceSumsTest, AreSumSquaresOfEachPieceInEveryStateFormat) {
  STRATA_OPTIMIZER_OR_SKIP(opt, GetParam());
  const size_t sizes[] = {1, 17, 2 * kStepPiece, 3 * kStepPiece + 5};
  for (FloatType grad : {FloatType::kF32, FloatType::kBF16, FloatType::kF16}) {
    for (size_t n : sizes) {
      // Params at a vector boundary (squares in the pass) and 3 floats past
      // it (taken after the pass, as the step's vectors are not the lanes').
      for (size_t shift : {size_t{0}, size_t{3}}) {
        SCOPED_TRACE(std::string(FloatTypeName(grad)) + " n=" +
                     std::to_string(n) + " shift=" + std::to_string(shift));
        const Combo combo{OptimAlgo::kAdamW, grad, FloatType::kBF16,
                          FloatType::kBF16};
        StepState s(combo, n, shift);
        std::mt19937_64 rng(n);
        FillInitial(s, rng);
        const TypedBuffer g = Grads(grad, n, shift + 5);
        OptimBuffers b = s.View();
        b.grads = g.data();
        std::vector<double> sums(Pieces(n), kUntouched);
        CpuOptimizer::StepHooks hooks;
        hooks.piece_sums = sums.data();
        const StepOptions o = OptionsForStep(OptimAlgo::kAdamW, 1, 1);
        ASSERT_EQ(opt->Step(o, b, hooks)->outcome, StepOutcome::kApplied);
        ExpectSumSquares(*opt, g.data(), grad, n, sums);

        Q8Buffers q(n);
        std::fill(sums.begin(), sums.end(), kUntouched);
        ASSERT_EQ(opt->Step(o, q.View(g), hooks)->outcome,
                  StepOutcome::kApplied);
        ExpectSumSquares(*opt, g.data(), grad, n, sums);
      }
    }
  }
}

TEST_P(PieceSumsTest, AStepThatStopsLeavesThePiecesItDidNotStep) {
  STRATA_OPTIMIZER_OR_SKIP(opt, GetParam(), 1);
  const size_t n = 4 * kStepPiece;
  TypedBuffer g = Grads(FloatType::kF32, n, 0);
  g.Set(2 * kStepPiece + 7, std::numeric_limits<double>::infinity());
  Q8Buffers q(n);
  std::vector<double> sums(Pieces(n), kUntouched);
  CpuOptimizer::StepHooks hooks;
  hooks.piece_sums = sums.data();
  StepOptions o = OptionsForStep(OptimAlgo::kAdamW, 1, 0);
  o.overflow = OverflowPolicy::kStopAtNonFinite;
  ASSERT_EQ(opt->Step(o, q.View(g), hooks)->outcome, StepOutcome::kPartial);
  // One thread: pieces 0 and 1 stepped, 2 stopped, 3 never begun.
  ExpectSumSquares(*opt, g.data(), FloatType::kF32, 2 * kStepPiece,
                   {sums[0], sums[1]});
  EXPECT_EQ(sums[2], kUntouched);
  EXPECT_EQ(sums[3], kUntouched);
}

INSTANTIATE_TEST_SUITE_P(Isa, PieceSumsTest,
                         testing::Values(CpuIsa::kScalar, CpuIsa::kAvx2,
                                         CpuIsa::kAvx512),
                         [](const testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(CpuIsaName(info.param));
                         });

}  // namespace
}  // namespace strata::test
