// Note [Checkpoint crash safety] (src/ckpt/checkpoint.h) one file-system
// call at a time, through a FaultEnv (tests/ckpt/fault_env.h): a save cut
// off before any step of the protocol leaves a checkpoint that loads
// exactly, the previous or the new; a step that fails keeps the previous
// checkpoint and says where; a load that fails says what it changed. One
// save is killed for real (fork, SIGKILL) on the real file system.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "strata/engine.h"
#include "tests/ckpt/checkpoint_util.h"
#include "tests/ckpt/fault_env.h"
#include "tests/store/store_util.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ckpt_test::FaultEnv;
using ckpt_test::Op;

constexpr int kGroups = 4;

class CheckpointCrashTest : public ::testing::Test {
 protected:
  // A host-only engine of kGroups groups holding ckpt_test::Fill(seed).
  static std::unique_ptr<Engine> Open(uint64_t seed) {
    std::vector<GroupSpec> model;
    for (int g = 0; g < kGroups; ++g) {
      model.push_back(store_test::Layer("layer." + std::to_string(g), 999 + g));
    }
    auto engine = ckpt_test::OpenWithModel(ckpt_test::HostOnly(), model);
    if (engine != nullptr) ckpt_test::Fill(*engine, seed);
    return engine;
  }
  // Saves Open(seed)'s data to Ckpt() through `env`.
  Status Save(ckpt::Env& env, uint64_t seed) const {
    auto engine = Open(seed);
    if (engine == nullptr) return Status::Internal("no engine to save");
    return ckpt_test::SaveThrough(env, *engine, ckpt_test::HostOnly(), Ckpt());
  }
  // Expects Load to find Open(seed)'s data at Ckpt(), restoring it from
  // "ckpt.old" first when `recovered` (and saying so).
  void ExpectLoads(uint64_t seed, bool recovered) const {
    auto engine = Open(99);
    ASSERT_NE(engine, nullptr);
    LoadResult result;
    Status s = Status::Internal("unset");
    const std::string log =
        testutil::CaptureStderr([&] { s = engine->Load(Ckpt(), &result); });
    ASSERT_TRUE(s.ok()) << s.ToString();
    ckpt_test::Check(*engine, seed);
    EXPECT_EQ(result.recovered, recovered);
    EXPECT_EQ(log.find("ckpt.old") != std::string::npos, recovered) << log;
  }
  // Expects the next save to clean up whatever a crash left.
  void ExpectNextSaveCleansUp() const {
    ASSERT_TRUE(Save(ckpt::Env::Default(), 3).ok());
    EXPECT_EQ(Left(), std::vector<std::string>{"ckpt"});
    ExpectLoads(3, false);
  }
  // The entries beside Ckpt() that a save makes, sorted.
  std::vector<std::string> Left() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_.path())) {
      const std::string name = e.path().filename();
      if (name.rfind("ckpt", 0) == 0) out.push_back(name);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string Ckpt() const { return dir_.File("ckpt"); }
  std::string Old() const { return Ckpt() + ".old"; }
  std::string Tmp() const { return dir_.File(TmpName()); }
  static std::string TmpName(pid_t pid = getpid()) {
    return "ckpt.tmp-" + std::to_string(pid);
  }

  void SetUp() override { ASSERT_TRUE(Save(ckpt::Env::Default(), 1).ok()); }

  testutil::ScratchDir dir_;
};

TEST_F(CheckpointCrashTest, ASaveCutOffAnywhereLeavesACheckpointThatLoads) {
  // Where the cut leaves the checkpoints: the previous one in place, aside
  // (Load restores it) or the new one in place.
  enum Stage { kOldInPlace, kOldAside, kNewInPlace };
  const std::vector<std::string> left[] = {
      {"ckpt", TmpName()}, {"ckpt.old", TmpName()}, {"ckpt", "ckpt.old"}};
  struct Case {
    Op op;
    int nth;
    std::string hit;  // the call cut off
    Stage stage;
  };
  const std::vector<Case> cases = {
      {Op::kNewFile, 3, "create '" + Tmp() + "/group-000002.bin'", kOldInPlace},
      {Op::kWrite, 4, "write '" + Tmp() + "/group-000001.bin'", kOldInPlace},
      {Op::kNewFile, kGroups + 1, "create '" + Tmp() + "/manifest.json'",
       kOldInPlace},
      {Op::kRename, 1, "rename '" + Ckpt() + "' to '" + Old() + "'",
       kOldInPlace},
      {Op::kRename, 2, "rename '" + Tmp() + "' to '" + Ckpt() + "'", kOldAside},
      {Op::kSyncDir, 2, "fsync '" + dir_.path() + "'", kNewInPlace},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.hit);
    FaultEnv env;
    env.CrashAt(c.op, c.nth);
    EXPECT_FALSE(Save(env, 2).ok());
    ASSERT_TRUE(env.crashed());
    EXPECT_EQ(env.hit(), c.hit);
    EXPECT_EQ(Left(), left[c.stage]);
    ExpectLoads(c.stage == kNewInPlace ? 2 : 1, c.stage == kOldAside);
    ExpectNextSaveCleansUp();
    ASSERT_TRUE(Save(ckpt::Env::Default(), 1).ok());
  }
}

TEST_F(CheckpointCrashTest, AFailedStepKeepsThePreviousCheckpoint) {
  struct Case {
    Op op;
    int nth;
    int err;
    StatusCode code;
    std::string call;  // the call that fails
  };
  const std::vector<Case> cases = {
      {Op::kCreateDir, 1, EROFS, StatusCode::kPermissionDenied,
       "create '" + Tmp() + "'"},
      {Op::kWrite, 3, ENOSPC, StatusCode::kNoSpace,
       "write '" + Tmp() + "/group-000001.bin'"},
      {Op::kSync, 3, EIO, StatusCode::kIoError,
       "fsync '" + Tmp() + "/group-000002.bin'"},
      {Op::kNewFile, kGroups + 1, EACCES, StatusCode::kPermissionDenied,
       "create '" + Tmp() + "/manifest.json'"},
      {Op::kSyncDir, 1, EIO, StatusCode::kIoError, "fsync '" + Tmp() + "'"},
      {Op::kRename, 1, EBUSY, StatusCode::kIoError,
       "rename '" + Ckpt() + "' to '" + Old() + "'"},
      {Op::kRename, 2, EIO, StatusCode::kIoError,
       "rename '" + Tmp() + "' to '" + Ckpt() + "'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.call);
    FaultEnv env;
    env.FailAt(c.op, c.nth, c.err);
    const Status s = Save(env, 2);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), c.code) << s.ToString();
    EXPECT_EQ(s.message().rfind("cannot " + c.call + ": ", 0), 0u)
        << s.message();
    // A save that has not made its temporary yet has nothing to report.
    if (c.op != Op::kCreateDir) {
      EXPECT_NE(s.message().find("; the previous checkpoint at '" + Ckpt() +
                                 "' is kept"),
                std::string::npos)
          << s.message();
    }
    EXPECT_FALSE(env.crashed());
    EXPECT_EQ(Left(), std::vector<std::string>{"ckpt"});
    ExpectLoads(1, false);
  }
}

// The temporary cannot be moved into place, nor the previous checkpoint
// back: it stays aside, and Load restores it.
TEST_F(CheckpointCrashTest, BothRenamesFailingLeaveThePreviousForLoad) {
  FaultEnv env;
  env.FailAt(Op::kRename, 2, EIO);
  env.FailAt(Op::kRename, 3, EIO);
  const Status s = Save(env, 2);
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("the previous checkpoint at '" + Old() +
                             "' is kept (Load restores it)"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(Left(), std::vector<std::string>{"ckpt.old"});
  ExpectLoads(1, true);
  EXPECT_EQ(Left(), std::vector<std::string>{"ckpt"});
}

TEST_F(CheckpointCrashTest, AFailedSyncOfTheParentSaysToSaveAgain) {
  FaultEnv env;
  env.FailAt(Op::kSyncDir, 2, EIO);
  const Status s = Save(env, 2);
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("cannot fsync '" + dir_.path() + "'"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("the new checkpoint is at '" + Ckpt() +
                             "' but may not survive a crash of the "
                             "machine: save again"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(Left(), (std::vector<std::string>{"ckpt", "ckpt.old"}));
  ExpectLoads(2, false);
  ExpectNextSaveCleansUp();
}

TEST_F(CheckpointCrashTest, ALoadThatCannotRestoreThePreviousSaysWhy) {
  FaultEnv cut;
  cut.CrashAt(Op::kRename, 2);
  EXPECT_FALSE(Save(cut, 2).ok());
  auto engine = Open(5);
  ASSERT_NE(engine, nullptr);
  FaultEnv env;
  env.FailAt(Op::kRename, 1, EACCES);
  const Status s = ckpt_test::LoadThrough(env, *engine, Ckpt());
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_NE(
      s.message().find("cannot rename '" + Old() + "' to '" + Ckpt() + "'"),
      std::string::npos)
      << s.message();
  ckpt_test::Check(*engine, 5);
  EXPECT_EQ(Left(), (std::vector<std::string>{"ckpt.old", TmpName()}));
  ExpectLoads(1, true);
}

// Reads: the manifest, one per data file to verify it (each is smaller
// than the verify buffer), then the loading.
TEST_F(CheckpointCrashTest, AReadErrorChangesNothingUntilTheDataIsVerified) {
  auto engine = Open(5);
  ASSERT_NE(engine, nullptr);
  FaultEnv verifying;
  verifying.FailAt(Op::kRead, 2, EIO);
  Status s = ckpt_test::LoadThrough(verifying, *engine, Ckpt());
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("cannot read '" + Ckpt() + "/group-000000.bin'"),
            std::string::npos)
      << s.message();
  ckpt_test::Check(*engine, 5);

  FaultEnv loading;
  loading.FailAt(Op::kRead, 2 + kGroups, EIO);
  s = ckpt_test::LoadThrough(loading, *engine, Ckpt());
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("partly loaded: load again"), std::string::npos)
      << s.message();
  ASSERT_TRUE(engine->Load(Ckpt()).ok());
  ckpt_test::Check(*engine, 1);
}

// The one save killed for real: a child dies (SIGKILL) on the real file
// system right after moving the previous checkpoint aside.
TEST_F(CheckpointCrashTest, AKilledSaveLeavesThePreviousForLoad) {
  int wstatus = 0;
  const pid_t child = ckpt_test::RunInChild(
      [&] {
        FaultEnv env;
        env.CrashAt(Op::kRename, 2, [] { raise(SIGKILL); });
        (void)Save(env, 2);
      },
      &wstatus);
  ASSERT_GE(child, 0);
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
      << "child exited with " << wstatus;
  EXPECT_EQ(Left(), (std::vector<std::string>{"ckpt.old", TmpName(child)}));
  ExpectLoads(1, true);
  ExpectNextSaveCleansUp();
}

}  // namespace
}  // namespace strata
