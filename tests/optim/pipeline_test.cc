// The offloaded optimizer pipeline against an in-memory reference: the same
// fp32 master weights stepped by cpu_adam directly, bit for bit.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "src/store/engine_internal.h"
#include "strata/cpu_adam.h"
#include "strata/engine.h"
#include "strata/offload_optimizer.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

constexpr int kGroups = 4;
// Sizes that are not multiples of the vector width or of the 128-element
// tensor alignment, so padding sits between tensors.
const std::vector<int64_t> kTensorSizes = {16000, 1232, 4803};
constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kHostBudgetNvme = 768 << 10;

struct Config {
  OptimMode mode;
  bool state_on_nvme;
  double clip_norm;
  int micro_batches;
  bool skip_on_overflow = false;
};

std::string Name(const testing::TestParamInfo<Config>& info) {
  const Config& c = info.param;
  return std::string(OptimModeName(c.mode)) +
         (c.state_on_nvme ? "_nvme" : "_host") +
         (c.clip_norm > 0 ? "_clip" : "_noclip") + "_mb" +
         std::to_string(c.micro_batches) + (c.skip_on_overflow ? "_skip" : "");
}

uint16_t RandomBf16(std::mt19937_64& rng, float scale) {
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
    // the steps must stream it.
    options.host_budget = c.state_on_nvme ? kHostBudgetNvme : 4 * kMiB;
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
        spec.tensors.push_back({"t" + std::to_string(t),
                                {kTensorSizes[t]},
                                DType::kBFloat16,
                                kAllRoles});
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
    return report;
  }

  void Backward(int s, int mb, int g, int poison) {
    auto fetched = engine_->Fetch(g, Tier::kDevice, {RoleBit(Role::kCompute)});
    ASSERT_TRUE(fetched.ok()) << fetched.status().message();
    auto buffer = optimizer_->AcquireGradients(g);
    ASSERT_TRUE(buffer.ok()) << buffer.status().message();
    std::mt19937_64 rng(s * 1000003 + mb * 101 + g);
    auto* grads = static_cast<uint16_t*>(buffer->data);
    Reference::Group& r = ref_.groups[g];
    // The loss scale, and a size that changes so clipping fires on some
    // steps only: the norm is about 40, 81 or 122 per micro-batch.
    const float scale = (s % 2 ? 1024.0f : 1.0f) * (1 + s % 3) / 2;
    for (const TensorView& t : buffer->tensors) {
      const uint64_t at = Offset(g, t.name);
      ASSERT_EQ(static_cast<uint16_t*>(t.data), grads + at);
      for (uint64_t i = 0; i < t.bytes / 2; ++i) {
        grads[at + i] = RandomBf16(rng, 0.1f * (g + 1) * scale);
      }
    }
    if (g == poison && mb == 0) grads[Offset(g, "t1") + 3] = 0x7fc0;  // NaN
    std::vector<float> wide(r.grads.size());
    ASSERT_TRUE(cpu_->Convert(grads, FloatType::kBF16, wide.data(),
                              FloatType::kF32, wide.size())
                    .ok());
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
        ASSERT_EQ(std::memcmp(t.data, &ref_.groups[g].out[at], t.bytes), 0)
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
      b.params_out = r.out.data();
      b.out_type = FloatType::kBF16;
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

  // Every byte of master, m, v and the compute copy against the reference.
  void ExpectEqualToReference() {
    for (int g = 0; g < kGroups; ++g) {
      auto view =
          engine_->Fetch(g, Tier::kHost,
                         {RoleBit(Role::kCompute) | RoleBit(Role::kMaster) |
                          RoleBit(Role::kState1) | RoleBit(Role::kState2)});
      ASSERT_TRUE(view.ok()) << view.status().message();
      const Reference::Group& r = ref_.groups[g];
      for (const TensorView& t : view->tensors) {
        const uint64_t at = Offset(g, t.name);
        const void* expect = t.role == Role::kCompute
                                 ? static_cast<const void*>(&r.out[at])
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
};

TEST_P(PipelineTest, FiftyStepsAreBitIdenticalToInMemoryAdamW) {
  uint64_t nvme_reads = 0;
  for (int s = 0; s < 50; ++s) {
    Result<OptimStepReport> report = Step(s);
    ASSERT_TRUE(report.ok())
        << "step " << s << ": " << report.status().message();
    ASSERT_FALSE(report->skipped);
    ASSERT_EQ(report->step, s + 1);
    if (s == 0 || s == 24) ExpectEqualToReference();
    if (s == 0) {
      nvme_reads = engine_->stats().bytes[2][1];
    }
  }
  ExpectEqualToReference();
  if (GetParam().clip_norm > 0) {
    EXPECT_GT(clipped_, 0) << "clipping never fired: the test would not "
                              "catch a wrong clip coefficient";
    EXPECT_LT(clipped_, 50) << "clipping always fired";
  }
  const EngineStats stats = engine_->stats();
  const int host = static_cast<int>(Tier::kHost);
  EXPECT_LE(stats.tiers[host].peak, stats.tiers[host].budget);
  if (GetParam().state_on_nvme) {
    // The state does not fit the host: every step streams it.
    EXPECT_GT(stats.bytes[2][1], 40 * nvme_reads);
    EXPECT_GT(stats.bytes[1][2], 0u);
  }
}

// Issue #16: every byte goes through transport/, so EngineStats::bytes sees
// the optimizer's own copies. The test moves gradients device-to-host only by
// handing them off (its fetches to the device read; nothing it wrote there is
// written back), so the counter must grow by exactly the bytes handed off.
TEST_P(PipelineTest, EngineStatsCountTheGradientCopies) {
  const int kDevice = static_cast<int>(Tier::kDevice);
  const int kHost = static_cast<int>(Tier::kHost);
  ASSERT_TRUE(Step(0).ok());  // the first step's fills are not the point
  for (int s = 1; s < 3; ++s) {
    const uint64_t before = engine_->stats().bytes[kDevice][kHost];
    uint64_t handed_off = 0;
    ASSERT_TRUE(optimizer_->BeginStep(Hyper(s)).ok());
    for (int mb = 0; mb < GetParam().micro_batches; ++mb) {
      for (int g = kGroups - 1; g >= 0; --g) {
        auto buffer = optimizer_->AcquireGradients(g);
        ASSERT_TRUE(buffer.ok()) << buffer.status().message();
        handed_off += buffer->bytes;
        ASSERT_TRUE(optimizer_->HandOff(*buffer).ok());
      }
    }
    Result<OptimStepReport> report = optimizer_->FinishStep();
    ASSERT_TRUE(report.ok()) << report.status().message();
    EXPECT_GT(handed_off, 0u);
    EXPECT_EQ(engine_->stats().bytes[kDevice][kHost] - before, handed_off)
        << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, PipelineTest,
    testing::Values(Config{OptimMode::kOverlap, false, 0, 1},
                    Config{OptimMode::kOverlap, true, 0, 1},
                    Config{OptimMode::kOverlap, false, 0, 4},
                    Config{OptimMode::kOverlap, true, 0, 4},
                    Config{OptimMode::kOverlap, false, 100, 1},
                    Config{OptimMode::kOverlap, true, 200, 4},
                    Config{OptimMode::kAfterBackward, false, 0, 1},
                    Config{OptimMode::kAfterBackward, true, 0, 1},
                    Config{OptimMode::kAfterBackward, false, 200, 4},
                    Config{OptimMode::kAfterBackward, true, 100, 1}),
    Name);

using OverflowTest = PipelineTest;

TEST_P(OverflowTest, NonFiniteGradientsSkipOrFailNamingTheGroup) {
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(Step(s).ok());
  const Result<OptimStepReport> poisoned = Step(3, /*poison=*/2);
  if (GetParam().skip_on_overflow) {
    ASSERT_TRUE(poisoned.ok()) << poisoned.status().message();
    EXPECT_TRUE(poisoned->skipped);
    EXPECT_EQ(poisoned->step, 3);
    EXPECT_EQ(optimizer_->step(), 3);
    ExpectEqualToReference();  // not one byte changed
    ASSERT_TRUE(Step(4).ok());
    ExpectEqualToReference();
  } else {
    ASSERT_FALSE(poisoned.ok());
    EXPECT_EQ(poisoned.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(poisoned.status().message().find("group 'layer.2'"),
              std::string::npos)
        << poisoned.status().message();
    EXPECT_EQ(optimizer_->step(), 3);
  }
}

// The group with the highest id is handed off first in backward and last
// in the global checks: a NaN there must be caught like anywhere else.
TEST_P(OverflowTest, NonFiniteGradientsInTheLastGroupAreCaught) {
  ASSERT_TRUE(Step(0).ok());
  const Result<OptimStepReport> poisoned = Step(1, /*poison=*/kGroups - 1);
  if (GetParam().skip_on_overflow) {
    ASSERT_TRUE(poisoned.ok()) << poisoned.status().message();
    EXPECT_TRUE(poisoned->skipped);
    EXPECT_EQ(optimizer_->step(), 1);
    ExpectEqualToReference();
  } else {
    ASSERT_FALSE(poisoned.ok());
    EXPECT_NE(poisoned.status().message().find("group 'layer.3'"),
              std::string::npos)
        << poisoned.status().message();
    EXPECT_EQ(optimizer_->step(), 1);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Policies, OverflowTest,
    testing::Values(Config{OptimMode::kOverlap, false, 0, 1, true},
                    Config{OptimMode::kOverlap, true, 200, 4, true},
                    Config{OptimMode::kAfterBackward, false, 0, 1, true},
                    Config{OptimMode::kOverlap, false, 0, 1, false}),
    Name);

// A host-emulated engine with one group "layer.0" whose tensors have
// `roles` and the given compute dtypes.
std::unique_ptr<Engine> OneGroupEngine(RoleMask roles,
                                       std::vector<DType> dtypes = {
                                           DType::kBFloat16}) {
  EngineOptions options;
  options.device = "host";
  options.device_budget = options.host_budget = 4 * kMiB;
  auto engine = Engine::Open(options);
  EXPECT_TRUE(engine.ok());
  GroupSpec spec;
  spec.name = "layer.0";
  for (size_t i = 0; i < dtypes.size(); ++i) {
    spec.tensors.push_back({"w" + std::to_string(i), {100}, dtypes[i], roles});
  }
  EXPECT_TRUE((*engine)->RegisterGroup(spec).ok());
  return std::move(*engine);
}

// Four groups of 100000 bf16 elements: compute (200 KB) homed on the host
// and allowed on the device, master, m and v (400 KB each) on NVMe.
std::unique_ptr<Engine> NvmeStateEngine(const std::string& swap_dir,
                                        uint64_t device, uint64_t host,
                                        aio::FaultInjector* faults = nullptr) {
  EngineOptions options;
  options.device = "host";
  options.device_budget = device;
  options.host_budget = host;
  options.nvme_budget = 16 * kMiB;
  options.swap_dir = swap_dir;
  options.placement.home = {Tier::kHost, Tier::kNvme, Tier::kNvme, Tier::kNvme,
                            Tier::kNvme};
  options.placement.device_roles = RoleBit(Role::kCompute);
  auto engine =
      internal::EngineAccess::Open(options, {.fault_injector = faults});
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  if (!engine.ok()) return nullptr;
  for (int g = 0; g < 4; ++g) {
    GroupSpec spec;
    spec.name = "layer." + std::to_string(g);
    spec.tensors.push_back({"w", {100000}, DType::kBFloat16, kAllRoles});
    auto id = (*engine)->RegisterGroup(spec);
    EXPECT_TRUE(id.ok()) << id.status().message();
  }
  return std::move(*engine);
}

TEST(OffloadOptimizerTest, MissingRolesAndMixedDtypesFailAtCreate) {
  auto engine =
      OneGroupEngine(RoleBit(Role::kCompute) | RoleBit(Role::kMaster));
  auto missing = OffloadOptimizer::Create(engine.get(), {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("tensor 'w0' has no 'state1'"),
            std::string::npos)
      << missing.status().message();
  OffloadOptimizerOptions accumulate;
  accumulate.micro_batches = 2;
  auto no_grad = OffloadOptimizer::Create(
      OneGroupEngine(kAllRoles & ~RoleBit(Role::kGrad)).get(), accumulate);
  EXPECT_NE(no_grad.status().message().find("no 'grad' role"),
            std::string::npos)
      << no_grad.status().message();
  auto mixed = OffloadOptimizer::Create(
      OneGroupEngine(kAllRoles, {DType::kBFloat16, DType::kFloat32}).get(), {});
  EXPECT_NE(mixed.status().message().find("mixes compute dtypes"),
            std::string::npos)
      << mixed.status().message();

  EXPECT_EQ(OffloadOptimizer::Create(nullptr, {}).status().code(),
            StatusCode::kInvalidArgument);
  OffloadOptimizerOptions bad;
  bad.clip_norm = -1;
  EXPECT_EQ(OffloadOptimizer::Create(engine.get(), bad).status().code(),
            StatusCode::kInvalidArgument);
}

// The gradient buffers and one group's step must fit beside what each
// tier is home to; otherwise Create says by how much.
TEST(OffloadOptimizerTest, BudgetsTooSmallForTheBuffersFailAtCreate) {
  testutil::ScratchDir scratch;
  auto open = [&](uint64_t device, uint64_t host) {
    return NvmeStateEngine(scratch.path(), device, host);
  };
  // 3 MiB less 900 KiB of compute copies holds 1.2 MB for a step beside 2
  // staging buffers of 200 KB, but not beside 6.
  OffloadOptimizerOptions six;
  six.grad_buffers = 6;
  auto host = OffloadOptimizer::Create(open(8 * kMiB, 3 * kMiB).get(), six);
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(host.status().message().find("raise the host budget by"),
            std::string::npos)
      << host.status().message();
  auto device = OffloadOptimizer::Create(open(512 << 10, 3 * kMiB).get(), {});
  ASSERT_FALSE(device.ok());
  EXPECT_NE(device.status().message().find("raise the device budget"),
            std::string::npos)
      << device.status().message();
  EXPECT_TRUE(
      OffloadOptimizer::Create(open(1 * kMiB, 3 * kMiB).get(), {}).ok());
}

// A write-behind to NVMe that fails is reported once by FinishStep (which
// ends the step with it), the next BeginStep or Save, depending on when it
// ends; a call inside the step may meet it first. Either way the next step
// runs. The failing write is at offset 0 of the swap file: group 0's
// master, registered first and stepped last, so its write-behind tends to
// end after FinishStep has returned.
TEST(OffloadOptimizerTest, WriteBehindErrorIsReportedOnceWheneverItEnds) {
  for (int buffers : {1, 4}) {
    SCOPED_TRACE(buffers);
    testutil::ScratchDir scratch;
    testutil::ErrnoInjector eio(EIO, 0, 4096, /*times=*/1,
                                /*writes_only=*/true);
    auto engine = NvmeStateEngine(scratch.path(), 8 * kMiB, 5 * kMiB, &eio);
    ASSERT_NE(engine, nullptr);
    OffloadOptimizerOptions o_options;
    o_options.grad_buffers = buffers;
    auto opt = OffloadOptimizer::Create(engine.get(), o_options);
    ASSERT_TRUE(opt.ok()) << opt.status().message();
    OffloadOptimizer& o = **opt;
    int reported = 0;  // by FinishStep, BeginStep and Save
    const auto count = [&](const Status& s) {
      if (s.ok()) return;
      ++reported;
      EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
    };
    const auto backward = [&] {  // false when a call met the error
      for (int g = 3; g >= 0; --g) {
        auto buffer = o.AcquireGradients(g);
        if (!buffer.ok()) {
          EXPECT_EQ(buffer.status().code(), StatusCode::kIoError);
          return false;
        }
        EXPECT_TRUE(o.HandOff(*buffer).ok());
      }
      return true;
    };
    ASSERT_TRUE(o.BeginStep({}).ok());
    const bool clean = backward();
    const Status first = o.FinishStep().status();
    EXPECT_TRUE(clean || !first.ok()) << "the step did not end on its error";
    count(first);
    for (int i = 0; i < 10000 && eio.injected.load() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(eio.injected.load(), 1u) << "no write-behind reached NVMe";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));

    Status begin = o.BeginStep({});
    count(begin);
    if (!begin.ok()) {
      EXPECT_NE(begin.message().find("after FinishStep returned"),
                std::string::npos)
          << begin.message();
      begin = o.BeginStep({});
    }
    ASSERT_TRUE(begin.ok()) << begin.ToString();
    EXPECT_TRUE(backward());
    count(o.FinishStep().status());
    count(o.Save(scratch.File("ckpt")));
    EXPECT_EQ(reported, 1) << "the failed write-behind was lost or repeated";
  }
}

TEST(OffloadOptimizerTest, CallsOutOfOrderAreRefused) {
  auto engine = OneGroupEngine(kAllRoles);
  auto opt = OffloadOptimizer::Create(engine.get(), {});
  ASSERT_TRUE(opt.ok()) << opt.status().message();
  OffloadOptimizer& o = **opt;
  EXPECT_EQ(o.AcquireGradients(0).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(o.FinishStep().status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(o.BeginStep({}).ok());
  EXPECT_EQ(o.BeginStep({}).code(), StatusCode::kFailedPrecondition);
  auto finish = o.FinishStep();
  ASSERT_FALSE(finish.ok());
  EXPECT_NE(finish.status().message().find("handed off 0 of 1"),
            std::string::npos);
  StepHyper bad;
  bad.loss_scale = 0;
  EXPECT_EQ(o.BeginStep(bad).code(), StatusCode::kInvalidArgument);
  // A group handed off micro_batches times gets no more buffers: with every
  // buffer taken, waiting for one would never end.
  auto buffer = o.AcquireGradients(0);
  ASSERT_TRUE(buffer.ok()) << buffer.status().message();
  ASSERT_TRUE(o.HandOff(*buffer).ok());
  EXPECT_EQ(o.AcquireGradients(0).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(o.FinishStep().ok());
}

}  // namespace
}  // namespace strata
