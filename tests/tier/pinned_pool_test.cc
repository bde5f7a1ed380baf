// PinnedPool: size classes, accounting, budget errors, memory that really
// works (writes, aio transfers), the memlock-limit paths and concurrency.
#include "src/tier/pinned_pool.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "src/tier/device.h"
#include "strata/aio.h"
#include "tests/testutil/testutil.h"

namespace strata::tier {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// A small unlocked pool on 4 KiB pages: the cheapest pool to make.
std::unique_ptr<PinnedPool> MakePool(uint64_t budget,
                                     aio::Engine* engine = nullptr) {
  PinnedPoolOptions options;
  options.budget = budget;
  options.lock = LockMode::kOff;
  options.huge_pages = false;
  auto pool = PinnedPool::Create(options, engine);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return pool.ok() ? std::move(*pool) : nullptr;
}

// A device's host allocator as the pool sees it: counts its calls and can
// refuse, as cudaHostAlloc does when pinned memory runs out.
class FakeHostAllocator : public HostAllocator {
 public:
  const char* name() const override { return "fake-device-host"; }
  void* Allocate(uint64_t bytes) override {
    ++allocations;
    if (refuse) return nullptr;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    live[p] = bytes;
    return p;
  }
  void Free(void* ptr) override {
    ASSERT_EQ(live.count(ptr), 1u) << "freed memory it did not hand out";
    munmap(ptr, live[ptr]);
    live.erase(ptr);
  }

  bool refuse = false;
  int allocations = 0;
  std::map<void*, uint64_t> live;
};

TEST(PinnedPoolSizeClassTest, ClassesAreMonotonePagesWithBoundedWaste) {
  std::vector<uint64_t> sizes;
  for (uint64_t b = 0; b <= 256 * kKiB; ++b) sizes.push_back(b);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) sizes.push_back(rng() >> (24 + rng() % 38));
  for (int shift = 12; shift < 62; ++shift) {
    for (int64_t d : {-1, 0, 1}) sizes.push_back((uint64_t{1} << shift) + d);
  }
  std::sort(sizes.begin(), sizes.end());
  uint64_t previous = 0;
  for (uint64_t bytes : sizes) {
    const uint64_t cls = PinnedPool::SizeClass(bytes);
    ASSERT_GE(cls, bytes);
    ASSERT_GE(cls, 4096u);
    ASSERT_EQ(cls % 4096, 0u) << bytes;
    if (bytes > 0) {
      ASSERT_LT(cls - bytes, std::max<uint64_t>(bytes / 4, 4096)) << bytes;
    }
    ASSERT_GE(cls, previous) << bytes;                    // monotone
    ASSERT_EQ(PinnedPool::SizeClass(cls), cls) << bytes;  // a fixed point
    previous = cls;
  }
}

TEST(PinnedPoolSizeClassTest, FourClassesPerPowerOfTwo) {
  EXPECT_EQ(PinnedPool::SizeClass(0), 4096u);
  EXPECT_EQ(PinnedPool::SizeClass(1), 4096u);
  EXPECT_EQ(PinnedPool::SizeClass(4097), 8192u);
  EXPECT_EQ(PinnedPool::SizeClass(16 * kKiB + 1), 20 * kKiB);
  EXPECT_EQ(PinnedPool::SizeClass(kMiB + 1), kMiB + 256 * kKiB);
  EXPECT_EQ(PinnedPool::SizeClass(3 * kMiB), 3 * kMiB);
  for (uint64_t power : {64 * kKiB, kMiB, 1024 * kMiB}) {
    std::set<uint64_t> classes;
    for (uint64_t b = power + 1; b <= 2 * power; b += 4096) {
      classes.insert(PinnedPool::SizeClass(b));
    }
    EXPECT_EQ(classes, (std::set<uint64_t>{power * 5 / 4, power * 3 / 2,
                                           power * 7 / 4, power * 2}));
  }
}

TEST(PinnedPoolTest, StatsCountSizeClassBytesExactly) {
  auto pool = MakePool(kMiB);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->free_bytes(), kMiB);
  void* a = *pool->Allocate(5000);    // class 8 KiB
  void* b = *pool->Allocate(100000);  // class 112 KiB
  void* c = *pool->Allocate(0);       // class 4 KiB
  PinnedPoolStats s = pool->stats();
  EXPECT_EQ(s.current, (8 + 112 + 4) * kKiB);
  EXPECT_EQ(s.peak, s.current);
  EXPECT_EQ(s.allocated, s.current);
  EXPECT_EQ(s.freed, 0u);
  EXPECT_EQ(s.allocations, 3u);
  EXPECT_EQ(s.frees, 0u);
  EXPECT_EQ(pool->free_bytes(), kMiB - s.current);
  pool->Free(b);
  void* d = *pool->Allocate(4096);
  pool->Free(a);
  s = pool->stats();
  EXPECT_EQ(s.current, 8 * kKiB);
  EXPECT_EQ(s.peak, 124 * kKiB);
  EXPECT_EQ(s.allocated, 128 * kKiB);
  EXPECT_EQ(s.freed, 120 * kKiB);
  EXPECT_EQ(s.allocations, 4u);
  EXPECT_EQ(s.frees, 2u);
  pool->Free(c);
  pool->Free(d);
  EXPECT_EQ(pool->stats().current, 0u);
  EXPECT_EQ(pool->free_bytes(), kMiB);
}

TEST(PinnedPoolTest, ExhaustionNamesTheTierTheBytesAndTheFix) {
  auto pool = MakePool(64 * kKiB);
  ASSERT_NE(pool, nullptr);
  void* a = *pool->Allocate(16 * kKiB);
  void* b = *pool->Allocate(16 * kKiB);
  ASSERT_TRUE(pool->Allocate(32 * kKiB).ok());
  pool->Free(a);  // 16 KiB free, but only as one 16 KiB range
  Result<void*> r = pool->Allocate(20000);  // class 20 KiB
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  const std::string& msg = r.status().message();
  for (const char* part :
       {"pinned host tier", "cannot allocate 19.5 KiB", "size class 20.0 KiB",
        "16.0 KiB free of budget 64.0 KiB", "largest free range 16.0 KiB",
        "--host-budget"}) {
    EXPECT_NE(msg.find(part), std::string::npos) << part << " in: " << msg;
  }
  pool->Free(b);  // 32 KiB free in one range: now it fits
  EXPECT_TRUE(pool->Allocate(20000).ok());

  r = pool->Allocate(kMiB);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1.0 MiB (more than the whole budget)"),
            std::string::npos)
      << r.status().message();
  r = pool->Allocate(UINT64_MAX);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
}

TEST(PinnedPoolTest, FreedMemoryIsReused) {
  auto pool = MakePool(16 * kKiB);
  ASSERT_NE(pool, nullptr);
  std::vector<void*> all;
  for (int i = 0; i < 4; ++i) all.push_back(*pool->Allocate(4096));
  EXPECT_FALSE(pool->Allocate(1).ok());
  pool->Free(all[2]);
  Result<void*> again = pool->Allocate(100);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, all[2]);
  for (int i = 0; i < 1000; ++i) {  // no leak across many cycles
    pool->Free(*again);
    again = pool->Allocate(4096);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
  }
}

TEST(PinnedPoolTest, AllocationsAreWritableAlignedAndDisjoint) {
  auto pool = MakePool(4 * kMiB);
  ASSERT_NE(pool, nullptr);
  std::mt19937 rng(11);
  struct Block {
    void* p;
    uint64_t bytes;
  };
  std::vector<Block> blocks;
  for (;;) {
    const uint64_t bytes = 1 + rng() % (96 * kKiB);
    Result<void*> p = pool->Allocate(bytes);
    if (!p.ok()) break;
    ASSERT_EQ(reinterpret_cast<uintptr_t>(*p) % 4096, 0u);
    ASSERT_TRUE(pool->Contains(*p, PinnedPool::SizeClass(bytes)));
    blocks.push_back({*p, bytes});
  }
  ASSERT_GT(blocks.size(), 30u);
  // Each block gets its own pattern over its whole size class; an overlap
  // would let a later block overwrite an earlier one.
  for (size_t i = 0; i < blocks.size(); ++i) {
    testutil::FillRandom(blocks[i].p, PinnedPool::SizeClass(blocks[i].bytes),
                         i);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    const uint64_t cls = PinnedPool::SizeClass(blocks[i].bytes);
    std::vector<char> want(cls);
    testutil::FillRandom(want.data(), cls, i);
    ASSERT_EQ(std::memcmp(blocks[i].p, want.data(), cls), 0) << "block " << i;
  }
  EXPECT_FALSE(pool->Contains(blocks[0].p, 5 * kMiB));
  int outside = 0;
  EXPECT_FALSE(pool->Contains(&outside, 1));
}

TEST(PinnedPoolTest, InfoDescribesTheSlab) {
  PinnedPoolOptions options;
  options.budget = 5000;
  options.lock = LockMode::kOff;
  options.huge_pages = false;
  auto plain = PinnedPool::Create(options, nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ((*plain)->info().backing, "mmap");
  EXPECT_EQ((*plain)->info().budget, 8192u);  // rounded up to pages
  EXPECT_FALSE((*plain)->info().locked);
  EXPECT_FALSE((*plain)->info().registered);
  EXPECT_GE((*plain)->info().numa_node, -1);

  options.budget = 3 * kMiB;
  options.huge_pages = true;
  options.lock = LockMode::kBestEffort;
  auto huge = PinnedPool::Create(options, nullptr);
  ASSERT_TRUE(huge.ok()) << huge.status().ToString();
  const PinnedPoolInfo& info = (*huge)->info();
  const std::set<std::string> names = {"mmap+hugetlb", "mmap+thp", "mmap"};
  EXPECT_TRUE(names.count(info.backing)) << info.backing;
  if (geteuid() == 0) {
    EXPECT_TRUE(info.locked);
  }
  void* first = *(*huge)->Allocate(kMiB);  // offset 0: the slab's start
  if (info.backing == "mmap+hugetlb" || info.backing == "mmap+thp") {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % (2 * kMiB), 0u);
  }
}

// Note [Device host memory]: the device supplies the slab when it can.
TEST(PinnedPoolTest, TakesItsSlabFromTheDevicesHostAllocator) {
  FakeHostAllocator device_host;
  PinnedPoolOptions options;
  options.budget = 3 * kMiB + 100;
  options.host_allocator = &device_host;
  {
    auto pool = PinnedPool::Create(options, nullptr);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    const PinnedPoolInfo& info = (*pool)->info();
    EXPECT_EQ(info.backing, "fake-device-host");
    EXPECT_TRUE(info.locked);  // pinned by the device's driver
    EXPECT_EQ(info.budget, 3 * kMiB + 4096);
    ASSERT_EQ(device_host.allocations, 1);
    ASSERT_EQ(device_host.live.size(), 1u);
    const auto& [base, bytes] = *device_host.live.begin();
    EXPECT_EQ(bytes, info.budget);
    void* p = *(*pool)->Allocate(kMiB);
    EXPECT_GE(p, base);
    EXPECT_LE(static_cast<char*>(p) + kMiB, static_cast<char*>(base) + bytes);
    std::memset(p, 0x5a, kMiB);
  }
  EXPECT_TRUE(device_host.live.empty()) << "the pool gave its slab back";
}

TEST(PinnedPoolTest, FallsBackToPagesWhenTheDeviceHasNoHostMemory) {
  FakeHostAllocator device_host;
  device_host.refuse = true;
  PinnedPoolOptions options;
  options.budget = kMiB;
  options.huge_pages = false;
  options.host_allocator = &device_host;
  auto pool = PinnedPool::Create(options, nullptr);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ(device_host.allocations, 1);
  EXPECT_EQ((*pool)->info().backing, "mmap");
}

TEST(PinnedPoolTest, AnUnlockedPoolDoesNotAskTheDevice) {
  FakeHostAllocator device_host;
  PinnedPoolOptions options;
  options.budget = kMiB;
  options.lock = LockMode::kOff;  // device host memory is always pinned
  options.huge_pages = false;
  options.host_allocator = &device_host;
  auto pool = PinnedPool::Create(options, nullptr);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ(device_host.allocations, 0);
  EXPECT_EQ((*pool)->info().backing, "mmap");
  EXPECT_FALSE((*pool)->info().locked);
}

TEST(PinnedPoolTest, CreateRejectsBadOptions) {
  PinnedPoolOptions options;
  options.lock = LockMode::kOff;
  auto zero = PinnedPool::Create(options, nullptr);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("--host-budget"), std::string::npos);

  options.budget = kMiB;
  options.numa_node = 4096;
  auto far = PinnedPool::Create(options, nullptr);
  if (far.ok()) {  // without libnuma there is nothing to check against
    EXPECT_EQ((*far)->info().numa_node, -1);
  } else {
    EXPECT_EQ(far.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(far.status().message().find("NUMA node 4096 does not exist"),
              std::string::npos)
        << far.status().message();
  }
}

TEST(PinnedPoolTest, RegisteredSlabServesAioReadsAndWrites) {
  auto engine = aio::Engine::Open(aio::IoOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  testutil::ScratchDir dir;
  auto file = (*engine)->OpenFile(dir.File("pool.bin"), {4 * kMiB});
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto pool = MakePool(8 * kMiB, engine->get());
  ASSERT_NE(pool, nullptr);
  EXPECT_TRUE(pool->info().registered);
  void* base = *pool->Allocate(4 * kMiB);  // offset 0: the slab's start
  void* in = *pool->Allocate(4 * kMiB);
  testutil::FillRandom(base, 4 * kMiB, 3);
  std::memset(in, 0, 4 * kMiB);
  ASSERT_TRUE((*engine)->Write(*file, base, 4 * kMiB, 0)->Wait().ok());
  ASSERT_TRUE((*engine)->Read(*file, in, 4 * kMiB, 0)->Wait().ok());
  EXPECT_EQ(std::memcmp(base, in, 4 * kMiB), 0);
  if ((*engine)->info().fixed_buffers) {
    EXPECT_GT((*engine)->stats().fixed_buffer, 0u);
  }
  pool.reset();
  // The pool unregistered its slab on the way out.
  EXPECT_EQ((*engine)->UnregisterBuffer(base).code(),
            StatusCode::kInvalidArgument);
}

// Runs `body` in a child process that has an unprivileged user's locking
// rights: RLIMIT_MEMLOCK of 64 KiB and, for root, a switch to uid nobody,
// which drops CAP_IPC_LOCK. Returns the child's exit code (77: the limit
// could not be imposed) and what it wrote to `out`.
int RunWithMemlockLimit(const std::function<int(std::string*)>& body,
                        std::string* out) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const rlimit lim = {64 * kKiB, 64 * kKiB};
    int code = 77;
    if (setrlimit(RLIMIT_MEMLOCK, &lim) == 0 &&
        (geteuid() != 0 || setuid(65534) == 0)) {
      std::string text;
      code = body(&text);
      if (write(fds[1], text.data(), text.size()) < 0) code = 90;
    }
    _exit(code);
  }
  close(fds[1]);
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;)
    out->append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Skips unless a child can really be kept from locking memory.
class PinnedPoolMemlockTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "the sanitizer runtime replaces mlock() with a no-op";
#endif
    std::string unused;
    const int code = RunWithMemlockLimit(
        [](std::string*) {
          static char probe[256 * 1024];
          return mlock(probe, sizeof(probe)) == 0 ? 1 : 0;
        },
        &unused);
    if (code != 0) {
      GTEST_SKIP() << "cannot impose an unprivileged memlock limit in a "
                      "child here (child exit code "
                   << code << ")";
    }
  }
};

TEST_F(PinnedPoolMemlockTest, RequiredLockingFailsWithTheLimitAndTheFix) {
  std::string msg;
  const int code = RunWithMemlockLimit(
      [](std::string* out) {
        PinnedPoolOptions options;
        options.budget = 4 * kMiB;
        options.lock = LockMode::kRequired;
        auto pool = PinnedPool::Create(options, nullptr);
        if (pool.ok()) return 1;
        *out = pool.status().message();
        return pool.status().code() == StatusCode::kResourceExhausted ? 0 : 2;
      },
      &msg);
  ASSERT_EQ(code, 0) << msg;
  for (const char* part :
       {"pinned host tier: cannot lock", "RLIMIT_MEMLOCK is 64.0 KiB",
        "(hard 64.0 KiB)", "ulimit -l", "limits.conf", "LimitMEMLOCK=infinity",
        "CAP_IPC_LOCK", "lock=off"}) {
    EXPECT_NE(msg.find(part), std::string::npos) << part << " in: " << msg;
  }
}

TEST_F(PinnedPoolMemlockTest, BestEffortWarnsOnceAndRunsUnlocked) {
  std::string err;
  const int code = RunWithMemlockLimit(
      [](std::string* out) {
        PinnedPoolOptions options;
        options.budget = 4 * kMiB;
        int result = 0;
        *out = testutil::CaptureStderr([&] {
          for (int i = 0; i < 2; ++i) {
            auto pool = PinnedPool::Create(options, nullptr);
            if (!pool.ok() || (*pool)->info().locked) result = 1;
            if (pool.ok()) std::memset(*(*pool)->Allocate(kMiB), 1, kMiB);
          }
          options.lock = LockMode::kOff;
          if (!PinnedPool::Create(options, nullptr).ok()) result = 2;
        });
        return result;
      },
      &err);
  ASSERT_EQ(code, 0) << err;
  EXPECT_EQ(err.rfind("strata: pinned host tier: cannot lock", 0), 0u) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find("running unlocked"), std::string::npos) << err;
}

TEST(PinnedPoolTest, ConcurrentAllocateAndFreeKeepTheBooks) {
  auto pool = MakePool(8 * kMiB);
  ASSERT_NE(pool, nullptr);
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::vector<int> corrupt(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<std::pair<unsigned char*, uint64_t>> mine;
      const unsigned char tag = static_cast<unsigned char>(t + 1);
      for (int op = 0; op < 2000; ++op) {
        if (mine.size() < 16 && rng() % 2 == 0) {
          const uint64_t bytes = 1 + rng() % (64 * kKiB);
          Result<void*> p = pool->Allocate(bytes);
          if (!p.ok()) continue;
          auto* c = static_cast<unsigned char*>(*p);
          c[0] = c[bytes - 1] = tag;
          mine.push_back({c, bytes});
        } else if (!mine.empty()) {
          auto [c, bytes] = mine.back();
          mine.pop_back();
          corrupt[t] += c[0] != tag || c[bytes - 1] != tag;
          pool->Free(c);
        }
      }
      for (auto [c, bytes] : mine) pool->Free(c);
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(corrupt[t], 0) << t;
  const PinnedPoolStats s = pool->stats();
  EXPECT_EQ(s.current, 0u);
  EXPECT_EQ(s.allocated, s.freed);
  EXPECT_EQ(s.allocations, s.frees);
  EXPECT_GT(s.allocations, 0u);
  EXPECT_LE(s.peak, 8 * kMiB);
  EXPECT_EQ(pool->free_bytes(), 8 * kMiB);
}

TEST(PinnedPoolDeathTest, FreeingForeignPointersAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto pool = MakePool(64 * kKiB);
  ASSERT_NE(pool, nullptr);
  void* p = *pool->Allocate(8192);
  int outside = 0;
  EXPECT_DEATH(pool->Free(&outside), "check failed");
  EXPECT_DEATH(pool->Free(static_cast<char*>(p) + 4096), "check failed");
  pool->Free(p);
  EXPECT_DEATH(pool->Free(p), "check failed");  // twice
}

}  // namespace
}  // namespace strata::tier
