// Note [Files strata creates] (src/tier/nvme_store.cc): a link planted under
// the name of a file strata writes (the swap directory's lock file, a swap
// file, a checkpoint file, strata-nvme-bench's file) is refused with an
// error that names it, and the file it points to is left unchanged; swap
// and lock files are private; a swap directory others can write to needs
// the sticky bit.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "src/ckpt/env.h"
#include "src/tier/nvme_store.h"
#include "strata/aio.h"
#include "tests/testutil/testutil.h"

namespace strata::tier {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = 1 << 20;
constexpr char kVictimText[] = "a file strata must never write\n";

class OwnFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto engine = aio::Engine::Open({});
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    std::ofstream(victim_.File("victim")) << kVictimText;
    fs::create_directory(swap_.File("swap"));
    swap_dir_ = swap_.File("swap");
  }

  Result<std::unique_ptr<NvmeStore>> Open() {
    return NvmeStore::Open(engine_.get(),
                           {.dir = swap_dir_, .capacity = kMiB, .files = 2});
  }

  // The victim's bytes are what SetUp wrote.
  void ExpectVictimUnchanged() {
    std::ifstream in(victim_.File("victim"));
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(text.str(), kVictimText) << "strata wrote through a link";
  }

  void PlantLink(const std::string& name) {
    fs::create_symlink(victim_.File("victim"), swap_dir_ + "/" + name);
  }

  testutil::ScratchDir victim_;
  testutil::ScratchDir swap_;
  std::string swap_dir_;
  std::unique_ptr<aio::Engine> engine_;
};

TEST_F(OwnFilesTest, SymbolicLinkAsTheLockFileIsRefused) {
  PlantLink("strata.lock");
  auto store = Open();
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(store.status().message().find("strata.lock' is a symbolic link"),
            std::string::npos)
      << store.status().message();
  ExpectVictimUnchanged();
}

TEST_F(OwnFilesTest, HardLinkAsTheLockFileIsRefused) {
  fs::create_hard_link(victim_.File("victim"), swap_dir_ + "/strata.lock");
  auto store = Open();
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(store.status().message().find("hard link"), std::string::npos)
      << store.status().message();
  ExpectVictimUnchanged();
}

// A link planted as a swap file before the start, or in the window between
// the sweep of stale files and their creation: neither followed nor
// removed, and the error names it.
TEST_F(OwnFilesTest, SymbolicLinkAsASwapFileIsRefused) {
  for (const char* name : {"strata-swap-0.bin", "strata-swap-1.bin"}) {
    PlantLink(name);
    auto store = Open();
    ASSERT_FALSE(store.ok()) << name;
    EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(store.status().message().find(name), std::string::npos)
        << store.status().message();
    EXPECT_NE(store.status().message().find("exists already"),
              std::string::npos)
        << store.status().message();
    ExpectVictimUnchanged();
    EXPECT_TRUE(fs::is_symlink(swap_dir_ + "/" + name));
    fs::remove(swap_dir_ + "/" + name);
  }
  ASSERT_TRUE(Open().ok()) << "the directory works once the links are gone";
}

TEST_F(OwnFilesTest, SwapAndLockFilesArePrivate) {
  const mode_t old = umask(0);  // 0600 by strata, not by the umask
  auto store = Open();
  umask(old);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  for (const char* name :
       {"strata.lock", "strata-swap-0.bin", "strata-swap-1.bin"}) {
    struct stat st = {};
    ASSERT_EQ(stat((swap_dir_ + "/" + name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << name;
  }
}

TEST_F(OwnFilesTest, SharedSwapDirectoryNeedsTheStickyBit) {
  ASSERT_EQ(chmod(swap_dir_.c_str(), 0777), 0);
  auto open = Open();
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(open.status().message().find("chmod +t"), std::string::npos)
      << open.status().message();
  ASSERT_EQ(chmod(swap_dir_.c_str(), 01777), 0);  // like /tmp
  EXPECT_TRUE(Open().ok());
}

// A user's private group (umask 002 gives 0775) is no other user.
TEST_F(OwnFilesTest, GroupWritableDirectoryOfTheUsersOwnGroupIsFine) {
  ASSERT_EQ(chown(swap_dir_.c_str(), geteuid(), getegid()), 0);
  ASSERT_EQ(chmod(swap_dir_.c_str(), 0775), 0);
  auto store = Open();
  EXPECT_TRUE(store.ok()) << store.status().ToString();
}

// strata-nvme-bench's file and every other aio file.
TEST_F(OwnFilesTest, AioOpensNoLink) {
  PlantLink("bench.dat");
  auto file = engine_->OpenFile(swap_dir_ + "/bench.dat", {.size = kMiB});
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(file.status().message().find("symbolic link"), std::string::npos)
      << file.status().message();
  ExpectVictimUnchanged();
}

// The checkpoint code's files, through its Env.
TEST_F(OwnFilesTest, CheckpointFilesAreNeitherCreatedNorReadThroughALink) {
  PlantLink("group-0.bin");
  ckpt::Env& env = ckpt::Env::Default();
  auto created = env.NewFile(swap_dir_ + "/group-0.bin");
  EXPECT_FALSE(created.ok());
  auto opened = env.OpenFile(swap_dir_ + "/group-0.bin");
  EXPECT_FALSE(opened.ok());
  EXPECT_NE(opened.status().message().find("group-0.bin"), std::string::npos)
      << opened.status().message();
  ExpectVictimUnchanged();
}

}  // namespace
}  // namespace strata::tier
