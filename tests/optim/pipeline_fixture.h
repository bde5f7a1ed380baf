// The offloaded optimizer pipeline against an in-memory reference: the same
// fp32 master weights stepped by cpu_adam directly, bit for bit. The fixture
// runs a trainer's step (forward fetches, backward hand-offs) over four
// groups of bf16 (or fp32) tensors, and the reference the same step in
// memory; its forward checks that every group's compute copy already holds
// the last step's update when forward reads it.
#ifndef STRATA_TESTS_OPTIM_PIPELINE_FIXTURE_H_
#define STRATA_TESTS_OPTIM_PIPELINE_FIXTURE_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "strata/cpu_adam.h"
#include "strata/engine.h"
#include "strata/offload_optimizer.h"
#include "tests/testutil/testutil.h"

namespace strata::optim_test {

constexpr int kGroups = 4;
// Sizes that are not multiples of the vector width or of the 128-element
// tensor alignment, so padding sits between tensors.
inline const std::vector<int64_t> kTensorSizes = {16000, 1232, 4803};
constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kHostBudgetNvme = 768 << 10;
// Steps of the long runs: the gradients' size cycles every 3 steps (so
// clipping fires on some), which the sanitizer builds (-O0, every access
// instrumented) cover in 20 steps.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kLongRun = 20;
#else
constexpr int kLongRun = 50;
#endif

struct Config {
  OptimMode mode;
  bool state_on_nvme;
  double clip_norm;
  int micro_batches;
  bool skip_on_overflow = false;
  // fp32: the compute copy is the master's equal, and a speculative step
  // steps it in place (Note [The master a speculative step does not read]).
  DType compute = DType::kBFloat16;
};

inline std::string Name(const testing::TestParamInfo<Config>& info) {
  const Config& c = info.param;
  return std::string(OptimModeName(c.mode)) +
         (c.state_on_nvme ? "_nvme" : "_host") +
         (c.clip_norm > 0 ? "_clip" : "_noclip") + "_mb" +
         std::to_string(c.micro_batches) + (c.skip_on_overflow ? "_skip" : "") +
         (c.compute == DType::kFloat32 ? "_fp32" : "");
}

inline uint16_t RandomBf16(std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  const float f = dist(rng);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);  // truncation: any bf16 will do
}

// The reference: per group, flat arrays laid out like the engine's chunks
// (element e of every role at the same index), stepped in memory.
struct Reference {
  struct Group {
    std::vector<float> master, m, v, grads;
    std::vector<uint16_t> out;
  };
  std::vector<Group> groups;
};

class PipelineTest : public testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    const Config& c = GetParam();
    EngineOptions options;
    options.device = "host";
    options.device_budget = 1 * kMiB;
    // With state on NVMe the host holds about two groups' state of four:
    // the steps must stream it. fp32 compute copies and gradients take 256
    // KiB more of it.
    const uint64_t nvme_budget =
        kHostBudgetNvme + (c.compute == DType::kFloat32 ? 256 << 10 : 0);
    options.host_budget = c.state_on_nvme ? nvme_budget : 4 * kMiB;
    options.nvme_budget = c.state_on_nvme ? 16 * kMiB : 0;
    options.swap_dir = c.state_on_nvme ? scratch_.path() : "";
    for (Role role :
         {Role::kMaster, Role::kState1, Role::kState2, Role::kGrad}) {
      options.placement.home[static_cast<int>(role)] =
          c.state_on_nvme ? Tier::kNvme : Tier::kHost;
    }
    auto engine = Engine::Open(options);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    engine_ = std::move(*engine);
    for (int g = 0; g < kGroups; ++g) {
      GroupSpec spec;
      spec.name = "layer." + std::to_string(g);
      for (size_t t = 0; t < kTensorSizes.size(); ++t) {
        spec.tensors.push_back(
            {"t" + std::to_string(t), {kTensorSizes[t]}, c.compute, kAllRoles});
      }
      ASSERT_TRUE(engine_->RegisterGroup(spec).ok());
    }
    OffloadOptimizerOptions o;
    o.mode = c.mode;
    o.clip_norm = c.clip_norm;
    o.micro_batches = c.micro_batches;
    o.skip_on_overflow = c.skip_on_overflow;
    o.threads = 2;
    auto opt = OffloadOptimizer::Create(engine_.get(), o);
    ASSERT_TRUE(opt.ok()) << opt.status().message();
    optimizer_ = std::move(*opt);
    auto cpu = CpuOptimizer::Create({CpuIsa::kAuto, 2});
    ASSERT_TRUE(cpu.ok());
    cpu_ = std::move(*cpu);
    InitWeights();
  }

  // Random masters into the engine and the reference; m, v and the compute
  // copy start at zero in both. The reference lays each group out like the
  // engine's chunks: the first tensor starts at element 0, and the element
  // offsets are the same in every role.
  void InitWeights() {
    std::mt19937_64 rng(42);
    std::normal_distribution<float> dist(0.0f, 0.5f);
    ref_.groups.resize(kGroups);
    offsets_.resize(kGroups);
    for (int g = 0; g < kGroups; ++g) {
      FetchOptions fetch;
      fetch.roles = RoleBit(Role::kMaster);
      fetch.write = true;
      auto view = engine_->Fetch(g, Tier::kHost, fetch);
      ASSERT_TRUE(view.ok()) << view.status().message();
      const auto* base = static_cast<const char*>(view->tensors[0].data);
      uint64_t n = 0;
      for (const TensorView& t : view->tensors) {
        offsets_[g][t.name] = (static_cast<const char*>(t.data) - base) / 4;
        n = offsets_[g][t.name] + t.bytes / 4;
      }
      Reference::Group& r = ref_.groups[g];
      r.master.assign(n, 0.0f);
      r.m.assign(n, 0.0f);
      r.v.assign(n, 0.0f);
      r.out.assign(n, 0);
      for (const TensorView& t : view->tensors) {
        auto* data = static_cast<float*>(t.data);
        const uint64_t at = offsets_[g][t.name];
        for (uint64_t i = 0; i < t.bytes / 4; ++i) {
          data[i] = r.master[at + i] = dist(rng);
        }
      }
      ASSERT_TRUE(view->pin.Release().ok());
    }
  }

  uint64_t Offset(int g, const std::string& tensor) {
    return offsets_[g].at(tensor);
  }

  bool Fp32() const { return GetParam().compute == DType::kFloat32; }

  // What group g's compute copy must hold from element `at` on.
  const void* ComputeRef(int g, uint64_t at) const {
    const Reference::Group& r = ref_.groups[g];
    return Fp32() ? static_cast<const void*>(&r.master[at]) : &r.out[at];
  }

  static StepHyper Hyper(int s) {
    StepHyper h;
    h.lr = 1e-2 * (1 + s % 5) / 5;  // a schedule: changes every step
    h.weight_decay = 0.01;
    h.beta2 = s < 20 ? 0.999 : 0.99;
    h.loss_scale = s % 2 ? 1024.0 : 1.0;
    return h;
  }

  // One optimizer step over the engine, with forward and backward fetches
  // around the hand-offs as a trainer does them, and (when the engine's
  // step applied) over the reference. `poison` puts a NaN in that group.
  Result<OptimStepReport> Step(int s, int poison = -1) {
    const Config& c = GetParam();
    const StepHyper hyper = Hyper(s);
    if (Status st = optimizer_->BeginStep(hyper); !st.ok()) return st;
    for (Reference::Group& r : ref_.groups) r.grads.assign(r.master.size(), 0);
    for (int mb = 0; mb < c.micro_batches; ++mb) {
      for (int g = 0; g < kGroups; ++g) Forward(g);
      for (int g = kGroups - 1; g >= 0; --g) Backward(s, mb, g, poison);
    }
    Result<OptimStepReport> report = optimizer_->FinishStep();
    if (report.ok() && !report->skipped) ReferenceStep(hyper, report->step);
    if (report.ok()) {
      speculated_ += report->speculated;
      undone_ += report->undone;
    }
    return report;
  }

  void Backward(int s, int mb, int g, int poison) {
    auto fetched = engine_->Fetch(g, Tier::kDevice, {RoleBit(Role::kCompute)});
    ASSERT_TRUE(fetched.ok()) << fetched.status().message();
    auto buffer = optimizer_->AcquireGradients(g);
    ASSERT_TRUE(buffer.ok()) << buffer.status().message();
    std::mt19937_64 rng(s * 1000003 + mb * 101 + g);
    Reference::Group& r = ref_.groups[g];
    // The loss scale, and a size that changes so clipping fires on some
    // steps only: the norm is about 40, 81 or 122 per micro-batch. fp32
    // gradients take the same bf16 values, widened.
    const float scale = (s % 2 ? 1024.0f : 1.0f) * (1 + s % 3) / 2;
    std::vector<uint16_t> narrow(r.grads.size());
    for (const TensorView& t : buffer->tensors) {
      const uint64_t at = Offset(g, t.name);
      ASSERT_EQ(static_cast<char*>(t.data),
                static_cast<char*>(buffer->data) + at * (Fp32() ? 4 : 2));
      for (uint64_t i = 0; i < t.bytes / (Fp32() ? 4 : 2); ++i) {
        narrow[at + i] = RandomBf16(rng, 0.1f * (g + 1) * scale);
      }
    }
    if (g == poison && mb == 0) narrow[Offset(g, "t1") + 3] = 0x7fc0;  // NaN
    std::vector<float> wide(r.grads.size());
    ASSERT_TRUE(cpu_->Convert(narrow.data(), FloatType::kBF16, wide.data(),
                              FloatType::kF32, wide.size())
                    .ok());
    for (const TensorView& t : buffer->tensors) {
      const uint64_t at = Offset(g, t.name);
      const void* from =
          Fp32() ? static_cast<const void*>(&wide[at]) : &narrow[at];
      std::memcpy(t.data, from, t.bytes);
    }
    for (size_t i = 0; i < wide.size(); ++i) {
      r.grads[i] = mb == 0 ? wide[i] : r.grads[i] + wide[i];
    }
    ASSERT_TRUE(fetched->pin.Release().ok());
    ASSERT_TRUE(optimizer_->HandOff(*buffer).ok());
  }

  void Forward(int g) {
    auto view = engine_->Fetch(g, Tier::kDevice, {RoleBit(Role::kCompute)});
    ASSERT_TRUE(view.ok()) << view.status().message();
    if (steps_taken_ > 0) {
      for (const TensorView& t : view->tensors) {
        const uint64_t at = Offset(g, t.name);
        ASSERT_EQ(std::memcmp(t.data, ComputeRef(g, at), t.bytes), 0)
            << "forward of step " << steps_taken_ + 1 << " sees stale "
            << "parameters in layer." << g << "/" << t.name;
      }
    }
    ASSERT_TRUE(view->pin.Release().ok());
  }

  void ReferenceStep(const StepHyper& hyper, int64_t step) {
    const Config& c = GetParam();
    double total = 0;
    for (Reference::Group& r : ref_.groups) {
      auto sum =
          cpu_->SumSquares(r.grads.data(), FloatType::kF32, r.grads.size());
      ASSERT_TRUE(sum.ok());
      total += sum->sum;
    }
    const double norm = std::sqrt(total) / hyper.loss_scale;
    float coef = 1.0f;
    if (c.clip_norm > 0) {
      coef = static_cast<float>(std::min(1.0, c.clip_norm / (norm + 1e-6)));
      clipped_ += coef < 1.0f;
    }
    for (Reference::Group& r : ref_.groups) {
      OptimBuffers b;
      b.params = r.master.data();
      b.grads = r.grads.data();
      b.grad_type = FloatType::kF32;
      b.state1 = r.m.data();
      b.state2 = r.v.data();
      b.params_out = Fp32() ? nullptr : r.out.data();
      b.n = r.master.size();
      StepOptions o;
      o.algo = OptimAlgo::kAdamW;
      o.hyper = {hyper.lr,           hyper.beta1,    hyper.beta2, hyper.eps,
                 hyper.weight_decay, hyper.lr_decay, step};
      o.prep = {static_cast<float>(1.0 / hyper.loss_scale), coef};
      auto report = cpu_->Step(o, b);
      ASSERT_TRUE(report.ok() && !report->overflow());
    }
    ++steps_taken_;
  }

  // Every byte of master, m, v and the compute copy against the reference,
  // once the updates queued under the next forward have landed (a view of
  // a group's state beside the optimizer's work is beyond the budgets).
  void ExpectEqualToReference() {
    ASSERT_TRUE(engine_->Drain().ok());
    for (int g = 0; g < kGroups; ++g) {
      auto view =
          engine_->Fetch(g, Tier::kHost,
                         {RoleBit(Role::kCompute) | RoleBit(Role::kMaster) |
                          RoleBit(Role::kState1) | RoleBit(Role::kState2)});
      ASSERT_TRUE(view.ok()) << view.status().message();
      const Reference::Group& r = ref_.groups[g];
      for (const TensorView& t : view->tensors) {
        const uint64_t at = Offset(g, t.name);
        const void* expect = t.role == Role::kCompute  ? ComputeRef(g, at)
                             : t.role == Role::kMaster ? &r.master[at]
                             : t.role == Role::kState1 ? &r.m[at]
                                                       : &r.v[at];
        EXPECT_EQ(std::memcmp(t.data, expect, t.bytes), 0)
            << "layer." << g << "/" << t.name << " role " << RoleName(t.role)
            << " differs after " << steps_taken_ << " steps";
      }
      ASSERT_TRUE(view->pin.Release().ok());
    }
  }

  testutil::ScratchDir scratch_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<OffloadOptimizer> optimizer_;
  std::unique_ptr<CpuOptimizer> cpu_;
  Reference ref_;
  std::vector<std::map<std::string, uint64_t>> offsets_;
  int steps_taken_ = 0;
  int clipped_ = 0;
  int speculated_ = 0;  // groups, over the steps' reports
  int undone_ = 0;
};

}  // namespace strata::optim_test

#endif  // STRATA_TESTS_OPTIM_PIPELINE_FIXTURE_H_
