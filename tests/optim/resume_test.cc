// Checkpoint and resume through OffloadOptimizer::Save/Load: the steps after
// a resume equal those of the uninterrupted run bit for bit, also when the
// checkpoint is loaded into another placement and mode; a save killed
// part-way leaves the previous checkpoint, which resumes exactly; damaged
// checkpoints and foreign optimizer state are refused with nothing changed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "src/store/residency.h"
#include "strata/engine.h"
#include "strata/offload_optimizer.h"
#include "tests/ckpt/checkpoint_util.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

constexpr int kGroups = 4;
constexpr uint64_t kMiB = 1 << 20;
constexpr RoleMask kStepped = RoleBit(Role::kCompute) | RoleBit(Role::kMaster) |
                              RoleBit(Role::kState1) | RoleBit(Role::kState2);

// Every stepped role of every group, as bytes, in registration order.
using Snapshot = std::vector<std::vector<char>>;

// A training run: an engine and its optimizer over kGroups groups of bf16
// tensors, with gradients that depend only on (step, group, tensor).
struct Run {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<OffloadOptimizer> optimizer;

  // `swap_dir` empty: every role on the host; otherwise the master and the
  // state on NVMe, with a host budget of about half the state.
  // `clip_norm` > 0 in overlap mode steps speculatively (state on NVMe,
  // from the second step) or under the next forward.
  static std::unique_ptr<Run> Open(const std::string& swap_dir, OptimMode mode,
                                   OptimAlgo algo = OptimAlgo::kAdamW,
                                   double clip_norm = 0) {
    auto run = std::make_unique<Run>();
    EngineOptions options;
    options.device = "host";
    options.device_budget = 1 * kMiB;
    options.host_budget = swap_dir.empty() ? 4 * kMiB : 768 << 10;
    options.nvme_budget = swap_dir.empty() ? 0 : 16 * kMiB;
    options.swap_dir = swap_dir;
    for (Role role :
         {Role::kMaster, Role::kState1, Role::kState2, Role::kGrad}) {
      options.placement.home[static_cast<int>(role)] =
          swap_dir.empty() ? Tier::kHost : Tier::kNvme;
    }
    auto engine = Engine::Open(options);
    EXPECT_TRUE(engine.ok()) << engine.status().message();
    if (!engine.ok()) return nullptr;
    run->engine = std::move(*engine);
    for (int g = 0; g < kGroups; ++g) {
      GroupSpec spec;
      spec.name = "layer." + std::to_string(g);
      spec.tensors = {{"w", {120, 133}, DType::kBFloat16, kAllRoles},
                      {"b", {4803}, DType::kBFloat16, kAllRoles}};
      EXPECT_TRUE(run->engine->RegisterGroup(spec).ok());
    }
    OffloadOptimizerOptions o;
    o.algo = algo;
    o.mode = mode;
    o.clip_norm = clip_norm;
    o.threads = 2;
    auto optimizer = OffloadOptimizer::Create(run->engine.get(), o);
    EXPECT_TRUE(optimizer.ok()) << optimizer.status().message();
    if (!optimizer.ok()) return nullptr;
    run->optimizer = std::move(*optimizer);
    return run;
  }

  // Writes role `role` of every tensor with values of `seed`.
  void Fill(Role role, uint64_t seed) {
    for (int g = 0; g < kGroups; ++g) {
      auto view = engine->Fetch(g, Tier::kHost, {RoleBit(role), true});
      ASSERT_TRUE(view.ok()) << view.status().message();
      for (const TensorView& t : view->tensors) Random(t, seed + g);
      ASSERT_TRUE(view->pin.Release().ok());
    }
  }

  // fp32 or bf16 values of N(0, scale) from `seed`.
  static void Random(const TensorView& t, uint64_t seed, float scale = 0.5f) {
    std::mt19937_64 rng(seed * 7919 + t.bytes);
    std::normal_distribution<float> dist(0.0f, scale);
    const uint64_t n = t.bytes / DTypeSize(t.dtype);
    for (uint64_t i = 0; i < n; ++i) {
      const float f = dist(rng);
      if (t.dtype == DType::kFloat32) {
        static_cast<float*>(t.data)[i] = f;
      } else {
        uint32_t bits;
        std::memcpy(&bits, &f, sizeof bits);
        static_cast<uint16_t*>(t.data)[i] = static_cast<uint16_t>(bits >> 16);
      }
    }
  }

  // Optimizer steps [from, to): forward, then backward with the hand-offs.
  void Steps(int from, int to) {
    for (int s = from; s < to; ++s) {
      StepHyper hyper;
      hyper.lr = 1e-2 * (1 + s % 3);  // a schedule
      hyper.weight_decay = 0.01;
      ASSERT_TRUE(optimizer->BeginStep(hyper).ok());
      for (int g = 0; g < kGroups; ++g) {
        // The view's pin is released with the temporary.
        ASSERT_TRUE(
            engine->Fetch(g, Tier::kDevice, {RoleBit(Role::kCompute)}).ok());
      }
      for (int g = kGroups - 1; g >= 0; --g) {
        auto buffer = optimizer->AcquireGradients(g);
        ASSERT_TRUE(buffer.ok()) << buffer.status().message();
        for (const TensorView& t : buffer->tensors) {
          Random(t, 1000u * s + g, 0.1f);
        }
        ASSERT_TRUE(optimizer->HandOff(*buffer).ok());
      }
      auto report = optimizer->FinishStep();
      ASSERT_TRUE(report.ok()) << report.status().message();
      ASSERT_EQ(report->step, s + 1);
    }
  }

  // Once the updates queued under the next forward have landed: a view of
  // a group's state beside the optimizer's work is beyond the budgets.
  Snapshot Take() { return store_test::GroupBytes(*engine, kGroups, kStepped); }
};

// The state after `steps` steps of an uninterrupted run from Fill's start.
Snapshot Uninterrupted(const std::string& swap_dir, int steps,
                       double clip_norm = 0) {
  auto run =
      Run::Open(swap_dir, OptimMode::kOverlap, OptimAlgo::kAdamW, clip_norm);
  if (run == nullptr) return {};
  run->Fill(Role::kMaster, 42);
  run->Steps(0, steps);
  return run->Take();
}

class ResumeTest : public testing::Test {
 protected:
  std::string Swap(const std::string& name) {
    const std::string dir = scratch_.path() + "/" + name;
    fs::create_directories(dir);
    return dir;
  }
  std::string Checkpoint() const { return scratch_.path() + "/ckpt"; }

  // Loads Checkpoint(), saved at step 3, into a fresh run and steps it on
  // to `expected`, the uninterrupted run's step 6.
  void ExpectResumesFromStep3(const Snapshot& expected, double clip_norm = 0) {
    auto run = Run::Open(Swap("parent"), OptimMode::kOverlap, OptimAlgo::kAdamW,
                         clip_norm);
    ASSERT_NE(run, nullptr);
    const Status loaded = run->optimizer->Load(Checkpoint());
    ASSERT_TRUE(loaded.ok()) << loaded.message();
    EXPECT_EQ(run->optimizer->step(), 3);
    run->Steps(3, 6);
    EXPECT_TRUE(run->Take() == expected);
  }

  testutil::ScratchDir scratch_;
};

TEST_F(ResumeTest, StepsAfterALoadEqualTheUninterruptedRun) {
  const Snapshot expected = Uninterrupted(Swap("a"), 10);
  ASSERT_FALSE(expected.empty());
  {
    auto run = Run::Open(Swap("b"), OptimMode::kOverlap);
    ASSERT_NE(run, nullptr);
    run->Fill(Role::kMaster, 42);
    run->Steps(0, 4);
    ASSERT_TRUE(run->optimizer->Save(Checkpoint(), "epoch 1").ok());
  }
  // Into every role on the host, and the other mode.
  auto run = Run::Open("", OptimMode::kAfterBackward);
  ASSERT_NE(run, nullptr);
  std::string user_state;
  const Status loaded = run->optimizer->Load(Checkpoint(), &user_state);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  EXPECT_EQ(run->optimizer->step(), 4);
  EXPECT_EQ(user_state, "epoch 1");
  EXPECT_NE(run->Take(), expected) << "4 steps already equal 10";
  run->Steps(4, 10);
  EXPECT_TRUE(run->Take() == expected)
      << "the resumed run diverged from the uninterrupted one";
}

TEST_F(ResumeTest, SaveInsideAStepIsRefused) {
  auto run = Run::Open("", OptimMode::kOverlap);
  ASSERT_NE(run, nullptr);
  ASSERT_TRUE(run->optimizer->BeginStep({}).ok());
  const Status s = run->optimizer->Save(Checkpoint());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("after FinishStep"), std::string::npos)
      << s.message();
  EXPECT_FALSE(fs::exists(Checkpoint()));
}

// A child saves at step 3, steps on to 5 and is killed while saving again;
// the checkpoint left behind resumes to the uninterrupted run's step 6.
TEST_F(ResumeTest, AKilledSaveLeavesACheckpointThatResumesExactly) {
  const Snapshot expected = Uninterrupted(Swap("a"), 6);
  ASSERT_FALSE(expected.empty());
  struct Kill {
    ckpt::SaveStage stage;
    int count;
  };
  for (const Kill kill : {Kill{ckpt::SaveStage::kDataFileWritten, 2},
                          Kill{ckpt::SaveStage::kOldMovedAside, 1}}) {
    SCOPED_TRACE("killed at stage " + std::to_string(int(kill.stage)));
    fs::remove_all(Checkpoint());
    fs::remove_all(Checkpoint() + ".old");
    int wstatus = 0;
    const pid_t child = ckpt_test::RunInChild(
        [&] {
          auto run = Run::Open(Swap("child"), OptimMode::kOverlap);
          if (run == nullptr) _exit(2);
          run->Fill(Role::kMaster, 42);
          run->Steps(0, 3);
          if (!run->optimizer->Save(Checkpoint()).ok()) _exit(4);
          run->Steps(3, 5);
          ckpt_test::KillAtSaveStage(kill.stage, kill.count);
          static_cast<void>(run->optimizer->Save(Checkpoint()));
        },
        &wstatus);
    ASSERT_GE(child, 0);
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
        << "the child exited with " << WEXITSTATUS(wstatus);
    ExpectResumesFromStep3(expected);
  }
}

// Every later settling of a speculative chunk in this process kills it
// (SIGKILL) the `count`th time. For a forked child only.
int speculation_kill_countdown = 0;
void KillAtSpeculationEnd(int count) {
  speculation_kill_countdown = count;
  store::SetSpeculationHookForTesting([] {
    if (--speculation_kill_countdown == 0) raise(SIGKILL);
  });
}

// With clipping and state on NVMe, each step's groups step speculatively
// under backward; FinishStep keeps those updates (clipping did not fire)
// or restores the old state and redoes them under the next forward. A
// child killed while the redo runs (or the last updates after a kept
// speculation), in the Save that waits for them, or in the middle of a
// switch-over (keeping or restoring the second group's chunks) leaves
// the checkpoint of step 3, which resumes to the uninterrupted run's
// step 6.
TEST_F(ResumeTest, AKillWhileUpdatesRunOrSettleLeavesAnExactCheckpoint) {
  enum class Kill { kAfterFinishStep, kInSave, kInSwitchOver };
  // The gradients' norm is about 29: 10 clips every step, 1e9 never.
  for (const double clip : {10.0, 1e9}) {
    const Snapshot expected = Uninterrupted(Swap("a"), 6, clip);
    ASSERT_FALSE(expected.empty());
    for (const Kill kill :
         {Kill::kAfterFinishStep, Kill::kInSave, Kill::kInSwitchOver}) {
      SCOPED_TRACE("clip " + std::to_string(clip) + ", kill " +
                   std::to_string(static_cast<int>(kill)));
      fs::remove_all(Checkpoint());
      int wstatus = 0;
      const pid_t child = ckpt_test::RunInChild(
          [&] {
            auto run = Run::Open(Swap("child"), OptimMode::kOverlap,
                                 OptimAlgo::kAdamW, clip);
            if (run == nullptr) _exit(2);
            run->Fill(Role::kMaster, 42);
            run->Steps(0, 3);
            if (!run->optimizer->Save(Checkpoint()).ok()) _exit(4);
            // Each group has three speculative chunks (master, m, v).
            if (kill == Kill::kInSwitchOver) KillAtSpeculationEnd(5);
            run->Steps(3, 5);
            if (kill == Kill::kInSwitchOver) _exit(5);  // not killed there
            if (kill == Kill::kAfterFinishStep) raise(SIGKILL);
            ckpt_test::KillAtSaveStage(ckpt::SaveStage::kDataFileWritten, 1);
            static_cast<void>(run->optimizer->Save(Checkpoint()));
          },
          &wstatus);
      ASSERT_GE(child, 0);
      ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
          << "the child exited with " << WEXITSTATUS(wstatus);
      ExpectResumesFromStep3(expected, clip);
    }
  }
}

// Each damage is refused naming the file or the reason, and the engine's
// data and the step count stay as they were.
TEST_F(ResumeTest, BadCheckpointsAreRefusedAndChangeNothing) {
  {
    auto run = Run::Open("", OptimMode::kOverlap);
    ASSERT_NE(run, nullptr);
    run->Fill(Role::kMaster, 42);
    run->Steps(0, 2);
    ASSERT_TRUE(run->optimizer->Save(Checkpoint()).ok());
    ASSERT_TRUE(run->engine->Save(scratch_.path() + "/plain").ok());
  }
  auto run = Run::Open("", OptimMode::kOverlap);
  ASSERT_NE(run, nullptr);
  run->Fill(Role::kMaster, 7);
  run->Steps(0, 1);
  const Snapshot before = run->Take();
  auto expect_refused = [&](const std::string& dir, const std::string& says) {
    const Status s = run->optimizer->Load(dir);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
    EXPECT_EQ(run->optimizer->step(), 1);
    EXPECT_TRUE(run->Take() == before) << "a refused load changed data";
  };
  expect_refused(scratch_.path() + "/plain", "Engine::Save");
  {
    auto lion = Run::Open("", OptimMode::kOverlap, OptimAlgo::kLion);
    ASSERT_NE(lion, nullptr);
    const Status s = lion->optimizer->Load(Checkpoint());
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("saved by the AdamW optimizer"),
              std::string::npos)
        << s.message();
  }
  const std::string file = Checkpoint() + "/group-000002.bin";
  ckpt_test::FlipByte(file, 1000);
  expect_refused(Checkpoint(), "checksum mismatch in '" + file + "'");
  ckpt_test::FlipByte(file, 1000);
  fs::resize_file(file, fs::file_size(file) - 1);
  expect_refused(Checkpoint(), "'" + file + "' is truncated");
}

}  // namespace
}  // namespace strata
