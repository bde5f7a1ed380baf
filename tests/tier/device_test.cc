// The device tier: option handling and backend choice, then one behavioural
// suite run on every backend (the CUDA instance skips visibly without a GPU).
#include "src/tier/device.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/text.h"
#include "tests/testutil/testutil.h"

namespace strata::tier {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

::testing::AssertionResult Contains(const std::string& text,
                                    const std::string& part) {
  if (text.find(part) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "\"" << text << "\" does not contain \"" << part << "\"";
}

std::vector<uint8_t> RandomBytes(size_t bytes, uint64_t seed) {
  std::vector<uint8_t> out(bytes);
  testutil::FillRandom(out.data(), out.size(), seed);
  return out;
}

TEST(DeviceKindTest, ParseAndNameRoundTrip) {
  for (DeviceKind kind :
       {DeviceKind::kAuto, DeviceKind::kHostEmulated, DeviceKind::kCuda}) {
    Result<DeviceKind> parsed = ParseDeviceKind(DeviceKindName(kind));
    ASSERT_TRUE(parsed.ok()) << DeviceKindName(kind);
    EXPECT_EQ(*parsed, kind);
  }
  Result<DeviceKind> emulated = ParseDeviceKind("emulated");
  ASSERT_TRUE(emulated.ok());
  EXPECT_EQ(*emulated, DeviceKind::kHostEmulated);
  Result<DeviceKind> bad = ParseDeviceKind("gpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad.status().message(), "'gpu'"));
  EXPECT_TRUE(Contains(bad.status().message(), "auto, host"));
}

TEST(OpenDeviceTest, AutoPicksHostWithoutCudaAndSaysWhy) {
  std::string why;
  if (CudaAvailable(&why)) GTEST_SKIP() << "a CUDA device is present here";
  EXPECT_FALSE(why.empty());
  Result<std::unique_ptr<Device>> device =
      OpenDevice({.kind = DeviceKind::kAuto, .budget = kMiB});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  const DeviceInfo& info = (*device)->info();
  EXPECT_EQ(info.kind, DeviceKind::kHostEmulated);
  EXPECT_EQ(info.reason, "auto: " + why + ", using the host-emulated device");
}

TEST(OpenDeviceTest, CudaRequestedWithoutCudaNamesReasonAndFix) {
  std::string why;
  if (CudaAvailable(&why)) GTEST_SKIP() << "a CUDA device is present here";
  Result<std::unique_ptr<Device>> device =
      OpenDevice({.kind = DeviceKind::kCuda, .budget = kMiB});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(device.status().message(), why));
  EXPECT_TRUE(Contains(device.status().message(), "--device host"));
}

TEST(OpenDeviceTest, AutoPicksCudaWhenPresent) {
  std::string why;
  if (!CudaAvailable(&why)) GTEST_SKIP() << "no CUDA here: " << why;
  Result<std::unique_ptr<Device>> device =
      OpenDevice({.kind = DeviceKind::kAuto, .budget = kMiB});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  EXPECT_EQ((*device)->info().kind, DeviceKind::kCuda);
  EXPECT_TRUE(Contains((*device)->info().reason, "auto:"));
}

TEST(OpenDeviceTest, MissingCudaOrdinalIsNamed) {
  std::string why;
  if (!CudaAvailable(&why)) GTEST_SKIP() << "no CUDA here: " << why;
  Result<std::unique_ptr<Device>> device = OpenDevice(
      {.kind = DeviceKind::kCuda, .budget = kMiB, .cuda_device = 4096});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(device.status().message(), "CUDA device 4096"));
  EXPECT_TRUE(Contains(device.status().message(), "--cuda-device"));
}

TEST(OpenDeviceTest, RejectsUnusableOptions) {
  const DeviceOptions bad[] = {
      {.kind = DeviceKind::kHostEmulated, .budget = 0},
      {.kind = DeviceKind::kHostEmulated, .budget = kMiB, .alignment = 0},
      {.kind = DeviceKind::kHostEmulated, .budget = kMiB, .alignment = 384},
      {.kind = DeviceKind::kHostEmulated, .budget = 100, .alignment = 256},
  };
  for (const DeviceOptions& options : bad) {
    Result<std::unique_ptr<Device>> device = OpenDevice(options);
    ASSERT_FALSE(device.ok()) << options.budget << " " << options.alignment;
    EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(Contains(OpenDevice({.budget = 0}).status().message(),
                       "--device-budget"));
  EXPECT_TRUE(Contains(
      OpenDevice({.budget = kMiB, .alignment = 384}).status().message(),
      "384 is not a power of two"));
}

TEST(OpenDeviceTest, BudgetIsRoundedDownToTheAlignment) {
  Result<std::unique_ptr<Device>> device = OpenDevice(
      {.kind = DeviceKind::kHostEmulated, .budget = 1000, .alignment = 256});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  EXPECT_EQ((*device)->info().budget, 768u);
  EXPECT_EQ((*device)->free_bytes(), 768u);
  EXPECT_EQ((*device)->info().name, "host-emulated");
  EXPECT_EQ((*device)->info().numa_node, -1);
  EXPECT_EQ((*device)->info().reason, "host-emulated device requested");
}

TEST(EventTest, DefaultEventIsCompleteAndOk) {
  Event event;
  EXPECT_TRUE(event.Poll());
  EXPECT_TRUE(event.Wait().ok());
}

TEST(DeviceDeathTest, FreeingWhatWasNotAllocatedAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Result<std::unique_ptr<Device>> device =
      OpenDevice({.kind = DeviceKind::kHostEmulated, .budget = kMiB});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  auto* ptr = static_cast<uint8_t*>(*(*device)->Allocate(4096));
  int outside = 0;
  EXPECT_DEATH((*device)->Free(&outside), "check failed");
  EXPECT_DEATH((*device)->Free(ptr + 256), "check failed");
  (*device)->Free(ptr);
  EXPECT_DEATH((*device)->Free(ptr), "check failed");
}

// The behavioural suite, once per backend.
class DeviceTest : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    std::string why;
    if (GetParam() == DeviceKind::kCuda && !CudaAvailable(&why)) {
      GTEST_SKIP() << "CUDA backend not testable here: " << why;
    }
  }

  std::unique_ptr<Device> Open(uint64_t budget = 8 * kMiB,
                               uint64_t alignment = 256) {
    Result<std::unique_ptr<Device>> device = OpenDevice(
        {.kind = GetParam(), .budget = budget, .alignment = alignment});
    EXPECT_TRUE(device.ok()) << device.status().ToString();
    return device.ok() ? std::move(*device) : nullptr;
  }

  static void* MustAllocate(Device& device, uint64_t bytes) {
    Result<void*> ptr = device.Allocate(bytes);
    EXPECT_TRUE(ptr.ok()) << ptr.status().ToString();
    return ptr.ok() ? *ptr : nullptr;
  }

  // Copies `bytes` at `device` back to the host and returns them.
  static std::vector<uint8_t> ReadBack(Device& device, const void* src,
                                       size_t bytes) {
    std::vector<uint8_t> out(bytes);
    Result<Event> event = device.CopyToHost(out.data(), src, bytes);
    EXPECT_TRUE(event.ok()) << event.status().ToString();
    if (event.ok()) {
      EXPECT_TRUE(event->Wait().ok());
    }
    return out;
  }

  static void Write(Device& device, void* dst, const std::vector<uint8_t>& in) {
    Result<Event> event = device.CopyToDevice(dst, in.data(), in.size());
    ASSERT_TRUE(event.ok()) << event.status().ToString();
    ASSERT_TRUE(event->Wait().ok());
  }
};

TEST_P(DeviceTest, InfoDescribesTheBackend) {
  std::unique_ptr<Device> device = Open(4 * kMiB);
  ASSERT_NE(device, nullptr);
  EXPECT_EQ(device->info().kind, GetParam());
  EXPECT_EQ(device->info().budget, 4 * kMiB);
  EXPECT_FALSE(device->info().name.empty());
  EXPECT_EQ(device->free_bytes(), 4 * kMiB);
}

// The CUDA device supplies pinned host memory (the pinned tier's slab); the
// host-emulated device has nothing better than locked pages.
TEST_P(DeviceTest, HostAllocatorIsTheDevicesOwn) {
  std::unique_ptr<Device> device = Open();
  ASSERT_NE(device, nullptr);
  HostAllocator* host = device->host_allocator();
  if (GetParam() == DeviceKind::kHostEmulated) {
    EXPECT_EQ(host, nullptr);
    return;
  }
  ASSERT_NE(host, nullptr);
  EXPECT_STREQ(host->name(), "cudaHostAlloc");
  auto* pinned = static_cast<uint8_t*>(host->Allocate(kMiB));
  ASSERT_NE(pinned, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pinned) % 4096, 0u);
  std::vector<uint8_t> want(kMiB);
  testutil::FillRandom(want.data(), want.size(), 7);
  std::memcpy(pinned, want.data(), want.size());
  void* on_device = MustAllocate(*device, kMiB);
  Result<Event> up = device->CopyToDevice(on_device, pinned, kMiB);
  ASSERT_TRUE(up.ok() && up->Wait().ok());
  EXPECT_EQ(ReadBack(*device, on_device, kMiB), want);
  host->Free(pinned);
  device->Free(on_device);
}

TEST_P(DeviceTest, BudgetThatCannotBeReservedFailsAtOpen) {
  constexpr uint64_t kPiB = uint64_t{1} << 50;  // beyond any address space
  Result<std::unique_ptr<Device>> device =
      OpenDevice({.kind = GetParam(), .budget = kPiB});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(device.status().message(), HumanBytes(kPiB)));
  EXPECT_TRUE(Contains(device.status().message(), "--device-budget"));
}

TEST_P(DeviceTest, AllocationBeyondTheBudgetNamesTierBytesAndFix) {
  std::unique_ptr<Device> device = Open(kMiB);
  ASSERT_NE(device, nullptr);
  ASSERT_NE(MustAllocate(*device, 512 * kKiB), nullptr);
  Result<void*> more = device->Allocate(768 * kKiB);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted);
  const std::string& msg = more.status().message();
  EXPECT_TRUE(Contains(msg, "device tier ("));
  EXPECT_TRUE(Contains(msg, "cannot allocate " + HumanBytes(768 * kKiB)));
  EXPECT_TRUE(Contains(
      msg, HumanBytes(512 * kKiB) + " free of budget " + HumanBytes(kMiB)));
  EXPECT_TRUE(Contains(msg, "largest free range " + HumanBytes(512 * kKiB)));
  EXPECT_TRUE(Contains(msg, "--device-budget"));
  EXPECT_FALSE(Contains(msg, "fragmented"));
}

TEST_P(DeviceTest, FragmentationIsNamed) {
  std::unique_ptr<Device> device = Open(kMiB);
  ASSERT_NE(device, nullptr);
  void* parts[4];
  for (void*& part : parts) part = MustAllocate(*device, 256 * kKiB);
  device->Free(parts[0]);
  device->Free(parts[2]);
  Result<void*> wide = device->Allocate(512 * kKiB);
  ASSERT_FALSE(wide.ok());
  EXPECT_TRUE(Contains(wide.status().message(), "fragmented"));
  EXPECT_TRUE(Contains(wide.status().message(),
                       "largest free range " + HumanBytes(256 * kKiB)));
}

TEST_P(DeviceTest, FreedMemoryIsReusedAndCoalesced) {
  std::unique_ptr<Device> device = Open(kMiB);
  ASSERT_NE(device, nullptr);
  void* whole = MustAllocate(*device, kMiB);
  EXPECT_EQ(device->free_bytes(), 0u);
  EXPECT_FALSE(device->Allocate(1).ok());
  device->Free(whole);
  EXPECT_EQ(device->free_bytes(), kMiB);
  void* a = MustAllocate(*device, 512 * kKiB);
  void* b = MustAllocate(*device, 512 * kKiB);
  EXPECT_EQ(a, whole);
  device->Free(a);
  device->Free(b);
  EXPECT_EQ(MustAllocate(*device, kMiB), whole);
  device->Free(nullptr);
}

TEST_P(DeviceTest, AllocationsAreAlignedAndRoundedUp) {
  for (uint64_t alignment : {uint64_t{256}, uint64_t{4096}, 64 * kKiB}) {
    std::unique_ptr<Device> device = Open(kMiB, alignment);
    ASSERT_NE(device, nullptr);
    for (uint64_t bytes : {uint64_t{1}, alignment - 1, alignment + 1}) {
      void* ptr = MustAllocate(*device, bytes);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(ptr) % alignment, 0u);
    }
    EXPECT_EQ(device->stats().used, 4 * alignment);
  }
}

TEST_P(DeviceTest, RandomBytesRoundTripAtManySizesAndOffsets) {
  std::unique_ptr<Device> device = Open(4 * kMiB);
  ASSERT_NE(device, nullptr);
  constexpr size_t kSpan = 2 * kMiB;
  auto* base = static_cast<uint8_t*>(MustAllocate(*device, kSpan));
  ASSERT_TRUE(device->Memset(base, 0xAB, kSpan).ok());
  uint64_t seed = 1;
  for (size_t bytes :
       {1ul, 3ul, 255ul, 256ul, 257ul, 4095ul, 4096ul, 65537ul, kMiB + 13}) {
    for (size_t offset : {0ul, 1ul, 17ul, 255ul, 4096ul + 3}) {
      const std::vector<uint8_t> in = RandomBytes(bytes, seed++);
      Write(*device, base + offset, in);
      EXPECT_EQ(ReadBack(*device, base + offset, bytes), in)
          << bytes << " bytes at offset " << offset;
      const std::vector<uint8_t> after =
          ReadBack(*device, base + offset + bytes, 64);
      EXPECT_EQ(after, std::vector<uint8_t>(64, 0xAB)) << "wrote past the end";
      ASSERT_TRUE(device->Memset(base + offset, 0xAB, bytes).ok());
    }
  }
}

TEST_P(DeviceTest, CopiesInOneDirectionCompleteInOrder) {
  std::unique_ptr<Device> device = Open(8 * kMiB);
  ASSERT_NE(device, nullptr);
  constexpr size_t kBytes = kMiB;
  void* first = MustAllocate(*device, kBytes);
  void* second = MustAllocate(*device, kBytes);
  for (uint64_t round = 0; round < 4; ++round) {
    const std::vector<uint8_t> a = RandomBytes(kBytes, 2 * round);
    const std::vector<uint8_t> b = RandomBytes(kBytes, 2 * round + 1);
    // Host->device: B, issued after A to the same place, wins.
    Result<Event> write_a = device->CopyToDevice(first, a.data(), kBytes);
    Result<Event> write_b = device->CopyToDevice(first, b.data(), kBytes);
    ASSERT_TRUE(write_a.ok() && write_b.ok());
    ASSERT_TRUE(write_b->Wait().ok());
    EXPECT_TRUE(write_a->Poll()) << "a later copy finished before an earlier";
    Write(*device, second, a);
    EXPECT_EQ(ReadBack(*device, first, kBytes), b);
    // Device->host: the second read into one host buffer wins.
    std::vector<uint8_t> out(kBytes);
    Result<Event> read_a = device->CopyToHost(out.data(), second, kBytes);
    Result<Event> read_b = device->CopyToHost(out.data(), first, kBytes);
    ASSERT_TRUE(read_a.ok() && read_b.ok());
    ASSERT_TRUE(read_b->Wait().ok());
    EXPECT_TRUE(read_a->Poll());
    EXPECT_EQ(out, b);
  }
}

// An event that completes when the test opens it.
class Gate : public Event::Impl {
 public:
  bool Poll() override {
    std::lock_guard<std::mutex> lock(mu_);
    return open_;
  }
  Status Wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return open_; });
    return Status();
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// A fill waits for no copy: with the copies to the device held up (as a
// prefetch's are while its NVMe read lands), Memset still returns, and the
// held copy runs once the gate opens. (Before, the fill queued behind
// them, so each AcquireGradients waited for the prefetches in flight.)
TEST_P(DeviceTest, MemsetDoesNotWaitForCopiesHeldUp) {
  if (GetParam() == DeviceKind::kCuda) {
    GTEST_SKIP() << "a host-side gate cannot hold up a CUDA stream";
  }
  std::unique_ptr<Device> device = Open(4 * kMiB);
  ASSERT_NE(device, nullptr);
  constexpr size_t kBytes = kMiB;
  void* held = MustAllocate(*device, kBytes);
  void* filled = MustAllocate(*device, kBytes);
  const std::vector<uint8_t> in = RandomBytes(kBytes, 7);
  auto gate = std::make_shared<Gate>();
  std::future<Status> fill;
  struct OpenAtExit {  // else a failed check would leave the queue held
    Gate* gate;
    ~OpenAtExit() { gate->Open(); }
  } open_at_exit{gate.get()};
  ASSERT_TRUE(device->OrderAfter(Direction::kToDevice, Event(gate)).ok());
  Result<Event> write = device->CopyToDevice(held, in.data(), kBytes);
  ASSERT_TRUE(write.ok());
  fill = std::async(std::launch::async,
                    [&] { return device->Memset(filled, 0x5A, kBytes); });
  ASSERT_EQ(fill.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "Memset is waiting behind the held copy";
  ASSERT_TRUE(fill.get().ok());
  EXPECT_FALSE(write->Poll()) << "the gate was open";
  gate->Open();
  ASSERT_TRUE(write->Wait().ok());
  EXPECT_EQ(ReadBack(*device, held, kBytes), in);
  EXPECT_EQ(ReadBack(*device, filled, kBytes),
            std::vector<uint8_t>(kBytes, 0x5A));
}

TEST_P(DeviceTest, ConcurrentCopiesFromManyThreads) {
  std::unique_ptr<Device> device = Open(8 * kMiB);
  ASSERT_NE(device, nullptr);
  constexpr int kThreads = 4;
  constexpr int kRounds = 24;
  constexpr size_t kBytes = 64 * kKiB + 5;
  std::vector<std::thread> threads;
  std::vector<int> mismatches(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        Result<void*> ptr = device->Allocate(kBytes);
        if (!ptr.ok()) {
          ++mismatches[t];
          continue;
        }
        const std::vector<uint8_t> in = RandomBytes(kBytes, t * 1000 + round);
        std::vector<uint8_t> out(kBytes);
        // The directions are independent queues: a read must wait for the
        // write it depends on.
        Result<Event> write = device->CopyToDevice(*ptr, in.data(), kBytes);
        bool ok = write.ok() && write->Wait().ok();
        if (ok) {
          Result<Event> read = device->CopyToHost(out.data(), *ptr, kBytes);
          ok = read.ok() && read->Wait().ok() && out == in;
        }
        if (!ok) ++mismatches[t];
        device->Free(*ptr);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(kThreads, 0));
  const DeviceStats stats = device->stats();
  EXPECT_EQ(stats.h2d_bytes, kThreads * kRounds * kBytes);
  EXPECT_EQ(stats.d2h_bytes, kThreads * kRounds * kBytes);
  EXPECT_EQ(stats.used, 0u);
}

TEST_P(DeviceTest, PollTurnsTrueAndWaitRepeats) {
  std::unique_ptr<Device> device = Open(8 * kMiB);
  ASSERT_NE(device, nullptr);
  constexpr size_t kBytes = 4 * kMiB;
  void* ptr = MustAllocate(*device, kBytes);
  const std::vector<uint8_t> in = RandomBytes(kBytes, 3);
  Result<Event> write = device->CopyToDevice(ptr, in.data(), kBytes);
  ASSERT_TRUE(write.ok());
  const Event shared = *write;
  while (!shared.Poll()) std::this_thread::yield();
  EXPECT_TRUE(write->Poll());
  EXPECT_TRUE(write->Wait().ok());
  EXPECT_TRUE(shared.Wait().ok());
  EXPECT_EQ(ReadBack(*device, ptr, kBytes), in);
}

TEST_P(DeviceTest, CopiesOutsideAnAllocationAreRejected) {
  std::unique_ptr<Device> device = Open(kMiB);
  ASSERT_NE(device, nullptr);
  auto* ptr = static_cast<uint8_t*>(MustAllocate(*device, 4096));
  auto* freed = static_cast<uint8_t*>(MustAllocate(*device, 4096));
  device->Free(freed);
  std::vector<uint8_t> host(8192);
  auto expect_rejected = [&](const Result<Event>& result, const char* text) {
    ASSERT_FALSE(result.ok()) << text;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(result.status().message(), text));
  };
  expect_rejected(device->CopyToDevice(nullptr, host.data(), 16),
                  "the device pointer is null");
  expect_rejected(device->CopyToHost(nullptr, ptr, 16),
                  "the host pointer is null");
  expect_rejected(device->CopyToDevice(host.data(), host.data() + 4096, 16),
                  "not memory of this device");
  expect_rejected(device->CopyToHost(host.data(), freed, 16),
                  "lies in no allocation");
  expect_rejected(device->CopyToDevice(ptr + 4000, host.data(), 97),
                  "run past the end");
  expect_rejected(device->CopyToHost(host.data(), ptr, 4097),
                  "run past the end");
  expect_rejected(device->CopyToDevice(ptr, ptr + 2048, 16),
                  "lies in this device's memory");
  const Status memset = device->Memset(ptr + 1, 0, 4096);
  EXPECT_EQ(memset.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(memset.message(), "run past the end"));
  EXPECT_EQ(device->stats().h2d_bytes, 0u);
  EXPECT_EQ(device->stats().d2h_bytes, 0u);
}

TEST_P(DeviceTest, DestructionWaitsForCopiesInFlight) {
  constexpr int kCopies = 32;
  constexpr size_t kBytes = 256 * kKiB;
  const std::vector<uint8_t> in = RandomBytes(kBytes, 11);
  std::vector<std::vector<uint8_t>> outs(kCopies, std::vector<uint8_t>(kBytes));
  std::vector<Event> events;
  {
    std::unique_ptr<Device> device = Open(kMiB);
    ASSERT_NE(device, nullptr);
    void* source = MustAllocate(*device, kBytes);
    void* sink = MustAllocate(*device, kBytes);
    Write(*device, source, in);
    for (int i = 0; i < kCopies; ++i) {
      Result<Event> write = device->CopyToDevice(sink, in.data(), kBytes);
      Result<Event> read = device->CopyToHost(outs[i].data(), source, kBytes);
      ASSERT_TRUE(write.ok() && read.ok());
      events.push_back(*write);
      events.push_back(*read);
    }
  }
  for (const Event& event : events) {
    EXPECT_TRUE(event.Poll());
    EXPECT_TRUE(event.Wait().ok());
  }
  for (const std::vector<uint8_t>& out : outs) EXPECT_EQ(out, in);
}

TEST_P(DeviceTest, StatsCountExactly) {
  std::unique_ptr<Device> device = Open(kMiB, 256);
  ASSERT_NE(device, nullptr);
  void* a = MustAllocate(*device, 1000);  // 1024 reserved
  void* b = MustAllocate(*device, 300);   // 512 reserved
  EXPECT_EQ(device->stats().used, 1536u);
  device->Free(a);
  void* c = MustAllocate(*device, 256);
  DeviceStats stats = device->stats();
  EXPECT_EQ(stats.used, 768u);
  EXPECT_EQ(stats.peak, 1536u);
  EXPECT_EQ(device->free_bytes(), kMiB - 768);

  std::vector<uint8_t> host(1000, 1);
  Write(*device, c, std::vector<uint8_t>(256, 2));
  Write(*device, b, std::vector<uint8_t>(300, 3));
  ReadBack(*device, b, 299);
  Result<Event> empty = device->CopyToDevice(c, host.data(), 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->Poll());
  EXPECT_FALSE(device->CopyToDevice(c, host.data(), 257).ok());
  ASSERT_TRUE(device->Memset(b, 0, 300).ok());
  stats = device->stats();
  EXPECT_EQ(stats.h2d_bytes, 556u);
  EXPECT_EQ(stats.d2h_bytes, 299u);
  device->Free(b);
  device->Free(c);
  EXPECT_EQ(device->stats().used, 0u);
  EXPECT_EQ(device->stats().peak, 1536u);
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceTest,
                         ::testing::Values(DeviceKind::kHostEmulated,
                                           DeviceKind::kCuda),
                         [](const ::testing::TestParamInfo<DeviceKind>& info) {
                           return std::string(DeviceKindName(info.param));
                         });

}  // namespace
}  // namespace strata::tier
