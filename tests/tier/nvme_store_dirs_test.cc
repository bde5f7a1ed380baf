// The NVMe store over several swap directories (Note [Several swap
// directories] in src/tier/nvme_store.cc): files spread over them, data
// round trips on each, and every directory checked, locked and cleaned as
// a lone one is.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "src/tier/nvme_store.h"
#include "tests/testutil/testutil.h"

namespace strata::tier {
namespace {

namespace fs = std::filesystem;
using testutil::ScratchDir;

constexpr uint64_t kMiB = 1 << 20;

class NvmeStoreDirsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = aio::Engine::Open(aio::IoOptions{});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e);
  }
  Result<std::unique_ptr<NvmeStore>> Open(const std::string& dirs, int files) {
    return NvmeStore::Open(engine_.get(),
                           {.dir = dirs, .capacity = 4 * kMiB, .files = files});
  }
  static bool Locked(const ScratchDir& d) {
    return fs::exists(d.File("strata.lock"));
  }
  static int SwapFiles(const ScratchDir& d) {
    int n = 0;
    for (const auto& e : fs::directory_iterator(d.path())) {
      n += e.path().filename().string().rfind("strata-swap-", 0) == 0;
    }
    return n;
  }

  std::unique_ptr<aio::Engine> engine_;
  ScratchDir a_, b_, c_;
};

TEST_F(NvmeStoreDirsTest, FilesAlternateOverTheDirectoriesAndRoundTrip) {
  auto store = Open(a_.path() + ":" + b_.path(), 4);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  NvmeStore& s = **store;
  for (int i = 0; i < 4; ++i) {
    const ScratchDir& home = i % 2 == 0 ? a_ : b_;
    EXPECT_EQ(fs::path(s.FilePath(i)).parent_path(), fs::path(home.path()))
        << "file " << i;
  }
  EXPECT_EQ(SwapFiles(a_), 2);
  EXPECT_EQ(SwapFiles(b_), 2);
  EXPECT_TRUE(Locked(a_) && Locked(b_));
  // Allocations rotate over the files, so over both directories.
  auto out = aio::PinnedBuffer::Allocate(kMiB, {.lock = false});
  auto in = aio::PinnedBuffer::Allocate(kMiB, {.lock = false});
  ASSERT_TRUE(out.ok() && in.ok());
  for (int i = 0; i < 4; ++i) {
    auto e = s.Allocate(kMiB / 2);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->file, i);
    testutil::FillRandom(out->data(), e->bytes, 7 + i);
    ASSERT_TRUE(s.Write(*e, out->data()).ok());
    ASSERT_TRUE(s.Read(*e, in->data()).ok());
    EXPECT_EQ(std::memcmp(in->data(), out->data(), e->bytes), 0);
  }
  EXPECT_EQ(s.stats().bytes_written, 2 * kMiB);
  store->reset();
  EXPECT_EQ(SwapFiles(a_) + SwapFiles(b_), 0);
  EXPECT_FALSE(Locked(a_) || Locked(b_));
}

// Every directory holds as many files: 4 over 3 directories become 6.
TEST_F(NvmeStoreDirsTest, TheFileCountRoundsUpToAMultipleOfTheDirectories) {
  auto store = Open(a_.path() + ":" + b_.path() + ":" + c_.path(), 4);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(fs::path((*store)->FilePath(5)).parent_path(), fs::path(c_.path()));
  EXPECT_EQ(SwapFiles(a_) + SwapFiles(b_) + SwapFiles(c_), 6);
}

// A directory another store holds, or one that is missing, fails the open
// and leaves every other directory as it was: no lock, no swap file.
TEST_F(NvmeStoreDirsTest, OneBadDirectoryLeavesTheOthersUntouched) {
  auto first = Open(b_.path(), 1);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto held = Open(a_.path() + ":" + b_.path() + ":" + c_.path(), 3);
  ASSERT_FALSE(held.ok());
  EXPECT_EQ(held.status().code(), StatusCode::kFailedPrecondition)
      << held.status().ToString();
  EXPECT_FALSE(Locked(a_) || Locked(c_));
  EXPECT_EQ(SwapFiles(a_) + SwapFiles(c_), 0);

  auto missing = Open(a_.path() + ":" + a_.File("no-such-dir"), 2);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound)
      << missing.status().ToString();
  EXPECT_FALSE(Locked(a_));
}

TEST_F(NvmeStoreDirsTest, ADirectoryNamedTwiceIsRefused) {
  auto twice = Open(a_.path() + ":" + a_.path() + "/.", 2);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("named twice"), std::string::npos)
      << twice.status().message();
  EXPECT_FALSE(Open("::", 2).ok());
}

}  // namespace
}  // namespace strata::tier
