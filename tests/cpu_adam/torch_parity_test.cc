// Parity with torch.optim: the same inputs through torch (Debian's
// python3-torch, run by tests/cpu_adam/torch_reference.py) and through our
// kernels for 10 steps; parameters must agree to 1e-6 of the parameter
// scale, optimizer state likewise. Skipped visibly when torch is missing.
// STRATA_TORCH_PYTHON overrides the interpreter (default /usr/bin/python3,
// where Debian installs torch).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "strata/cpu_adam.h"
#include "tests/testutil/testutil.h"

namespace strata::test {
namespace {

constexpr int kSteps = 10;
constexpr size_t kN = 20000;

std::string Python() {
  const char* env = std::getenv("STRATA_TORCH_PYTHON");
  return env != nullptr && *env != '\0' ? env : "/usr/bin/python3";
}

struct TorchRun {
  std::vector<float> params, state1, state2;
};

// Writes the inputs, runs the script, reads its outputs; skips the test
// when torch is missing.
void RunTorch(const std::string& dir, int algo, const OptimHyper& h,
              const std::vector<float>& p0,
              const std::vector<std::vector<float>>& grads, TorchRun* out) {
  std::string in = dir + "/in.bin", res = dir + "/out.bin";
  {
    std::ofstream f(in, std::ios::binary);
    int32_t head[3] = {algo, static_cast<int32_t>(kN), kSteps};
    double hyper[5] = {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
    f.write(reinterpret_cast<const char*>(head), sizeof head);
    f.write(reinterpret_cast<const char*>(hyper), sizeof hyper);
    f.write(reinterpret_cast<const char*>(p0.data()), kN * 4);
    for (const auto& g : grads) {
      f.write(reinterpret_cast<const char*>(g.data()), kN * 4);
    }
  }
  std::string cmd = Python() + " " STRATA_TORCH_SCRIPT " " + in + " " + res;
  int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) {
    GTEST_SKIP() << "torch is not importable by " << Python()
                 << " (apt-get install python3-torch, or set "
                    "STRATA_TORCH_PYTHON)";
  } else if (rc != 0) {
    FAIL() << cmd << " failed with status " << rc;
  }
  std::ifstream f(res, std::ios::binary);
  for (auto* v : {&out->params, &out->state1, &out->state2}) {
    v->resize(kN);
    f.read(reinterpret_cast<char*>(v->data()), kN * 4);
  }
  ASSERT_TRUE(f) << "short output from " << cmd;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

void ExpectClose(const char* what, const std::vector<float>& ours,
                 const std::vector<float>& torch) {
  double scale = std::max(MaxAbs(torch), 1e-30);
  double worst = 0;
  for (size_t i = 0; i < kN; ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(ours[i]) - torch[i]));
  }
  EXPECT_LE(worst, 1e-6 * scale)
      << what << ": max |ours - torch| = " << worst << ", scale " << scale;
  std::printf("%s: max |ours - torch| = %.3g (%.3g of scale %.3g)\n", what,
              worst, worst / scale, scale);
}

void CheckParity(OptimAlgo algo, int torch_algo, OptimHyper h) {
  testutil::ScratchDir dir;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p0(kN);
  for (float& x : p0) x = normal(rng);
  std::vector<std::vector<float>> grads(kSteps, std::vector<float>(kN));
  for (auto& g : grads) {
    for (float& x : g) x = 0.1f * normal(rng);
  }
  TorchRun torch;
  RunTorch(dir.path(), torch_algo, h, p0, grads, &torch);
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFailure()) return;

  auto opt = CpuOptimizer::Create();
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  std::vector<float> p = p0, s1(kN, 0.0f), s2(kN, 0.0f);
  const bool two = algo != OptimAlgo::kAdagrad;
  for (int step = 1; step <= kSteps; ++step) {
    StepOptions o;
    o.algo = algo;
    o.hyper = h;
    o.hyper.step = step;
    OptimBuffers b;
    b.params = p.data();
    b.grads = grads[step - 1].data();
    b.state1 = s1.data();
    b.state2 = two ? s2.data() : nullptr;
    b.n = kN;
    Result<StepReport> r = (*opt)->Step(o, b);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  ExpectClose("params", p, torch.params);
  ExpectClose("state1", s1, torch.state1);
  if (two) ExpectClose("state2", s2, torch.state2);
}

TEST(TorchParity, AdamW) {
  CheckParity(OptimAlgo::kAdamW, 1,
              {.lr = 1e-3,
               .beta1 = 0.9,
               .beta2 = 0.999,
               .eps = 1e-8,
               .weight_decay = 0.01});
}

TEST(TorchParity, Adam) {
  CheckParity(OptimAlgo::kAdam, 0,
              {.lr = 1e-3,
               .beta1 = 0.8,
               .beta2 = 0.99,
               .eps = 1e-6,
               .weight_decay = 0.05});
}

TEST(TorchParity, Adagrad) {
  CheckParity(OptimAlgo::kAdagrad, 2,
              {.lr = 1e-2, .eps = 1e-10, .weight_decay = 0.01});
}

}  // namespace
}  // namespace strata::test
