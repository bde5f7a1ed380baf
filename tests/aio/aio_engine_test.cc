// strata_aio data path: every test runs on both backends (io_uring and the
// thread pool), and again under STRATA_AIO_BACKEND=threads via CTest.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "strata/aio.h"
#include "tests/aio/aio_test_util.h"
#include "tests/testutil/testutil.h"

namespace strata::aio {
namespace {

using testutil::FillRandom;

class AioEngineTest : public aio_test::BackendTest {
 protected:
  // Writes `bytes` of random data at offset 0 of `f`, reads them back and
  // expects them unchanged.
  void ExpectRoundTrip(Engine& e, File* f, size_t bytes, uint64_t seed) {
    PinnedBuffer out = Buffer(bytes);
    PinnedBuffer in = Buffer(bytes);
    FillRandom(out.data(), bytes, seed);
    const Status w = e.Write(f, out.data(), bytes, 0)->Wait();
    ASSERT_TRUE(w.ok()) << w.ToString();
    const Status r = e.Read(f, in.data(), bytes, 0)->Wait();
    ASSERT_TRUE(r.ok()) << r.ToString();
    EXPECT_EQ(std::memcmp(out.data(), in.data(), bytes), 0);
  }
};

TEST_P(AioEngineTest, RoundTripsManySizesAndOffsets) {
  IoOptions o;
  o.block_size = 64 << 10;
  o.queue_depth = 4;
  o.rings = 2;
  OPEN_OR_SKIP(e, o);
  constexpr uint64_t kFile = 8 << 20;
  File* f = OpenFile(*e, kFile);
  ASSERT_NE(f, nullptr);
  const uint32_t align = std::max(f->offset_align(), f->mem_align());
  // Up to 1.5 MiB: well past block_size x queue_depth x rings (512 KiB).
  PinnedBuffer out = Buffer(3 << 19);
  PinnedBuffer in = Buffer(3 << 19);
  std::mt19937_64 rng(42);
  std::vector<size_t> sizes = {
      align,     4096,    64 << 10, (64 << 10) + align, (512 << 10) - align,
      512 << 10, 1 << 20, 3 << 19};
  for (int i = 0; i < 24; ++i) sizes.push_back((1 + rng() % 3072) * align);
  for (size_t len : sizes) {
    len = std::min<size_t>(len, out.size());
    const uint64_t off = rng() % ((kFile - len) / align + 1) * align;
    FillRandom(out.data(), len, rng());
    auto w = e->Write(f, out.data(), len, off);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE(w->Wait().ok());
    std::memset(in.data(), 0, len);
    auto r = e->Read(f, in.data(), len, off);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->Wait().ok()) << r->Wait().ToString();
    ASSERT_EQ(std::memcmp(out.data(), in.data(), len), 0)
        << "len " << len << " offset " << off;
  }
}

TEST_P(AioEngineTest, SpreadsOneLargeRequestOverRings) {
  IoOptions o;
  o.block_size = 32 << 10;
  o.queue_depth = 2;
  o.rings = 4;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 4 << 20);
  ASSERT_NE(f, nullptr);
  ExpectRoundTrip(*e, f, 4 << 20, 7);
  const IoStats s = e->stats();
  EXPECT_EQ(s.transfers, 2u * (4 << 20) / (32 << 10));
}

TEST_P(AioEngineTest, ConcurrentSubmittersKeepTheirData) {
  IoOptions o;
  o.block_size = 16 << 10;
  o.queue_depth = 8;
  o.rings = 2;
  OPEN_OR_SKIP(e, o);
  constexpr int kThreads = 6;
  constexpr size_t kRegion = 1 << 20;
  File* f = OpenFile(*e, kThreads * kRegion);
  ASSERT_NE(f, nullptr);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto out = PinnedBuffer::Allocate(kRegion, PinOptions{false});
      auto in = PinnedBuffer::Allocate(kRegion, PinOptions{false});
      std::mt19937_64 rng(t);
      for (int round = 0; round < 20; ++round) {
        const size_t len = (1 + rng() % 64) * 16384;
        const uint64_t off =
            t * kRegion + rng() % (kRegion / 4096 - len / 4096 + 1) * 4096;
        FillRandom(out->data(), len, rng());
        auto w = e->Write(f, out->data(), len, off);
        if (!w.ok() || !w->Wait().ok()) ++failures;
        auto r = e->Read(f, in->data(), len, off);
        if (!r.ok() || !r->Wait().ok()) ++failures;
        if (std::memcmp(out->data(), in->data(), len) != 0) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// Holds every transfer below offset `limit` at submission until Open().
class GateInjector : public FaultInjector {
 public:
  explicit GateInjector(uint64_t limit = UINT64_MAX) : limit_(limit) {}
  uint32_t SubmitLength(bool, uint64_t offset, uint32_t len) override {
    if (offset < limit_) open_.wait(false);
    return len;
  }
  void Open() {
    open_.store(true);
    open_.notify_all();
  }

 private:
  uint64_t limit_;
  std::atomic<bool> open_{false};
};

TEST_P(AioEngineTest, WaitOnOneDoesNotWaitForAll) {
  GateInjector gate(8 << 20);  // holds the big write, not the small one
  IoOptions o;
  o.block_size = 64 << 10;
  o.queue_depth = 4;
  o.rings = 2;
  o.fault_injector = &gate;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 9 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer small = Buffer(64 << 10);
  PinnedBuffer big = Buffer(8 << 20);
  FillRandom(small.data(), small.size(), 1);
  FillRandom(big.data(), big.size(), 2);
  // The small write goes first (ring 0); the big one waits at the gate.
  auto first = e->Submit({f, small.data(), small.size(), 8 << 20, true, 0, {}});
  auto second = e->Submit({f, big.data(), big.size(), 0, true, 1, {}});
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(first->Wait().ok());
  EXPECT_TRUE(first->Poll());
  EXPECT_FALSE(second->Poll());
  // The handle's own outcome is repeatable and independent of the other.
  EXPECT_TRUE(first->Wait().ok());
  gate.Open();
  EXPECT_TRUE(e->WaitAll().ok());
  EXPECT_TRUE(second->Poll());
  EXPECT_TRUE(second->Wait().ok());
  PinnedBuffer in = Buffer(9 << 20);
  ASSERT_TRUE(e->Read(f, in.data(), in.size(), 0)->Wait().ok());
  EXPECT_EQ(std::memcmp(big.data(), in.data(), big.size()), 0);
  EXPECT_EQ(
      std::memcmp(small.data(), static_cast<char*>(in.data()) + big.size(),
                  small.size()),
      0);
}

TEST_P(AioEngineTest, WaitAllCoversEverySubmittedRequest) {
  IoOptions o;
  o.block_size = 16 << 10;
  o.queue_depth = 4;
  o.rings = 2;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 4 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(4 << 20);
  FillRandom(buf.data(), buf.size(), 3);
  std::vector<Handle> handles;
  for (size_t off = 0; off < buf.size(); off += 64 << 10) {
    auto h = e->Write(f, static_cast<char*>(buf.data()) + off, 64 << 10, off);
    ASSERT_TRUE(h.ok());
    handles.push_back(std::move(*h));
  }
  ASSERT_TRUE(e->WaitAll().ok());
  for (const Handle& h : handles) EXPECT_TRUE(h.Poll());
}

TEST_P(AioEngineTest, CallbacksRunOnceAndMaySubmitMore) {
  IoOptions o;
  o.block_size = 64 << 10;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 4 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(64 << 10);
  FillRandom(buf.data(), buf.size(), 4);
  std::atomic<int> calls{0};
  std::atomic<int> chained{0};
  std::function<void(const Status&)> next;
  next = [&](const Status& st) {
    EXPECT_TRUE(st.ok()) << st.ToString();
    const int n = ++calls;
    if (n < 16) {
      auto h = e->Write(f, buf.data(), buf.size(), n * buf.size(), next);
      EXPECT_TRUE(h.ok());
      ++chained;
    }
  };
  ASSERT_TRUE(e->Write(f, buf.data(), buf.size(), 0, next).ok());
  ASSERT_TRUE(e->WaitAll().ok());
  EXPECT_EQ(calls.load(), 16);
  EXPECT_EQ(chained.load(), 15);
}

// Note [Submission batches]: a ring hands the kernel at most submit_batch
// pieces per io_uring_enter; 0 hands it all that are ready at once.
TEST_P(AioEngineTest, SubmitsAtMostSubmitBatchPiecesPerEnter) {
  for (const auto& [batch, enters] : std::vector<std::pair<int, uint64_t>>{
           {1, 32}, {2, 16}, {8, 4}, {0, 1}}) {
    IoOptions o;
    o.block_size = 64 << 10;
    o.queue_depth = 32;
    o.submit_batch = batch;
    OPEN_OR_SKIP(e, o);
    if (e->info().backend != Backend::kIoUring) {
      GTEST_SKIP() << "batching is an io_uring property (running "
                   << BackendName(e->info().backend) << ")";
    }
    EXPECT_EQ(e->info().submit_batch, batch);
    File* f = OpenFile(*e, 2 << 20);
    ASSERT_NE(f, nullptr);
    PinnedBuffer buf = Buffer(2 << 20);
    ASSERT_TRUE(e->Write(f, buf.data(), buf.size(), 0)->Wait().ok());
    const IoStats s = e->stats();
    EXPECT_EQ(s.transfers, 32u);
    // The 32 pieces of one request reach the ring together.
    EXPECT_EQ(s.batches, enters) << "submit_batch " << batch;
    EXPECT_EQ(s.fixed_file, e->info().fixed_files ? 32u : 0u);
  }
}

TEST_P(AioEngineTest, UsesRegisteredBuffersWhenGiven) {
  OPEN_OR_SKIP(e);
  File* f = OpenFile(*e, 4 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(2 << 20);
  FillRandom(buf.data(), buf.size(), 5);
  ASSERT_TRUE(e->RegisterBuffer(buf.data(), buf.size()).ok());
  EXPECT_FALSE(e->RegisterBuffer(static_cast<char*>(buf.data()) + 4096, 4096)
                   .ok());  // overlaps
  ASSERT_TRUE(e->Write(f, buf.data(), buf.size(), 0)->Wait().ok());
  PinnedBuffer in = Buffer(2 << 20);
  ASSERT_TRUE(e->Read(f, in.data(), in.size(), 0)->Wait().ok());
  EXPECT_EQ(std::memcmp(buf.data(), in.data(), in.size()), 0);
  const IoStats s = e->stats();
  if (e->info().fixed_buffers) {
    EXPECT_EQ(s.fixed_buffer, 2u);  // the write; the read buffer is not
  } else {
    EXPECT_EQ(s.fixed_buffer, 0u);
  }
  EXPECT_TRUE(e->UnregisterBuffer(buf.data()).ok());
  EXPECT_FALSE(e->UnregisterBuffer(buf.data()).ok());
}

TEST_P(AioEngineTest, RejectsMisalignedRequestsNamingTheAlignment) {
  OPEN_OR_SKIP(e);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  if (!f->direct()) GTEST_SKIP() << "scratch file system refused O_DIRECT";
  PinnedBuffer buf = Buffer(1 << 20);
  char* p = static_cast<char*>(buf.data());
  const std::string align = std::to_string(f->offset_align());
  for (auto r : {e->Read(f, p + 1, 4096, 0), e->Read(f, p, 4096, 1),
                 e->Read(f, p, 4097, 0), e->Write(f, p, 100, 0)}) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("misaligned"), std::string::npos);
    EXPECT_NE(r.status().message().find(align), std::string::npos)
        << r.status().message();
  }
}

TEST_P(AioEngineTest, RejectsReadsPastTheEndAndEmptyRequests) {
  OPEN_OR_SKIP(e);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(1 << 20);
  auto past = e->Read(f, buf.data(), 8192, (1 << 20) - 4096);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("past the end"), std::string::npos);
  auto empty = e->Read(f, buf.data(), 0, 0);
  EXPECT_FALSE(empty.ok());
}

TEST_P(AioEngineTest, CompletesShortTransfers) {
  testutil::ShortIoInjector injector(4096);
  IoOptions o;
  o.block_size = 64 << 10;
  o.fault_injector = &injector;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  ExpectRoundTrip(*e, f, 1 << 20, 6);
  EXPECT_GT(injector.cuts.load(), 0u);
  EXPECT_EQ(e->stats().resubmits,
            2u * ((1 << 20) / 4096 - (1 << 20) / (64 << 10)));
}

// Answers the first `n` transfers with EINTR and EAGAIN, alternately.
class RetryInjector : public FaultInjector {
 public:
  explicit RetryInjector(int n) : left_(n) {}
  int CompletionResult(bool, uint64_t, uint32_t, int result) override {
    const int left = left_.fetch_sub(1);
    if (left <= 0) return result;
    ++injected;
    return left % 2 ? -EINTR : -EAGAIN;
  }
  std::atomic<int> injected{0};

 private:
  std::atomic<int> left_;
};

TEST_P(AioEngineTest, RetriesEagainAndEintr) {
  RetryInjector retry(6);
  IoOptions o;
  o.fault_injector = &retry;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  ExpectRoundTrip(*e, f, 1 << 20, 11);
  EXPECT_EQ(retry.injected.load(), 6);
  EXPECT_EQ(e->stats().resubmits, 6u);
}

TEST_P(AioEngineTest, GivesUpOnEndlessEagain) {
  // One 4 KiB block: each of the 10001 tries really writes it.
  testutil::ErrnoInjector again(EAGAIN, 0, 4096);  // forever
  IoOptions o;
  o.fault_injector = &again;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 4096);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(4096);
  const Status st = e->Write(f, buf.data(), buf.size(), 0)->Wait();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("EAGAIN"), std::string::npos) << st.message();
  EXPECT_EQ(again.injected.load(), 10001u);  // Note [EAGAIN budget]
}

TEST_P(AioEngineTest, ReportsEioWithFileOffsetAndLength) {
  testutil::ErrnoInjector eio(EIO, 3 << 20, 4096);
  IoOptions o;
  o.block_size = 1 << 20;
  o.fault_injector = &eio;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 8 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(8 << 20);
  PinnedBuffer other = Buffer(1 << 20);
  auto bad = e->Read(f, buf.data(), 8 << 20, 0);
  auto good = e->Read(f, other.data(), 1 << 20, 0);
  ASSERT_TRUE(bad.ok() && good.ok());
  const Status st = bad->Wait();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("EIO"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(f->path()), std::string::npos);
  EXPECT_NE(st.message().find("offset 3145728"), std::string::npos);
  EXPECT_NE(st.message().find("1048576 bytes"), std::string::npos);
  EXPECT_TRUE(good->Wait().ok());
  // WaitAll reports the failure once.
  EXPECT_FALSE(e->WaitAll().ok());
  EXPECT_TRUE(e->WaitAll().ok());
}

TEST_P(AioEngineTest, ReportsEnospcFromWrites) {
  testutil::ErrnoInjector full(ENOSPC, 0, 1 << 20, -1, /*writes_only=*/true);
  IoOptions o;
  o.fault_injector = &full;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(1 << 20);
  const Status st = e->Write(f, buf.data(), buf.size(), 0)->Wait();
  EXPECT_EQ(st.code(), StatusCode::kNoSpace) << st.ToString();
  EXPECT_NE(st.message().find("ENOSPC"), std::string::npos);
  EXPECT_TRUE(e->Read(f, buf.data(), buf.size(), 0)->Wait().ok());
}

TEST_P(AioEngineTest, CloseFileRefusesWhileRequestsAreInFlight) {
  GateInjector gate;
  IoOptions o;
  o.fault_injector = &gate;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(1 << 20);
  auto h = e->Write(f, buf.data(), buf.size(), 0);
  ASSERT_TRUE(h.ok());
  const Status busy = e->CloseFile(f);
  EXPECT_EQ(busy.code(), StatusCode::kFailedPrecondition) << busy.ToString();
  EXPECT_FALSE(h->Poll());
  gate.Open();
  ASSERT_TRUE(h->Wait().ok());
  EXPECT_TRUE(e->CloseFile(f).ok());
  EXPECT_EQ(e->CloseFile(f).code(), StatusCode::kInvalidArgument);
}

TEST_P(AioEngineTest, CloseFileWaitsForCallbacksThatResubmit) {
  IoOptions o;
  o.block_size = 64 << 10;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(64 << 10);
  std::atomic<int> left{300};
  std::atomic<bool> chain_done{false};
  std::function<void(const Status&)> next = [&](const Status& st) {
    EXPECT_TRUE(st.ok());
    if (--left > 0) {
      EXPECT_TRUE(e->Read(f, buf.data(), buf.size(), 0, next).ok());
    } else {
      chain_done = true;
    }
  };
  ASSERT_TRUE(e->Read(f, buf.data(), buf.size(), 0, next).ok());
  // The chain's file is never closed under it: CloseFile succeeds only
  // after the last callback has returned.
  Status st;
  do {
    st = e->CloseFile(f);
  } while (!st.ok());
  EXPECT_TRUE(chain_done.load());
  EXPECT_TRUE(e->WaitAll().ok());
}

TEST_P(AioEngineTest, UnregisterRefusesWhileTheBufferIsInUse) {
  GateInjector gate;
  IoOptions o;
  o.fault_injector = &gate;
  OPEN_OR_SKIP(e, o);
  if (!e->info().fixed_buffers) GTEST_SKIP() << "no fixed buffers here";
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(1 << 20);
  ASSERT_TRUE(e->RegisterBuffer(buf.data(), buf.size()).ok());
  auto h = e->Read(f, buf.data(), buf.size(), 0);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(e->UnregisterBuffer(buf.data()).code(),
            StatusCode::kFailedPrecondition);
  gate.Open();
  EXPECT_TRUE(h->Wait().ok()) << h->Wait().ToString();
  EXPECT_TRUE(e->UnregisterBuffer(buf.data()).ok());
}

// Registration runs on the ring threads while their callbacks submit (and
// so look buffers up): neither may wait for the other.
TEST_P(AioEngineTest, RegisteringWhileCallbacksSubmitDoesNotDeadlock) {
  IoOptions o;
  o.block_size = 64 << 10;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer io = Buffer(64 << 10);
  PinnedBuffer reg = Buffer(1 << 20);
  std::atomic<bool> stop{false};
  std::function<void(const Status&)> next = [&](const Status&) {
    if (!stop) {
      EXPECT_TRUE(e->Read(f, io.data(), io.size(), 0, next).ok());
    }
  };
  ASSERT_TRUE(e->Read(f, io.data(), io.size(), 0, next).ok());
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(e->RegisterBuffer(reg.data(), reg.size()).ok());
    ASSERT_TRUE(e->UnregisterBuffer(reg.data()).ok());
  }
  stop = true;
  EXPECT_TRUE(e->WaitAll().ok());
}

TEST_P(AioEngineTest, DeliversWhatTheFaultInjectorCorrupts) {
  // The engine passes bytes through untouched; a flipped bit must show up.
  testutil::BitFlipInjector flip(12345);
  IoOptions o;
  o.fault_injector = &flip;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer out = Buffer(1 << 20);
  PinnedBuffer in = Buffer(1 << 20);
  FillRandom(out.data(), out.size(), 8);
  ASSERT_TRUE(e->Write(f, out.data(), out.size(), 0)->Wait().ok());
  ASSERT_TRUE(e->Read(f, in.data(), in.size(), 0)->Wait().ok());
  EXPECT_TRUE(flip.flipped.load());
  EXPECT_EQ(static_cast<char*>(out.data())[12345] ^ 0x10,
            static_cast<char*>(in.data())[12345]);
}

INSTANTIATE_TEST_SUITE_P(Backends, AioEngineTest,
                         ::testing::Values(Backend::kIoUring,
                                           Backend::kThreads),
                         aio_test::BackendSuffix);

}  // namespace
}  // namespace strata::aio
