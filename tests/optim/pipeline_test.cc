// The offloaded optimizer pipeline against an in-memory reference: the same
// fp32 master weights stepped by cpu_adam directly, bit for bit.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
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
#include "tests/optim/pipeline_fixture.h"
#include "tests/store/store_util.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

using optim_test::Config;
using optim_test::kGroups;
using optim_test::kMiB;
using optim_test::Name;
using optim_test::PipelineTest;

TEST_P(PipelineTest, LongRunsAreBitIdenticalToInMemoryAdamW) {
  using optim_test::kLongRun;
  uint64_t after_first = 0, one_step = 0;  // NVMe reads
  for (int s = 0; s < kLongRun; ++s) {
    Result<OptimStepReport> report = Step(s);
    ASSERT_TRUE(report.ok())
        << "step " << s << ": " << report.status().message();
    ASSERT_FALSE(report->skipped);
    ASSERT_EQ(report->step, s + 1);
    if (s == 0 || s == kLongRun / 2 - 1) ExpectEqualToReference();
    const uint64_t reads = engine_->stats().bytes[2][1];
    if (s == 0) after_first = reads;
    if (s == 1) one_step = reads - after_first;
  }
  ExpectEqualToReference();
  if (GetParam().clip_norm > 0) {
    EXPECT_GT(clipped_, 0) << "clipping never fired: the test would not "
                              "catch a wrong clip coefficient";
    EXPECT_LT(clipped_, kLongRun) << "clipping always fired";
  }
  const EngineStats stats = engine_->stats();
  const int host = static_cast<int>(Tier::kHost);
  EXPECT_LE(stats.tiers[host].peak, stats.tiers[host].budget);
  if (GetParam().state_on_nvme) {
    // The state does not fit the host: every step streams it. (Step 0
    // writes the state and reads what it spilled, so it is no measure.)
    EXPECT_GT(one_step, 0u);
    EXPECT_GT(stats.bytes[2][1] - after_first, (kLongRun - 10) * one_step);
    EXPECT_GT(stats.bytes[1][2], 0u);
  }
}

// Issue #16: every byte goes through transport/, so EngineStats::bytes sees
// the optimizer's own copies. The test moves gradients device-to-host only by
// handing them off (its fetches to the device read; nothing it wrote there is
// written back), so the counter must grow by exactly the bytes handed off,
// all of them counted as the gradient role's (EngineStats::role_bytes).
TEST_P(PipelineTest, EngineStatsCountTheGradientCopies) {
  const int kDevice = static_cast<int>(Tier::kDevice);
  const int kHost = static_cast<int>(Tier::kHost);
  const int kGrad = static_cast<int>(Role::kGrad);
  ASSERT_TRUE(Step(0).ok());  // the first step's fills are not the point
  for (int s = 1; s < 3; ++s) {
    const uint64_t before = engine_->stats().bytes[kDevice][kHost];
    const uint64_t grads_before =
        engine_->stats().role_bytes[kGrad][kDevice][kHost];
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
    EXPECT_EQ(engine_->stats().role_bytes[kGrad][kDevice][kHost] - grads_before,
              handed_off)
        << "step " << s;
  }
}

// Issue #30 §2: a step abandoned in its backward (an error or Ctrl-C in
// the caller's code) ends with AbortStep. Where steps wait for the global
// norm nothing was applied and not a byte changed, so the next step runs
// as if the aborted one never began; in plain overlap mode the groups whose
// final gradients the CPU had taken stepped, and the report counts them.
TEST_P(PipelineTest, AnAbortedStepIsUndoneWhereStepsWaitForTheNorm) {
  const Config& c = GetParam();
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(Step(s).ok());
  ASSERT_TRUE(optimizer_->BeginStep(Hyper(2)).ok());
  for (int mb = 0; mb < c.micro_batches; ++mb) {
    for (int g = 0; g < kGroups; ++g) Forward(g);
    for (int g = kGroups - 1; g >= kGroups / 2; --g) Backward(2, mb, g, -1);
  }
  auto held = optimizer_->AcquireGradients(0);  // never handed off
  ASSERT_TRUE(held.ok()) << held.status().message();
  Result<OptimAbortReport> aborted = optimizer_->AbortStep();
  ASSERT_TRUE(aborted.ok()) << aborted.status().message();
  EXPECT_FALSE(aborted->completed);
  const bool waits = c.mode == OptimMode::kAfterBackward || c.clip_norm > 0;
  // Hand-offs the worker had not consumed yet are dropped, not applied.
  EXPECT_LE(aborted->applied, waits ? 0 : kGroups / 2);
  EXPECT_EQ(optimizer_->step(), 2);
  EXPECT_TRUE(optimizer_->AbortStep().ok());  // between steps: nothing
  if (!waits) return;
  ExpectEqualToReference();
  for (int s = 2; s < 4; ++s) ASSERT_TRUE(Step(s).ok());
  ExpectEqualToReference();
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
                    Config{OptimMode::kAfterBackward, true, 100, 1},
                    Config{OptimMode::kOverlap, true, 0, 4, false,
                           DType::kFloat32},
                    Config{OptimMode::kAfterBackward, true, 100, 1, false,
                           DType::kFloat32}),
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
  // A master without optimizer state is a frozen group's: nothing to train.
  auto engine =
      OneGroupEngine(RoleBit(Role::kCompute) | RoleBit(Role::kMaster));
  auto frozen = OffloadOptimizer::Create(engine.get(), {});
  ASSERT_FALSE(frozen.ok());
  EXPECT_NE(frozen.status().message().find("nothing to train"),
            std::string::npos)
      << frozen.status().message();
  auto missing = OffloadOptimizer::Create(
      OneGroupEngine(RoleBit(Role::kCompute) | RoleBit(Role::kMaster) |
                     RoleBit(Role::kState1))
          .get(),
      {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("tensor 'w0' has no 'state2'"),
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

// Fails reads of the swap file's first 4 KiB (group 0's master) while
// armed.
class ArmedReadFailure : public aio::FaultInjector {
 public:
  int CompletionResult(bool write, uint64_t offset, uint32_t len,
                       int result) override {
    (void)len;
    return armed && !write && offset < 4096 ? -EIO : result;
  }
  std::atomic<bool> armed{false};
};

// One step of the four groups of NvmeStateEngine, group g's gradients all
// zero but element g (1.0), handed off in reverse; its report in `report`
// when given.
Status StepOnes(OffloadOptimizer& o, OptimStepReport* report = nullptr) {
  STRATA_RETURN_IF_ERROR(o.BeginStep({}));
  for (int g = 3; g >= 0; --g) {
    STRATA_ASSIGN_OR_RETURN(GradientBuffer buffer, o.AcquireGradients(g));
    static_cast<uint16_t*>(buffer.data)[g] = 0x3f80;  // 1.0
    STRATA_RETURN_IF_ERROR(o.HandOff(buffer));
  }
  STRATA_ASSIGN_OR_RETURN(OptimStepReport done, o.FinishStep());
  if (report != nullptr) *report = done;
  return Status();
}

// With clipping in overlap mode a group's update runs after FinishStep
// returned. When it fails, the group's bytes are not the model's: the next
// forward's fetch of it fails naming the group and the fix, and so does
// Save, until a checkpoint is loaded; then training goes on.
TEST(OffloadOptimizerTest, AFailedUpdateUnderTheNextForwardStopsItsReaders) {
  testutil::ScratchDir scratch;
  ArmedReadFailure faults;
  auto engine = NvmeStateEngine(scratch.path(), 8 * kMiB, 5 * kMiB, &faults);
  ASSERT_NE(engine, nullptr);
  // Updates run under the next forward, not speculatively under backward.
  auto opt = OffloadOptimizer::Create(engine.get(),
                                      {.clip_norm = 1.0, .speculate = false});
  ASSERT_TRUE(opt.ok()) << opt.status().message();
  OffloadOptimizer& o = **opt;
  const auto step = [&] {
    const Status stepped = StepOnes(o);
    ASSERT_TRUE(stepped.ok()) << stepped.message();
  };
  const std::string ckpt = scratch.File("ckpt");
  step();
  ASSERT_TRUE(o.Save(ckpt).ok());
  // Group 0's state is read back from NVMe by its next update.
  ASSERT_TRUE(engine->Evict(0, Tier::kHost).ok());
  faults.armed = true;
  step();
  const FetchOptions compute{.roles = RoleBit(Role::kCompute)};
  auto forward = engine->Fetch(0, Tier::kDevice, compute);
  ASSERT_FALSE(forward.ok());
  EXPECT_EQ(forward.status().code(), StatusCode::kIoError);
  for (const char* part :
       {"update of group 'layer.0' at step 2", "load the last checkpoint"}) {
    EXPECT_NE(forward.status().message().find(part), std::string::npos)
        << forward.status().message();
  }
  EXPECT_TRUE(engine->Fetch(1, Tier::kDevice, compute).ok());
  EXPECT_FALSE(o.Save(scratch.File("other")).ok());
  EXPECT_FALSE(engine->Fetch(0, Tier::kDevice, compute).ok());
  faults.armed = false;
  const Status loaded = o.Load(ckpt);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  EXPECT_EQ(o.step(), 1);
  EXPECT_TRUE(engine->Fetch(0, Tier::kDevice, compute).ok());
  step();
  EXPECT_EQ(o.step(), 2);
}

// A speculative step that fails part-way (a read error on group 0's state,
// after groups 3, 2 and 1 stepped) fails FinishStep and leaves the model
// as it was: the speculated groups' state is restored and their compute
// copies rounded again from their masters, so the next forward reads
// the last step's weights.
TEST(OffloadOptimizerTest, AFailedSpeculativeStepLeavesTheModelAsItWas) {
  testutil::ScratchDir scratch;
  ArmedReadFailure faults;
  auto engine = NvmeStateEngine(scratch.path(), 8 * kMiB, 5 * kMiB, &faults);
  ASSERT_NE(engine, nullptr);
  auto opt = OffloadOptimizer::Create(engine.get(), {.clip_norm = 1e9});
  ASSERT_TRUE(opt.ok()) << opt.status().message();
  OffloadOptimizer& o = **opt;
  const auto snapshot = [&] {
    return store_test::GroupBytes(*engine, 4,
                                  kAllRoles & ~RoleBit(Role::kGrad));
  };
  ASSERT_TRUE(StepOnes(o).ok());  // not speculative: the pipeline's first
  const auto before = snapshot();
  ASSERT_TRUE(engine->Evict(0, Tier::kHost).ok());
  faults.armed = true;
  const Status failed = StepOnes(o);
  faults.armed = false;
  EXPECT_EQ(failed.code(), StatusCode::kIoError) << failed.ToString();
  // The read-ahead's prefetch of group 0 may have met the error too: the
  // engine reports it once.
  static_cast<void>(engine->Drain());
  EXPECT_EQ(o.step(), 1);
  EXPECT_TRUE(snapshot() == before) << "the failed step changed the model";
  ASSERT_TRUE(StepOnes(o).ok());
  EXPECT_EQ(o.step(), 2);
  EXPECT_FALSE(snapshot() == before);
}

// A step dirties every group's master, m, v and gradients once, so each is
// written to NVMe once at most per step (maybe in a later step, when it is
// evicted then): the gradients are written when they are kept and only
// read by the step. (A step that fetched them for writing dirtied them
// again, and wrote them twice.) Those still on the host when the step
// stands are discarded, not written (Note [Discarded bytes]).
TEST(OffloadOptimizerTest, KeptGradientsGoToNvmeOncePerStep) {
  testutil::ScratchDir scratch;
  auto engine = NvmeStateEngine(scratch.path(), 8 * kMiB, 4 * kMiB);
  ASSERT_NE(engine, nullptr);
  uint64_t discarded = 0;
  for (const OptimMode mode :
       {OptimMode::kAfterBackward, OptimMode::kOverlap}) {
    SCOPED_TRACE(std::string(OptimModeName(mode)));
    auto opt = OffloadOptimizer::Create(engine.get(),
                                        {.mode = mode, .clip_norm = 1e9});
    ASSERT_TRUE(opt.ok()) << opt.status().message();
    const uint64_t before = engine->stats().bytes[1][2];
    constexpr int kSteps = 4;
    for (int s = 0; s < kSteps; ++s) {
      ASSERT_TRUE((*opt)->BeginStep({}).ok());
      for (int g = 3; g >= 0; --g) {
        auto buffer = (*opt)->AcquireGradients(g);
        ASSERT_TRUE(buffer.ok()) << buffer.status().message();
        ASSERT_TRUE((*opt)->HandOff(*buffer).ok());
      }
      ASSERT_TRUE((*opt)->FinishStep().ok());
    }
    ASSERT_TRUE(engine->Drain().ok());
    const uint64_t chunk = 401408;  // 100000 fp32 in 4 KiB extents
    EXPECT_LE(engine->stats().bytes[1][2] - before, kSteps * 16 * chunk);
    EXPECT_GT(engine->stats().discarded_bytes, discarded);
    discarded = engine->stats().discarded_bytes;
  }
}

// Issue #34 §1: a speculative step keeps its gradients until FinishStep
// settles it; when the host holds them meanwhile (the write-behind leaves
// them) and the step stands, they are discarded: no gradient byte reaches
// NVMe, even when every group is evicted afterwards.
TEST(OffloadOptimizerTest, KeptGradientsTheHostHoldsAreNeverWritten) {
  testutil::ScratchDir scratch;
  auto engine = NvmeStateEngine(scratch.path(), 8 * kMiB, 12 * kMiB);
  ASSERT_NE(engine, nullptr);
  auto opt = OffloadOptimizer::Create(
      engine.get(), {.mode = OptimMode::kOverlap, .clip_norm = 1e9});
  ASSERT_TRUE(opt.ok()) << opt.status().message();
  int speculated = 0;
  for (int s = 0; s < 4; ++s) {
    OptimStepReport report;
    const Status stepped = StepOnes(**opt, &report);
    ASSERT_TRUE(stepped.ok()) << stepped.message();
    speculated += report.speculated;
  }
  ASSERT_TRUE(engine->Drain().ok());
  for (int g = 0; g < 4; ++g) {
    ASSERT_TRUE(engine->Evict(g, Tier::kHost).ok());
  }
  const EngineStats stats = engine->stats();
  constexpr int kGrad = static_cast<int>(Role::kGrad);
  EXPECT_GT(speculated, 0);
  EXPECT_EQ(stats.role_bytes[kGrad][1][2], 0u);
  EXPECT_GT(stats.discarded_bytes, 0u);
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

// Note [Waits the caller could end]: with both buffers acquired by this
// thread, a third AcquireGradients fails naming their groups (issue #30: it
// waited forever); from another thread it waits for a hand-off.
TEST(OffloadOptimizerTest, AnAcquireThatOnlyItsOwnThreadCouldEndFails) {
  testutil::ScratchDir dir;
  auto engine = NvmeStateEngine(dir.path(), 4 * kMiB, 4 * kMiB);
  ASSERT_NE(engine, nullptr);
  auto opt = OffloadOptimizer::Create(engine.get(), {.grad_buffers = 2});
  ASSERT_TRUE(opt.ok()) << opt.status().message();
  OffloadOptimizer& o = **opt;
  ASSERT_TRUE(o.BeginStep({}).ok());
  auto a = o.AcquireGradients(3);
  auto b = o.AcquireGradients(2);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = o.AcquireGradients(1);
  ASSERT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find(
                "all 2 gradient buffers are acquired by this thread and not "
                "handed off (groups 'layer.3', 'layer.2')"),
            std::string::npos)
      << c.status().message();
  std::future<Result<GradientBuffer>> other =
      std::async(std::launch::async, [&] { return o.AcquireGradients(1); });
  EXPECT_EQ(other.wait_for(std::chrono::milliseconds(100)),
            std::future_status::timeout);
  ASSERT_TRUE(o.HandOff(*a).ok());
  auto d = other.get();
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_TRUE(o.HandOff(*b).ok());
  ASSERT_TRUE(o.HandOff(*d).ok());
  auto e = o.AcquireGradients(0);
  ASSERT_TRUE(e.ok()) << e.status().message();
  ASSERT_TRUE(o.HandOff(*e).ok());
  EXPECT_TRUE(o.FinishStep().ok());
}

}  // namespace
}  // namespace strata
