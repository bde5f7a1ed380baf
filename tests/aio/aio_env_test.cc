// strata_aio against its environment: missing and read-only directories,
// full file systems, file systems without O_DIRECT, io_uring blocked by
// seccomp, and the STRATA_AIO_BACKEND override.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "strata/aio.h"
#include "tests/testutil/testutil.h"

namespace strata::aio {
namespace {

using testutil::Mount;
using testutil::ScratchDir;

std::unique_ptr<Engine> OpenEngine(Backend backend = Backend::kAuto) {
  IoOptions o;
  o.backend = backend;
  auto e = Engine::Open(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

PinnedBuffer Buffer(size_t bytes) {
  auto b = PinnedBuffer::Allocate(bytes, PinOptions{false});
  EXPECT_TRUE(b.ok());
  return std::move(*b);
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(AioEnvTest, MissingDirectoryNamesTheFix) {
  auto e = OpenEngine();
  ASSERT_NE(e, nullptr);
  ScratchDir dir;
  const std::string path = dir.path() + "/no/such/dir/swap.bin";
  auto f = e->OpenFile(path, FileOptions{1 << 20});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(f.status().message(), "does not exist"));
  EXPECT_TRUE(Contains(f.status().message(), "mkdir -p"));
}

// A file that is not there, in a directory that is, is not blamed on the
// directory.
TEST(AioEnvTest, MissingFileInAnExistingDirectoryIsNamedAsSuch) {
  auto e = OpenEngine();
  ASSERT_NE(e, nullptr);
  ScratchDir dir;
  FileOptions no_create;
  no_create.create = false;
  auto f = e->OpenFile(dir.path() + "/gone.bin", no_create);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(f.status().message(), "no such file"))
      << f.status().message();
  EXPECT_FALSE(Contains(f.status().message(), "mkdir -p"));
}

TEST(AioEnvTest, PathThatIsADirectoryIsRejected) {
  auto e = OpenEngine();
  ASSERT_NE(e, nullptr);
  ScratchDir dir;
  auto f = e->OpenFile(dir.path(), FileOptions{});
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(Contains(f.status().message(), "directory"))
      << f.status().message();
}

TEST(AioEnvTest, ReadOnlyFileSystemIsReported) {
  Mount ro("tmpfs", "size=1m", /*read_only=*/true);
  if (!ro.ok()) GTEST_SKIP() << ro.error();
  auto e = OpenEngine();
  ASSERT_NE(e, nullptr);
  auto f = e->OpenFile(ro.path() + "/swap.bin", FileOptions{1 << 20});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(Contains(f.status().message(), "read-only"))
      << f.status().message();
}

TEST(AioEnvTest, PreallocationBeyondFreeSpaceIsNoSpaceAndLeavesNoFile) {
  Mount small("tmpfs", "size=1m");
  if (!small.ok()) GTEST_SKIP() << small.error();
  auto e = OpenEngine();
  ASSERT_NE(e, nullptr);
  const std::string path = small.path() + "/swap.bin";
  auto f = e->OpenFile(path, FileOptions{8 << 20});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNoSpace);
  EXPECT_TRUE(Contains(f.status().message(), "8.0 MiB"))
      << f.status().message();
  EXPECT_TRUE(Contains(f.status().message(), "free"));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(AioEnvTest, WritesIntoAFullFileSystemFailWithEnospc) {
  Mount small("tmpfs", "size=1m");
  if (!small.ok()) GTEST_SKIP() << small.error();
  for (Backend b : {Backend::kIoUring, Backend::kThreads}) {
    IoOptions o;
    o.backend = b;
    auto e = Engine::Open(o);
    if (!e.ok()) continue;  // io_uring unavailable: covered by threads
    auto f = (*e)->OpenFile(small.path() + "/grow.bin", FileOptions{});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    PinnedBuffer buf = Buffer(4 << 20);
    const Status st = (*e)->Write(*f, buf.data(), buf.size(), 0)->Wait();
    EXPECT_EQ(st.code(), StatusCode::kNoSpace) << st.ToString();
    EXPECT_TRUE(Contains(st.message(), "ENOSPC")) << st.message();
    EXPECT_TRUE(Contains(st.message(), "free space")) << st.message();
    ASSERT_TRUE((*e)->CloseFile(*f).ok());
    std::filesystem::remove(small.path() + "/grow.bin");
  }
}

// ramfs never supports O_DIRECT; the engine must fall back to buffered I/O,
// say so once, and still move the bytes.
TEST(AioEnvTest, FallsBackToBufferedWhereODirectIsRefused) {
  Mount ram("ramfs", "");
  if (!ram.ok()) GTEST_SKIP() << ram.error();
  auto e = OpenEngine();
  ASSERT_NE(e, nullptr);
  Result<File*> f = Status(StatusCode::kInternal, "not opened");
  const std::string warning = testutil::CaptureStderr(
      [&] { f = e->OpenFile(ram.path() + "/swap.bin", FileOptions{1 << 20}); });
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_FALSE((*f)->direct());
  EXPECT_EQ((*f)->mem_align(), 1u);
  EXPECT_TRUE(Contains(warning, "does not support O_DIRECT")) << warning;
  EXPECT_TRUE(Contains(warning, "buffered"));
  // Buffered files accept any alignment.
  PinnedBuffer out = Buffer(1 << 20);
  PinnedBuffer in = Buffer(1 << 20);
  testutil::FillRandom(out.data(), out.size(), 9);
  char* src = static_cast<char*>(out.data()) + 3;
  ASSERT_TRUE(e->Write(*f, src, 100001, 7)->Wait().ok());
  ASSERT_TRUE(e->Read(*f, in.data(), 100001, 7)->Wait().ok());
  EXPECT_EQ(std::memcmp(src, in.data(), 100001), 0);
  EXPECT_TRUE((*f)->DropCache().ok());
}

// tmpfs gained O_DIRECT in Linux 6.6. Either way the engine must work, and
// report what it got.
TEST(AioEnvTest, TmpfsWorksDirectOrBuffered) {
  Mount tmp("tmpfs", "size=8m");
  if (!tmp.ok()) GTEST_SKIP() << tmp.error();
  auto e = OpenEngine();
  ASSERT_NE(e, nullptr);
  auto f = e->OpenFile(tmp.path() + "/swap.bin", FileOptions{1 << 20});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::printf("tmpfs here is %s\n", (*f)->direct() ? "O_DIRECT" : "buffered");
  PinnedBuffer out = Buffer(1 << 20);
  PinnedBuffer in = Buffer(1 << 20);
  testutil::FillRandom(out.data(), out.size(), 10);
  ASSERT_TRUE(e->Write(*f, out.data(), out.size(), 0)->Wait().ok());
  ASSERT_TRUE(e->Read(*f, in.data(), in.size(), 0)->Wait().ok());
  EXPECT_EQ(std::memcmp(out.data(), in.data(), out.size()), 0);
}

// The open flags (fdinfo's "flags:", octal) of this process's descriptor
// of `path`; -1 when none is open.
long OpenFlagsOf(const std::string& path) {
  const std::string want = std::filesystem::canonical(path).string();
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (std::filesystem::read_symlink(fd.path(), ec).string() != want) continue;
    std::ifstream info("/proc/self/fdinfo/" + fd.path().filename().string());
    std::string key;
    while (info >> key) {
      if (key == "flags:") {
        std::string octal;
        info >> octal;
        return std::stol(octal, nullptr, 8);
      }
    }
  }
  return -1;
}

TEST(AioEnvTest, DsyncOpensWithODsync) {
  ScratchDir dir;
  for (const bool dsync : {false, true}) {
    auto e = OpenEngine();
    ASSERT_NE(e, nullptr);
    FileOptions fo;
    fo.size = 1 << 20;
    fo.dsync = dsync;
    auto f = e->OpenFile(dir.File("dsync.bin"), fo);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    const long flags = OpenFlagsOf(dir.File("dsync.bin"));
    ASSERT_GE(flags, 0) << "no descriptor of the file in /proc/self/fd";
    EXPECT_EQ((flags & O_DSYNC) != 0, dsync) << std::oct << flags;
  }
}

TEST(AioEnvTest, InvalidOptionsAreRejected) {
  for (auto mutate : {+[](IoOptions& o) { o.rings = 0; },
                      +[](IoOptions& o) { o.queue_depth = 0; },
                      +[](IoOptions& o) { o.queue_depth = 5000; },
                      +[](IoOptions& o) { o.block_size = 1000; },
                      +[](IoOptions& o) { o.submit_batch = -1; },
                      +[](IoOptions& o) { o.submit_batch = 4097; }}) {
    IoOptions o;
    mutate(o);
    auto e = Engine::Open(o);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(AioEnvTest, EnvironmentForcesTheThreadBackend) {
  setenv("STRATA_AIO_BACKEND", "threads", 1);
  auto e = Engine::Open(IoOptions{Backend::kIoUring});
  unsetenv("STRATA_AIO_BACKEND");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->info().backend, Backend::kThreads);
}

TEST(AioEnvTest, BadEnvironmentValueIsAnError) {
  setenv("STRATA_AIO_BACKEND", "spdk", 1);
  auto e = Engine::Open(IoOptions{});
  unsetenv("STRATA_AIO_BACKEND");
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(Contains(e.status().message(), "STRATA_AIO_BACKEND"));
}

// Makes the system call `nr` (io_uring_setup by default) fail with EPERM,
// as a container's seccomp profile does. Irreversible: call only in a
// forked child.
void BlockIoUring(int nr = __NR_io_uring_setup) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog = {sizeof(filter) / sizeof(filter[0]), filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
    std::fprintf(stderr, "cannot install seccomp filter\n");
    std::_Exit(3);
  }
}

TEST(AioEnvDeathTest, BlockedIoUringFallsBackToThreadsAndSaysSo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        BlockIoUring();
        unsetenv("STRATA_AIO_BACKEND");
        bool fell_back = false;
        const std::string said = testutil::CaptureStderr([&] {
          for (int i = 0; i < 2; ++i) {
            auto e = Engine::Open(IoOptions{});
            fell_back = e.ok() && (*e)->info().backend == Backend::kThreads;
          }
        });
        std::fprintf(stderr, "%s", said.c_str());
        // Said once per process, not once per engine.
        const size_t first = said.find("io_uring unavailable");
        const bool once =
            first != std::string::npos &&
            said.find("io_uring unavailable", first + 1) == std::string::npos;
        _exit(fell_back && once ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "io_uring unavailable \\(io_uring_queue_init failed with EPERM");
}

TEST(AioEnvDeathTest, BlockedIoUringEnterFallsBackToThreads) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        BlockIoUring(__NR_io_uring_enter);
        unsetenv("STRATA_AIO_BACKEND");
        auto e = Engine::Open(IoOptions{});
        _exit(e.ok() && (*e)->info().backend == Backend::kThreads ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "io_uring_enter failed with EPERM");
}

TEST(AioEnvDeathTest, BlockedIoUringIsAnErrorWhenRequested) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        BlockIoUring();
        unsetenv("STRATA_AIO_BACKEND");
        auto e = Engine::Open(IoOptions{Backend::kIoUring});
        if (e.ok() || e.status().code() != StatusCode::kUnavailable) _exit(1);
        std::fprintf(stderr, "%s\n", e.status().message().c_str());
        _exit(0);
      },
      ::testing::ExitedWithCode(0), "STRATA_AIO_BACKEND=threads");
}

// EFBIG is a file over the file system's size limit, not a full disk
// (issue #31): the advice says so.
TEST(AioEnvTest, AFileTooLargeIsNotCalledAFullDisk) {
  const Status big = ErrnoStatus(EFBIG, "write 'swap-0.bin'");
  EXPECT_EQ(big.code(), StatusCode::kNoSpace);
  EXPECT_TRUE(Contains(big.message(), "larger than")) << big.message();
  EXPECT_FALSE(Contains(big.message(), "full")) << big.message();
  const Status full = ErrnoStatus(ENOSPC, "write 'swap-0.bin'");
  EXPECT_TRUE(Contains(full.message(), "full")) << full.message();
}

}  // namespace
}  // namespace strata::aio
