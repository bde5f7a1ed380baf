// Engine::Save and Engine::Load (src/ckpt/checkpoint.h) at the edges of the
// protocol: a data file larger than Load's verify buffer, paths spelled
// with trailing slashes, temporaries of saves that are still running, a
// file system that accepts only part of a write, and a manifest changed
// after Save (its own checksum) or holding numbers no count can be.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/engine.h"
#include "tests/ckpt/checkpoint_util.h"
#include "tests/store/store_util.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using store_test::kKiB;

using ckpt_test::Check;
using ckpt_test::Fill;

class CheckpointEdgeTest : public ::testing::Test {
 protected:
  // A host-only engine with `model` registered.
  static std::unique_ptr<Engine> Open(const std::vector<GroupSpec>& model) {
    return ckpt_test::OpenWithModel(ckpt_test::HostOnly(), model);
  }
  std::vector<std::string> Entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_.path())) {
      out.push_back(e.path().filename());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string Ckpt() const { return dir_.File("ckpt"); }

  testutil::ScratchDir dir_;
};

// Load hashes files in 1 MiB reads: a 1.2 MiB file takes two, and damage
// in the second is found.
TEST_F(CheckpointEdgeTest, FileLargerThanTheVerifyBufferLoadsAndIsVerified) {
  const std::vector<GroupSpec> model = {store_test::Layer("big", 200 * 1024)};
  {
    auto source = Open(model);
    ASSERT_NE(source, nullptr);
    Fill(*source, 1);
    ASSERT_TRUE(source->Save(Ckpt()).ok());
  }
  const std::string file = Ckpt() + "/group-000000.bin";
  const uint64_t size = fs::file_size(file);
  ASSERT_GT(size, uint64_t{1} << 20);
  auto target = Open(model);
  ASSERT_NE(target, nullptr);
  Status s = target->Load(Ckpt());
  ASSERT_TRUE(s.ok()) << s.ToString();
  Check(*target, 1);

  ckpt_test::FlipByte(file, size - 1);
  Fill(*target, 5);
  s = target->Load(Ckpt());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos)
      << s.message();
  Check(*target, 5);
}

TEST_F(CheckpointEdgeTest, TrailingSlashesNameTheSameCheckpoint) {
  auto engine = Open({store_test::Layer("a", 1000)});
  ASSERT_NE(engine, nullptr);
  Fill(*engine, 1);
  Status s = engine->Save(Ckpt() + "/");
  ASSERT_TRUE(s.ok()) << s.ToString();
  Fill(*engine, 2);
  s = engine->Save(Ckpt() + "//");
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Entries(), std::vector<std::string>{"ckpt"});
  EXPECT_TRUE(fs::exists(Ckpt() + "/manifest.json"));
  Fill(*engine, 3);
  s = engine->Load(Ckpt() + "/");
  ASSERT_TRUE(s.ok()) << s.ToString();
  Check(*engine, 2);
}

// A temporary whose pid is alive belongs to a save still running (another
// process on the same path is unsupported, but must not lose its files);
// one whose pid is gone is removed.
TEST_F(CheckpointEdgeTest, SaveRemovesOnlyTemporariesOfDeadProcesses) {
  int wstatus = 0;
  const pid_t dead = ckpt_test::RunInChild([] {}, &wstatus);
  ASSERT_GT(dead, 0);
  const std::string live_tmp = Ckpt() + ".tmp-" + std::to_string(getppid());
  const std::string dead_tmp = Ckpt() + ".tmp-" + std::to_string(dead);
  for (const std::string& tmp : {live_tmp, dead_tmp}) {
    fs::create_directory(tmp);
    std::ofstream(tmp + "/group-000000.bin") << "partial";
  }
  auto engine = Open({store_test::Layer("a", 1000)});
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->Save(Ckpt()).ok());
  EXPECT_TRUE(fs::exists(live_tmp + "/group-000000.bin"));
  EXPECT_FALSE(fs::exists(dead_tmp));
}

// Replacing a checkpoint removes the old directory: a file or a nested
// checkpoint that someone put into it must stop the save, not go with it.
TEST_F(CheckpointEdgeTest, SaveDoesNotReplaceACheckpointHoldingOtherFiles) {
  auto engine = Open({store_test::Layer("a", 1000)});
  ASSERT_NE(engine, nullptr);
  Fill(*engine, 1);
  ASSERT_TRUE(engine->Save(Ckpt()).ok());
  const auto refused_naming = [&](const std::string& entry) {
    const Status s = engine->Save(Ckpt());
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find("also holds '" + entry + "'"), std::string::npos)
        << s.message();
  };
  Fill(*engine, 2);
  ASSERT_TRUE(engine->Save(Ckpt() + "/inner").ok());
  Fill(*engine, 3);
  refused_naming("inner");
  fs::rename(Ckpt() + "/inner", dir_.File("inner"));
  std::ofstream(Ckpt() + "/group-1.bin") << "a user's file";  // not 6 digits
  refused_naming("group-1.bin");
  fs::remove(Ckpt() + "/group-1.bin");
  ASSERT_TRUE(engine->Save(Ckpt()).ok());

  Fill(*engine, 4);
  ASSERT_TRUE(engine->Load(dir_.File("inner")).ok());
  Check(*engine, 2);
  ASSERT_TRUE(engine->Load(Ckpt()).ok());
  Check(*engine, 3);
}

// A file-size limit makes a write cross it stop short (then fail with
// EFBIG): Save must finish the write or fail, never publish a file shorter
// than its manifest over the previous checkpoint.
TEST_F(CheckpointEdgeTest, ShortWriteFailsTheSaveAndKeepsThePrevious) {
  GroupSpec one;  // one tensor in one role: a single write of 128 KiB
  one.name = "one";
  one.tensors = {{"w", {64 * 1024}, DType::kBFloat16, RoleBit(Role::kCompute)}};
  const std::vector<GroupSpec> model = {one};
  {
    auto engine = Open(model);
    ASSERT_NE(engine, nullptr);
    Fill(*engine, 1);
    ASSERT_TRUE(engine->Save(Ckpt()).ok());
  }
  int wstatus = 0;
  const pid_t child = ckpt_test::RunInChild(
      [&] {
        signal(SIGXFSZ, SIG_IGN);
        const rlimit limit = {100 * kKiB, 100 * kKiB};  // the file is 128 KiB
        if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(2);
        auto engine = Open(model);
        if (engine == nullptr) _exit(2);
        Fill(*engine, 2);
        _exit(engine->Save(Ckpt()).ok() ? 1 : 0);
      },
      &wstatus);
  ASSERT_GE(child, 0);
  ASSERT_TRUE(WIFEXITED(wstatus)) << wstatus;
  ASSERT_NE(WEXITSTATUS(wstatus), 2) << "the child could not set up";
  EXPECT_EQ(WEXITSTATUS(wstatus), 0) << "Save succeeded after a short write";
  auto engine = Open(model);
  ASSERT_NE(engine, nullptr);
  const Status s = engine->Load(Ckpt());
  ASSERT_TRUE(s.ok()) << s.ToString();
  Check(*engine, 1);
}

// A digit of the step count or of user_state (where the optimizer keeps its
// own step count) matches every data file's hash: only the manifest's own
// checksum sees it. Layout is not content: a re-indented manifest loads.
TEST_F(CheckpointEdgeTest, ManifestChangedAfterSaveIsDataLoss) {
  const std::vector<GroupSpec> model = {store_test::Layer("a", 1000)};
  {
    auto source = Open(model);
    ASSERT_NE(source, nullptr);
    Fill(*source, 1);
    ASSERT_TRUE(source->Save(Ckpt(), {"{\"step\": 41}"}).ok());
  }
  const std::string path = Ckpt() + "/manifest.json";
  std::ifstream in(path);
  const std::string saved{std::istreambuf_iterator<char>(in),
                          std::istreambuf_iterator<char>()};
  const auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = saved;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from << " not in\n" << saved;
    return at == std::string::npos ? text : text.replace(at, from.size(), to);
  };
  struct Case {
    const char* what;
    std::string text;
    std::vector<std::string> said;  // parts of the message
  };
  const std::vector<Case> cases = {
      {"user_state digit",
       replaced("41}", "42}"),
       {"manifest_xxh3", "changed after Save", "backup"}},
      {"steps digit",
       replaced("\"steps\": 0", "\"steps\": 1"),
       {"manifest_xxh3", "changed after Save"}},
      {"no checksum",
       replaced("\"manifest_xxh3\"", "\"manifest_xxh4\""),
       {"malformed at manifest_xxh3"}},
  };
  auto target = Open(model);
  ASSERT_NE(target, nullptr);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::ofstream(path, std::ios::trunc) << c.text;
    Fill(*target, 5);
    const Status s = target->Load(Ckpt());
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    for (const std::string& part : c.said) {
      EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
    }
    Check(*target, 5);
  }

  std::ofstream(path, std::ios::trunc)
      << nlohmann::ordered_json::parse(saved).dump(4);
  LoadResult result;
  const Status s = target->Load(Ckpt(), &result);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(result.user_state, "{\"step\": 41}");
  Check(*target, 1);
}

// json's own conversion would read 2.5 as 2 and -1 as 2^64 - 1; every
// number of the format is a count, a size or an offset.
TEST_F(CheckpointEdgeTest, NumbersThatAreNoCountAreRefusedNamingTheField) {
  const std::vector<GroupSpec> model = {store_test::Layer("a", 1000)};
  {
    auto source = Open(model);
    ASSERT_NE(source, nullptr);
    ASSERT_TRUE(source->Save(Ckpt()).ok());
  }
  const std::string copy = dir_.File("copy");
  struct Case {
    const char* field;
    std::function<void(nlohmann::json&)> edit;
  };
  const std::vector<Case> cases = {
      {"format_version",
       [](auto& m) { m["format_version"] = ckpt::kFormatVersion + 0.5; }},
      {"steps", [](auto& m) { m["steps"] = -1; }},
      {"groups[0].bytes", [](auto& m) { m["groups"][0]["bytes"] = 1e3; }},
      {"groups[0].tensors[0].shape",
       [](auto& m) { m["groups"][0]["tensors"][0]["shape"] = {-1000}; }},
      {"groups[0].tensors[0].roles.master",
       [](auto& m) { m["groups"][0]["tensors"][0]["roles"]["master"] = 0.5; }},
  };
  auto target = Open(model);
  ASSERT_NE(target, nullptr);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    fs::remove_all(copy);
    fs::copy(Ckpt(), copy);
    ckpt_test::EditManifest(copy, c.edit);
    const Status s = target->Load(copy);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_NE(s.message().find(std::string("malformed at ") + c.field),
              std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("whole number"), std::string::npos)
        << s.message();
  }
}

}  // namespace
}  // namespace strata
