// Huge page reservations (tools/nvme_bench/huge_pages.h): the pool raised
// by the pages asked for and lowered by the same amount from whatever it is
// then, under a lock that concurrent runs share,
// given back on the signals a process can catch and left alone for those it
// ignores, every failure named; and the transparent huge pages behind a
// buffer. The kernel's files are replaced by files of the test's own
// (/dev/full for a write that fails, /dev/null for a kernel that keeps
// fewer pages than asked).
#include "tools/nvme_bench/huge_pages.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/testutil/testutil.h"
#include "tests/tools/fake_kernel.h"

namespace strata::bench {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(HugePagesTest, ReservesItsPagesAndGivesBackItsOwnShare) {
  FakeKernel kernel(/*free_pages=*/5, /*reserved=*/1, /*nr=*/7);
  auto a = HugePageReservation::Reserve(19, kernel.files);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ((*a)->added(), 19u);
  EXPECT_EQ((*a)->before(), 7u);
  EXPECT_EQ((*a)->pool().page_bytes, 2u << 20);
  EXPECT_EQ(kernel.nr(), "26\n");
  EXPECT_TRUE(Contains((*a)->restore_command(), "- 19 ))"));
  // Someone else raises the pool meanwhile: giving back takes off 19 from
  // what it is then, not back to 7.
  WriteText(kernel.files.nr_hugepages, "30\n");
  a->reset();
  EXPECT_EQ(kernel.nr(), "11\n");
}

// Free pages may be another run's, counted and not yet mapped: two runs
// that each took them for their own once left one fio without buffers.
// Each adds its own, and in another process at once the pool holds both.
TEST(HugePagesTest, FreePagesAreNotTakenForOurs) {
  FakeKernel kernel(/*free_pages=*/40, /*reserved=*/0, /*nr=*/40);
  auto r = HugePageReservation::Reserve(19, kernel.files);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->added(), 19u);
  EXPECT_EQ(kernel.nr(), "59\n");
  const pid_t child = fork();
  if (child == 0) {
    auto other = HugePageReservation::Reserve(7, kernel.files);
    if (!other.ok()) _exit(2);
    const bool both = ReadText(kernel.files.nr_hugepages) == "66\n";
    other->reset();
    _exit(both ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(kernel.nr(), "59\n");  // the child gave back its 7
  r->reset();
  EXPECT_EQ(kernel.nr(), "40\n");
}

// The pool's read and write happen under the lock: a reservation waits
// while another process holds it.
TEST(HugePagesTest, TheLockKeepsTwoChangesApart) {
  FakeKernel kernel(0, 0, 3);
  const int fd = open(kernel.files.lock.c_str(), O_RDONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX), 0);
  std::atomic<bool> reserved{false};
  std::thread t([&] {
    auto r = HugePageReservation::Reserve(2, kernel.files);
    reserved = r.ok();
  });
  // While the lock is held, the reservation cannot have changed the pool,
  // however long it is given.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(kernel.nr(), "3\n");
  EXPECT_FALSE(reserved.load());
  flock(fd, LOCK_UN);
  close(fd);
  t.join();
  EXPECT_TRUE(reserved.load());
  EXPECT_EQ(kernel.nr(), "3\n");  // reserved, then given back at scope end
}

TEST(HugePagesTest, EveryFailureIsNamedAndLeavesThePoolAsItWas) {
  FakeKernel kernel(0, 0, 3);
  HugePageFiles no_pool = kernel.files;
  no_pool.meminfo = kernel.dir.File("empty");
  WriteText(no_pool.meminfo, "MemTotal: 1000 kB\n");
  HugePageFiles missing = kernel.files;
  missing.nr_hugepages = kernel.dir.File("no/such/nr_hugepages");
  HugePageFiles unwritable = kernel.files;
  unwritable.nr_hugepages = "/dev/full";  // reads zeros, writes fail
  for (const auto& [files, code, why] :
       {std::tuple{no_pool, StatusCode::kUnavailable, "no huge page pool"},
        std::tuple{missing, StatusCode::kPermissionDenied, "cannot read"},
        std::tuple{unwritable, StatusCode::kPermissionDenied,
                   "cannot set vm.nr_hugepages to 19"}}) {
    auto r = HugePageReservation::Reserve(19, files);
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_EQ(r.status().code(), code) << r.status().ToString();
    EXPECT_TRUE(Contains(r.status().message(), why)) << r.status().ToString();
  }
  EXPECT_EQ(kernel.nr(), "3\n");
}

// A vm.nr_hugepages that answers like a kernel short of memory: a FIFO
// whose other end, a thread, plays `script` in order: a value to serve to
// the next read, or "" to record the next write. Serves and writes must
// alternate: the thread holds a served value's end open until its reader
// has closed (poll reports POLLERR), which tells two readers in a row
// apart only if nothing opens the FIFO in between.
class ScriptedKernel {
 public:
  ScriptedKernel(const std::string& path, std::vector<std::string> script) {
    mkfifo(path.c_str(), 0600);
    thread_ = std::thread([this, path, script] {
      for (const std::string& step : script) {
        if (step.empty()) {
          written_.push_back(ReadText(path));
          continue;
        }
        const int fd = open(path.c_str(), O_WRONLY);
        if (write(fd, step.data(), step.size()) < 0) break;
        pollfd closed{fd, 0, 0};
        poll(&closed, 1, 10000);
        close(fd);
      }
    });
  }
  // Waits for the script to end.
  const std::vector<std::string>& written() {
    if (thread_.joinable()) thread_.join();
    return written_;
  }
  ~ScriptedKernel() { written(); }

 private:
  std::vector<std::string> written_;
  std::thread thread_;
};

TEST(HugePagesTest, AKernelThatKeepsFewerPagesIsNamedAndGivenBackTo) {
  FakeKernel kernel(0, 0, 3);
  HugePageFiles stingy = kernel.files;
  stingy.nr_hugepages = kernel.dir.File("fifo");
  // Read 3, write 22, read back 10 (7 kept), write 3 back, read back 3.
  ScriptedKernel fake(stingy.nr_hugepages, {"3\n", "", "10\n", "", "3\n"});
  auto r = HugePageReservation::Reserve(19, stingy);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(
      Contains(r.status().message(), "the kernel gave 7 of the 19 huge pages"))
      << r.status().ToString();
  EXPECT_EQ(fake.written(), (std::vector<std::string>{"22\n", "3\n"}));
}

// When no more can be had but enough are free, the free ones serve.
TEST(HugePagesTest, AStingyKernelWithEnoughFreePagesLendsThem) {
  FakeKernel kernel(/*free_pages=*/30, 0, 30);
  HugePageFiles stingy = kernel.files;
  stingy.nr_hugepages = kernel.dir.File("fifo");
  ScriptedKernel fake(stingy.nr_hugepages, {"30\n", "", "33\n", "", "30\n"});
  auto r = HugePageReservation::Reserve(19, stingy);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->added(), 0u);
  EXPECT_EQ(fake.written(), (std::vector<std::string>{"49\n", "30\n"}));
}

// In a child: reserve, then take `sig`; the child dies of it and the pages
// are back.
void DieOf(int sig, const HugePageFiles& files) {
  auto r = HugePageReservation::Reserve(19, files);
  if (!r.ok()) _exit(3);
  raise(sig);
  _exit(4);  // not reached: the signal takes its course
}

TEST(HugePagesTest, CaughtSignalsGiveThePagesBackAndTakeTheirCourse) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGABRT}) {
    FakeKernel kernel(0, 0, 2);
    EXPECT_EXIT(DieOf(sig, kernel.files), ::testing::KilledBySignal(sig), "");
    EXPECT_EQ(kernel.nr(), "2\n") << strsignal(sig);
  }
}

// In a child that ignores SIGHUP (as under nohup): the signal changes
// nothing, and the pages stay reserved until the reservation ends.
void IgnoreHangUp(const HugePageFiles& files) {
  signal(SIGHUP, SIG_IGN);
  auto r = HugePageReservation::Reserve(19, files);
  if (!r.ok()) _exit(3);
  raise(SIGHUP);
  if (ReadText(files.nr_hugepages) != "21\n") _exit(5);
  r->reset();
  _exit(ReadText(files.nr_hugepages) == "2\n" ? 0 : 6);
}

TEST(HugePagesTest, IgnoredSignalsStayIgnored) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  FakeKernel kernel(0, 0, 2);
  EXPECT_EXIT(IgnoreHangUp(kernel.files), ::testing::ExitedWithCode(0), "");
}

TEST(HugePagesTest, TransparentHugeBytesReadsTheMapping) {
  constexpr size_t kBytes = 8u << 20;
  void* plain = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(plain, MAP_FAILED);
  madvise(plain, kBytes, MADV_NOHUGEPAGE);
  std::memset(plain, 1, kBytes);
  EXPECT_EQ(TransparentHugeBytes(plain, kBytes), 0u);
  void* advised = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(advised, MAP_FAILED);
  madvise(advised, kBytes, MADV_HUGEPAGE);
  std::memset(advised, 1, kBytes);
  const uint64_t huge = TransparentHugeBytes(advised, kBytes);
  EXPECT_LE(huge, kBytes);
  EXPECT_EQ(huge % (2u << 20), 0u);
  // Asked about a quarter of the mapping, it answers for no more.
  EXPECT_LE(TransparentHugeBytes(advised, kBytes / 4), kBytes / 4);
  munmap(plain, kBytes);
  munmap(advised, kBytes);
}

}  // namespace
}  // namespace strata::bench
