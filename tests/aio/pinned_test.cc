// PinnedBuffer: allocation, alignment, locking and the memlock-limit error.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "strata/aio.h"
#include "tests/testutil/testutil.h"

namespace strata::aio {
namespace {

TEST(PinnedBufferTest, AllocatesZeroedAlignedLockedMemory) {
  auto b = PinnedBuffer::Allocate(5000, PinOptions{true, -1, false});
  if (!b.ok() && b.status().code() == StatusCode::kResourceExhausted) {
    GTEST_SKIP() << "cannot lock memory here: " << b.status().message();
  }
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->size(), 8192u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
  EXPECT_TRUE(b->locked());
  const auto* p = static_cast<const unsigned char*>(b->data());
  for (size_t i = 0; i < b->size(); ++i) ASSERT_EQ(p[i], 0);
}

TEST(PinnedBufferTest, HugePageRequestsAreTwoMebibyteAligned) {
  auto b = PinnedBuffer::Allocate(3 << 20, PinOptions{false, -1, true});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % (2 << 20), 0u);
  EXPECT_FALSE(b->locked());
  std::memset(b->data(), 1, b->size());
}

TEST(PinnedBufferTest, MovesTransferOwnership) {
  auto b = PinnedBuffer::Allocate(4096, PinOptions{false});
  ASSERT_TRUE(b.ok());
  void* data = b->data();
  PinnedBuffer moved = std::move(*b);
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(b->data(), nullptr);
  PinnedBuffer assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.data(), data);
}

TEST(PinnedBufferTest, RejectsZeroBytesAndMissingNumaNodes) {
  EXPECT_FALSE(PinnedBuffer::Allocate(0).ok());
  auto b = PinnedBuffer::Allocate(4096, PinOptions{false, 4096});
  // Without libnuma support there is nothing to check the node against.
  if (b.ok()) {
    EXPECT_EQ(b->numa_node(), -1);
  } else {
    EXPECT_TRUE(b.status().message().find("NUMA node 4096") !=
                std::string::npos);
  }
}

// Drops CAP_IPC_LOCK from this (forked) process and sets a tiny memlock
// limit, as for an unprivileged user with the default `ulimit -l`.
void LimitMemlock(rlim_t bytes) {
  __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) _exit(3);
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  if (syscall(SYS_capset, &hdr, data) != 0) _exit(3);
  const rlimit lim = {bytes, bytes};
  if (setrlimit(RLIMIT_MEMLOCK, &lim) != 0) _exit(3);
}

TEST(PinnedBufferDeathTest, MemlockLimitErrorSaysHowToFixIt) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer runtime replaces mlock() with a no-op";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        LimitMemlock(64 << 10);
        auto b = PinnedBuffer::Allocate(16 << 20);
        if (b.ok()) _exit(1);
        if (b.status().code() != StatusCode::kResourceExhausted) _exit(2);
        std::fprintf(stderr, "%s\n", b.status().message().c_str());
        // Without pinning the same allocation works.
        if (!PinnedBuffer::Allocate(16 << 20, PinOptions{false}).ok()) {
          _exit(4);
        }
        _exit(0);
      },
      ::testing::ExitedWithCode(0),
      "RLIMIT_MEMLOCK.*64.0 KiB.*ulimit -l.*CAP_IPC_LOCK.*--no-pin");
}

TEST(PinnedBufferDeathTest, EngineServesBuffersItCannotRegister) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  testutil::ScratchDir dir;
  const std::string path = dir.File("f");
  EXPECT_EXIT(
      {
        LimitMemlock(64 << 10);
        auto e = Engine::Open(IoOptions{});
        if (!e.ok()) _exit(1);
        auto f = (*e)->OpenFile(path, FileOptions{4 << 20});
        if (!f.ok()) _exit(2);
        auto b = PinnedBuffer::Allocate(4 << 20, PinOptions{false});
        testutil::FillRandom(b->data(), b->size(), 1);
        if (!(*e)->RegisterBuffer(b->data(), b->size()).ok()) _exit(3);
        if (!(*e)->Write(*f, b->data(), b->size(), 0)->Wait().ok()) _exit(4);
        auto in = PinnedBuffer::Allocate(4 << 20, PinOptions{false});
        if (!(*e)->Read(*f, in->data(), in->size(), 0)->Wait().ok()) _exit(5);
        _exit(std::memcmp(b->data(), in->data(), b->size()) == 0 ? 0 : 6);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace strata::aio
