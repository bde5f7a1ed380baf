// strata_aio on a raw block device (FileOptions::block_device): refused
// without the opt-in, as the optimizer store needs; with it opened as it is,
// sized by the device and never grown. Runs on a loop device over a
// scratch file, and skips visibly where none can be set up.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/aio.h"
#include "tests/testutil/testutil.h"

namespace strata::aio {
namespace {

constexpr uint64_t kDeviceBytes = 8 << 20;
constexpr uint64_t kSeed = 11;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class AioDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    loop_.emplace(kDeviceBytes, kSeed);
    if (!loop_->ok()) GTEST_SKIP() << loop_->error();
    auto e = Engine::Open(IoOptions{});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e);
    PinOptions po;
    po.lock = false;
    auto b = PinnedBuffer::Allocate(1 << 20, po);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    buf_ = std::move(*b);
  }
  // Detaches the loop device whatever the test did.
  void TearDown() override {
    engine_.reset();
    loop_.reset();
  }

  Result<File*> OpenDevice(bool read_only, uint64_t size = 0) {
    FileOptions fo;
    fo.block_device = true;
    fo.read_only = read_only;
    fo.size = size;
    return engine_->OpenFile(loop_->path(), fo);
  }

  std::optional<testutil::LoopDevice> loop_;
  std::unique_ptr<Engine> engine_;
  PinnedBuffer buf_;
};

// The optimizer store opens with the default options: a device node
// planted where it keeps its files must not receive its writes.
TEST_F(AioDeviceTest, WithoutTheOptInADeviceIsRefused) {
  for (const bool read_only : {false, true}) {
    FileOptions fo;
    fo.read_only = read_only;
    auto f = engine_->OpenFile(loop_->path(), fo);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(f.status().message(),
              "'" + loop_->path() + "' is not a regular file");
  }
}

TEST_F(AioDeviceTest, OpensTheDeviceAsItIsAndReadsIt) {
  auto f = OpenDevice(/*read_only=*/true);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->size(), kDeviceBytes);
  if ((*f)->direct()) {
    EXPECT_GE((*f)->offset_align(), 512u);
    EXPECT_LE((*f)->offset_align(), 4096u);
  }
  auto h = engine_->Read(*f, buf_.data(), 1 << 20, kDeviceBytes - (1 << 20));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE(h->Wait().ok());
  const std::string backing = ReadFile(loop_->backing());
  EXPECT_EQ(std::memcmp(buf_.data(), backing.data() + kDeviceBytes - (1 << 20),
                        1 << 20),
            0);
}

TEST_F(AioDeviceTest, NeverCreatesTruncatesNorGrowsIt) {
  const std::string before = ReadFile(loop_->backing());
  auto f = OpenDevice(/*read_only=*/false, kDeviceBytes / 2);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->size(), kDeviceBytes);
  ASSERT_TRUE(engine_->CloseFile(*f).ok());
  EXPECT_EQ(ReadFile(loop_->backing()), before);

  auto big = OpenDevice(/*read_only=*/true, 2 * kDeviceBytes);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("holds 8.0 MiB (8388608 bytes), less "
                                        "than the 16.0 MiB (16777216 bytes)"),
            std::string::npos)
      << big.status().message();
}

TEST_F(AioDeviceTest, WritesLandAndStopAtItsEnd) {
  auto f = OpenDevice(/*read_only=*/false);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::memset(buf_.data(), 0x5a, 1 << 20);
  auto h = engine_->Write(*f, buf_.data(), 1 << 20, 0);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE(h->Wait().ok());
  ASSERT_TRUE((*f)->Sync().ok());
  ASSERT_TRUE(engine_->CloseFile(*f).ok());
  const std::string backing = ReadFile(loop_->backing());
  EXPECT_EQ(backing.substr(0, 1 << 20), std::string(1 << 20, '\x5a'));

  f = OpenDevice(/*read_only=*/false);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto past = engine_->Write(*f, buf_.data(), 1 << 20, kDeviceBytes);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("write of [8388608, 9437184) past "
                                         "the end"),
            std::string::npos)
      << past.status().message();
  EXPECT_EQ((*f)->size(), kDeviceBytes);
}

TEST_F(AioDeviceTest, ALinkToADeviceIsRefusedEvenWithTheOptIn) {
  testutil::ScratchDir dir;
  const std::string link = dir.File("disk");
  std::filesystem::create_symlink(loop_->path(), link);
  FileOptions fo;
  fo.block_device = true;
  fo.read_only = true;
  auto f = engine_->OpenFile(link, fo);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("symbolic link"), std::string::npos)
      << f.status().message();
}

}  // namespace
}  // namespace strata::aio
