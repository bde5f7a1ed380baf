// strata_aio edge cases: what happens to a request after it fails (its
// callback, its file, its buffer slot), zero-byte and kernel-reported
// results, the queue-depth bound, how requests are spread over the rings,
// when what a callback submits reaches the kernel, lengths that cannot be
// split and ranges that wrap around, and requests that run past a file's
// preallocated size or past a registered buffer. Every test runs on both
// backends, and again under STRATA_AIO_BACKEND=threads via CTest.
#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "strata/aio.h"
#include "tests/aio/aio_test_util.h"
#include "tests/testutil/testutil.h"

namespace strata::aio {
namespace {

using testutil::FillRandom;

class AioEdgeTest : public aio_test::BackendTest {};

TEST_P(AioEdgeTest, FailedRequestCallsItsCallbackExactlyOnce) {
  testutil::ErrnoInjector eio(EIO, 3 << 16, 4096);
  IoOptions o;
  o.block_size = 64 << 10;
  o.rings = 2;
  o.fault_injector = &eio;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(1 << 20);
  std::atomic<int> calls{0};
  std::atomic<int> failed_calls{0};
  auto h = e->Read(f, buf.data(), buf.size(), 0, [&](const Status& st) {
    ++calls;
    if (!st.ok()) ++failed_calls;
  });
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(h->Wait().ok());
  EXPECT_FALSE(e->WaitAll().ok());
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(failed_calls.load(), 1);
}

TEST_P(AioEdgeTest, FailedRequestReleasesItsFileAndBuffer) {
  testutil::ErrnoInjector eio(EIO, 0, 1 << 20);
  IoOptions o;
  o.block_size = 64 << 10;
  o.fault_injector = &eio;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(1 << 20);
  ASSERT_TRUE(e->RegisterBuffer(buf.data(), buf.size()).ok());
  EXPECT_EQ(e->Write(f, buf.data(), buf.size(), 0)->Wait().code(),
            StatusCode::kIoError);
  // Neither the file nor the buffer stays "in use" after the failure.
  EXPECT_TRUE(e->UnregisterBuffer(buf.data()).ok());
  EXPECT_TRUE(e->CloseFile(f).ok());
}

// Cuts every transfer to 4 KiB and fails the one that starts at `fail_at`.
class ShortThenFailInjector : public FaultInjector {
 public:
  explicit ShortThenFailInjector(uint64_t fail_at) : fail_at_(fail_at) {}
  uint32_t SubmitLength(bool, uint64_t, uint32_t len) override {
    return std::min<uint32_t>(len, 4096);
  }
  int CompletionResult(bool, uint64_t offset, uint32_t, int result) override {
    return offset == fail_at_ ? -EIO : result;
  }

 private:
  uint64_t fail_at_;
};

TEST_P(AioEdgeTest, ErrorAfterShortTransfersNamesTheUnfinishedRange) {
  // The second 64 KiB piece has moved 8 KiB when its third transfer fails:
  // the error names the 56 KiB from there, not the whole piece.
  ShortThenFailInjector injector((64 << 10) + 8192);
  IoOptions o;
  o.block_size = 64 << 10;
  o.fault_injector = &injector;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(128 << 10);
  const Status st = e->Write(f, buf.data(), buf.size(), 0)->Wait();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("offset 73728"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("57344 bytes"), std::string::npos)
      << st.message();
}

TEST_P(AioEdgeTest, ReadOfZeroBytesIsDataLossNotSuccess) {
  // The file shrinks under the engine (another process truncates it): the
  // kernel answers the read with 0 bytes, which must fail, not spin or pass.
  testutil::ErrnoInjector zero(0, 0, 4096, /*times=*/1);  // result 0
  IoOptions o;
  o.fault_injector = &zero;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 64 << 10);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(64 << 10);
  const Status st = e->Read(f, buf.data(), buf.size(), 0)->Wait();
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_NE(st.message().find("ENODATA"), std::string::npos) << st.message();
  EXPECT_EQ(zero.injected.load(), 1u);
}

TEST_P(AioEdgeTest, PassesTheKernelsErrnoThrough) {
  // No injector: a write at an offset past what off_t can hold is refused
  // by the kernel itself with EINVAL, and that errno must reach the caller.
  OPEN_OR_SKIP(e);
  File* f = OpenFile(*e, 4096);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(4096);
  auto h = e->Write(f, buf.data(), buf.size(), uint64_t{1} << 63);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  const Status st = h->Wait();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("EINVAL"), std::string::npos) << st.message();
}

TEST_P(AioEdgeTest, WritesPastThePreallocatedSizeCanBeReadBack) {
  OPEN_OR_SKIP(e);
  File* f = OpenFile(*e, 0);
  ASSERT_NE(f, nullptr);
  PinnedBuffer out = Buffer(64 << 10);
  PinnedBuffer in = Buffer(64 << 10);
  FillRandom(out.data(), out.size(), 21);
  ASSERT_TRUE(e->Write(f, out.data(), out.size(), 0)->Wait().ok());
  EXPECT_EQ(f->size(), out.size());
  auto r = e->Read(f, in.data(), in.size(), 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->Wait().ok());
  EXPECT_EQ(std::memcmp(out.data(), in.data(), in.size()), 0);
}

TEST_P(AioEdgeTest, WriteToAReadOnlyFileIsRefusedUpFront) {
  OPEN_OR_SKIP(e);
  File* rw = OpenFile(*e, 64 << 10, "ro");
  ASSERT_NE(rw, nullptr);
  ASSERT_TRUE(e->CloseFile(rw).ok());
  File* f = OpenFile(*e, 0, "ro", /*read_only=*/true);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(4096);
  auto w = e->Write(f, buf.data(), buf.size(), 0);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(w.status().message().find("read-only"), std::string::npos);
  EXPECT_TRUE(e->Read(f, buf.data(), buf.size(), 0)->Wait().ok());
}

TEST_P(AioEdgeTest, RequestRunningPastARegisteredBufferStillWorks) {
  IoOptions o;
  o.block_size = 128 << 10;  // one piece, half inside the registration
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer out = Buffer(128 << 10);
  PinnedBuffer in = Buffer(128 << 10);
  FillRandom(out.data(), out.size(), 22);
  ASSERT_TRUE(e->RegisterBuffer(out.data(), 64 << 10).ok());
  const Status w = e->Write(f, out.data(), out.size(), 0)->Wait();
  ASSERT_TRUE(w.ok()) << w.ToString();
  ASSERT_TRUE(e->Read(f, in.data(), in.size(), 0)->Wait().ok());
  EXPECT_EQ(std::memcmp(out.data(), in.data(), in.size()), 0);
  EXPECT_EQ(e->stats().fixed_buffer, 0u);
  EXPECT_TRUE(e->UnregisterBuffer(out.data()).ok());
}

// Tracks transfers between submission and completion; remembers the most
// that were ever outstanding at once.
class InFlightInjector : public FaultInjector {
 public:
  uint32_t SubmitLength(bool, uint64_t, uint32_t len) override {
    const int now = ++in_flight_;
    int seen = max.load();
    while (now > seen && !max.compare_exchange_weak(seen, now)) {
    }
    return len;
  }
  int CompletionResult(bool, uint64_t, uint32_t, int result) override {
    --in_flight_;
    return result;
  }
  std::atomic<int> max{0};

 private:
  std::atomic<int> in_flight_{0};
};

TEST_P(AioEdgeTest, NeverExceedsTheQueueDepth) {
  InFlightInjector counter;
  IoOptions o;
  o.rings = 1;
  o.queue_depth = 4;
  o.block_size = 4096;
  o.fault_injector = &counter;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(256 << 10);  // 64 pieces
  ASSERT_TRUE(e->Write(f, buf.data(), buf.size(), 0)->Wait().ok());
  EXPECT_GE(counter.max.load(), 1);
  EXPECT_LE(counter.max.load(), 4);
}

TEST_P(AioEdgeTest, RingIndexBeyondTheRingCountWraps) {
  IoOptions o;
  o.rings = 2;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer out = Buffer(64 << 10);
  PinnedBuffer in = Buffer(64 << 10);
  FillRandom(out.data(), out.size(), 23);
  auto w = e->Submit({f, out.data(), out.size(), 0, true, 5, {}});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->Wait().ok());
  auto r = e->Submit({f, in.data(), in.size(), 0, false, 64, {}});
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->Wait().ok());
  EXPECT_EQ(std::memcmp(out.data(), in.data(), in.size()), 0);
}

// Records the names of the threads that submit transfers (with io_uring,
// each ring's own thread: "strata-ringN").
class SubmitterInjector : public FaultInjector {
 public:
  uint32_t SubmitLength(bool, uint64_t, uint32_t len) override {
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    std::lock_guard<std::mutex> lock(mu_);
    names_.insert(name);
    return len;
  }
  std::set<std::string> names() {
    std::lock_guard<std::mutex> lock(mu_);
    return names_;
  }

 private:
  std::mutex mu_;
  std::set<std::string> names_;
};

TEST_P(AioEdgeTest, SpreadsLargeAndSmallRequestsOverEveryRing) {
  SubmitterInjector large;
  SubmitterInjector small;
  for (SubmitterInjector* injector : {&large, &small}) {
    IoOptions o;
    o.block_size = 32 << 10;
    o.rings = 4;
    o.fault_injector = injector;
    OPEN_OR_SKIP(e, o);
    if (e->info().backend != Backend::kIoUring) {
      GTEST_SKIP() << "rings are an io_uring property (running "
                   << BackendName(e->info().backend) << ")";
    }
    File* f = OpenFile(*e, 1 << 20);
    ASSERT_NE(f, nullptr);
    PinnedBuffer buf = Buffer(1 << 20);
    if (injector == &large) {
      // One request of 32 pieces.
      ASSERT_TRUE(e->Write(f, buf.data(), buf.size(), 0)->Wait().ok());
    } else {
      // Eight single-piece requests, round robin.
      for (size_t off = 0; off < (256 << 10); off += 32 << 10) {
        ASSERT_TRUE(e->Write(f, buf.data(), 32 << 10, off)->Wait().ok());
      }
    }
  }
  EXPECT_EQ(large.names().size(), 4u);
  EXPECT_EQ(small.names().size(), 4u);
}

// Records in order each transfer's submission ('P') and each first-wave
// callback's run ('C'), with the offset.
class OrderInjector : public FaultInjector {
 public:
  uint32_t SubmitLength(bool, uint64_t offset, uint32_t len) override {
    Log('P', offset);
    return len;
  }
  void Log(char what, uint64_t offset) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.emplace_back(what, offset);
  }
  std::vector<std::pair<char, uint64_t>> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<char, uint64_t>> events_;
};

// Note [Submission batches]: what a completion callback submits is prepped
// before the next callback of the same reaped burst runs, and so reaches the
// kernel between callbacks (with the next batch), not after the whole burst.
TEST_P(AioEdgeTest, CallbackSubmissionsReachTheKernelBetweenCallbacks) {
  OrderInjector order;
  IoOptions o;
  o.queue_depth = 32;
  o.submit_batch = 1;
  o.fault_injector = &order;
  OPEN_OR_SKIP(e, o);
  if (e->info().backend != Backend::kIoUring) {
    GTEST_SKIP() << "reaped bursts are an io_uring property (running "
                 << BackendName(e->info().backend) << ")";
  }
  constexpr uint64_t kBlock = 4096;
  constexpr int kWave = 8;
  File* f = OpenFile(*e, (2 * kWave + 1) * kBlock);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(kBlock);
  std::atomic<bool> slept{false};
  // The wave is submitted from the ring thread, all at once. Its first
  // callback holds the ring thread while the rest of the wave completes,
  // so that they are reaped together; each submits one follow-up.
  auto wave = [&](const Status& st) {
    EXPECT_TRUE(st.ok()) << st.ToString();
    for (int i = 0; i < kWave; ++i) {
      const uint64_t at = i * kBlock;
      auto h = e->Write(f, buf.data(), kBlock, at, [&, at](const Status& s) {
        EXPECT_TRUE(s.ok()) << s.ToString();
        order.Log('C', at);
        if (!slept.exchange(true)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        EXPECT_TRUE(e->Write(f, buf.data(), kBlock, at + kWave * kBlock).ok());
      });
      EXPECT_TRUE(h.ok()) << h.status().ToString();
    }
  };
  ASSERT_TRUE(e->Write(f, buf.data(), kBlock, 2 * kWave * kBlock, wave).ok());
  ASSERT_TRUE(e->WaitAll().ok());
  const auto events = order.events();
  int callbacks = 0;
  for (size_t k = 0; k < events.size(); ++k) {
    if (events[k].first != 'C') continue;
    ++callbacks;
    const uint64_t follow_up = events[k].second + kWave * kBlock;
    size_t next = k + 1;
    while (next < events.size() && events[next] != std::pair{'P', follow_up} &&
           events[next].first != 'C') {
      ++next;
    }
    ASSERT_LT(next, events.size());
    EXPECT_EQ(events[next].first, 'P')
        << "the follow-up of the write at " << events[k].second
        << " was prepped only after the next callback ran";
  }
  EXPECT_EQ(callbacks, kWave);
}

TEST_P(AioEdgeTest, LengthThatWrapsAroundIsRejected) {
  // A length computed as `end - start` with the two swapped is close to
  // 2^64; it must be refused, not split into zero pieces that never
  // complete (or into too few that "succeed").
  IoOptions o;
  o.block_size = 1 << 20;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(4096);
  for (const size_t len : {~size_t{4095}, (size_t{1} << 52)}) {
    auto w = e->Write(f, buf.data(), len, 4096);
    if (w.ok()) {
      (void)e.release();  // its destructor would wait for the request forever
      FAIL() << "a write of " << len << " bytes was accepted";
    }
    EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(e->WaitAll().ok());
}

// An offset near 2^64 (a negative offset) wraps offset + len: the request
// is refused as such, not sent to the kernel (which would fail it with an
// EINVAL that reads as misalignment).
TEST_P(AioEdgeTest, RangeThatWrapsAroundIsRejected) {
  OPEN_OR_SKIP(e, IoOptions{});
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(8192);
  const uint64_t offset = ~uint64_t{4095};
  for (const bool write : {false, true}) {
    SCOPED_TRACE(write ? "write" : "read");
    auto h = write ? e->Write(f, buf.data(), 8192, offset)
                   : e->Read(f, buf.data(), 8192, offset);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(h.status().message().find("past the largest file offset"),
              std::string::npos)
        << h.status().message();
  }
  EXPECT_TRUE(e->WaitAll().ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, AioEdgeTest,
                         ::testing::Values(Backend::kIoUring,
                                           Backend::kThreads),
                         aio_test::BackendSuffix);

}  // namespace
}  // namespace strata::aio
