// strata_aio's asynchronous fdatasync, Engine::Sync: it completes and calls
// its callback once, counts as an outstanding request for its Handle,
// WaitAll(), ~Engine() and CloseFile(), may be submitted from a callback,
// reports a failure with the file's name, retries EINTR, and shows in
// IoStats. Every test runs on both backends, and again under
// STRATA_AIO_BACKEND=threads via CTest. No test depends on timing: a sync
// stays in flight because a fault injector holds it until the test lets it
// go.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <thread>

#include "strata/aio.h"
#include "tests/aio/aio_test_util.h"
#include "tests/testutil/testutil.h"

namespace strata::aio {
namespace {

// Counts the syncs that complete and the transfer hooks called; can hold
// every sync at its completion until Release(), and fail the first `fails`
// syncs (every one when negative) with -err.
class SyncInjector : public FaultInjector {
 public:
  explicit SyncInjector(bool hold = false, int err = 0, int fails = -1)
      : hold_(hold), err_(err), fails_(fails) {}

  uint32_t SubmitLength(bool, uint64_t, uint32_t len) override {
    ++transfer_hooks;
    return len;
  }
  int CompletionResult(bool, uint64_t, uint32_t, int result) override {
    ++transfer_hooks;
    return result;
  }
  int SyncResult(int result) override {
    ++syncs;
    if (hold_) {
      entered_.store(true);
      entered_.notify_all();
      open_.wait(false);
    }
    if (err_ == 0 || fails_.load() == 0) return result;
    if (fails_.load() > 0) --fails_;
    return -err_;
  }

  // Blocks until a held sync has completed in the kernel.
  void WaitEntered() { entered_.wait(false); }
  void Release() {
    open_.store(true);
    open_.notify_all();
  }

  std::atomic<int> syncs{0};
  std::atomic<int> transfer_hooks{0};

 private:
  const bool hold_;
  const int err_;
  std::atomic<int> fails_;
  std::atomic<bool> entered_{false};
  std::atomic<bool> open_{false};
};

class AioSyncTest : public aio_test::BackendTest {
 protected:
  static IoOptions With(FaultInjector* injector) {
    IoOptions o;
    o.fault_injector = injector;
    return o;
  }
};

TEST_P(AioSyncTest, CompletesOkAndCallsItsCallbackOnce) {
  SyncInjector count;
  IoOptions o;
  o.rings = 2;
  o.fault_injector = &count;
  OPEN_OR_SKIP(e, o);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(64 << 10);
  testutil::FillRandom(buf.data(), buf.size(), 5);
  ASSERT_TRUE(e->Write(f, buf.data(), buf.size(), 0)->Wait().ok());
  std::atomic<int> calls{0};
  std::atomic<int> failed{0};
  for (int ring : {-1, 0, 1, 5}) {  // 5 wraps, as Request::ring does
    auto h = e->Sync(
        f,
        [&](const Status& st) {
          ++calls;
          if (!st.ok()) ++failed;
        },
        ring);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_TRUE(h->Wait().ok()) << "ring " << ring;
    EXPECT_TRUE(h->Poll());
  }
  EXPECT_TRUE(e->WaitAll().ok());
  EXPECT_EQ(calls.load(), 4);
  EXPECT_EQ(failed.load(), 0);
  const IoStats s = e->stats();
  EXPECT_EQ(s.syncs, 4u);
  EXPECT_EQ(s.transfers, 1u);  // the write; a sync is no transfer
  EXPECT_EQ(count.syncs.load(), 4);
  EXPECT_EQ(count.transfer_hooks.load(), 2);  // the write's two hooks only
}

TEST_P(AioSyncTest, WaitAllAndTheEngineWaitForASync) {
  SyncInjector held(/*hold=*/true);
  OPEN_OR_SKIP(e, With(&held));
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  std::atomic<int> calls{0};
  ASSERT_TRUE(e->Sync(f, [&](const Status&) { ++calls; }).ok());
  std::thread opener([&] {
    held.WaitEntered();
    held.Release();
  });
  EXPECT_TRUE(e->WaitAll().ok());
  EXPECT_EQ(calls.load(), 1);  // WaitAll() returned after the callback
  opener.join();
  ASSERT_TRUE(e->Sync(f, [&](const Status&) { ++calls; }).ok());
  e.reset();  // ~Engine() waits for the sync still in flight
  EXPECT_EQ(calls.load(), 2);
}

TEST_P(AioSyncTest, CloseFileRefusesWhileASyncIsInFlight) {
  SyncInjector held(/*hold=*/true);
  OPEN_OR_SKIP(e, With(&held));
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  const std::string path = f->path();
  auto h = e->Sync(f);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  held.WaitEntered();
  EXPECT_FALSE(h->Poll());
  const Status refused = e->CloseFile(f);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find(path), std::string::npos)
      << refused.ToString();
  held.Release();
  EXPECT_TRUE(h->Wait().ok());
  EXPECT_TRUE(h->Poll());
  EXPECT_TRUE(e->CloseFile(f).ok());
}

TEST_P(AioSyncTest, ACallbackMaySubmitASync) {
  OPEN_OR_SKIP(e);
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  PinnedBuffer buf = Buffer(64 << 10);
  std::atomic<int> synced{0};
  std::atomic<int> failed{0};
  auto on_sync = [&](const Status& st) {
    if (!st.ok()) ++failed;
    ++synced;
  };
  auto w = e->Write(f, buf.data(), buf.size(), 0, [&](const Status& st) {
    if (!st.ok()) ++failed;
    if (!e->Sync(f, on_sync).ok()) ++failed;
  });
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  // The write's callback submitted the sync before the write counted as
  // done, so WaitAll() also waits for the sync.
  EXPECT_TRUE(e->WaitAll().ok());
  EXPECT_EQ(synced.load(), 1);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(e->stats().syncs, 1u);
}

TEST_P(AioSyncTest, AFailedSyncNamesTheFileAndItsErrno) {
  SyncInjector eio(/*hold=*/false, EIO);
  OPEN_OR_SKIP(e, With(&eio));
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  std::atomic<int> calls{0};
  Status seen;
  auto h = e->Sync(f, [&](const Status& st) {
    seen = st;
    ++calls;
  });
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  const Status st = h->Wait();
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("fdatasync of '" + f->path() + "' failed"),
            std::string::npos)
      << st.ToString();
  EXPECT_NE(st.message().find("EIO"), std::string::npos) << st.ToString();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(seen.ToString(), st.ToString());
  EXPECT_EQ(e->WaitAll().code(), StatusCode::kIoError);
  EXPECT_TRUE(e->WaitAll().ok());  // reported once
  EXPECT_TRUE(e->CloseFile(f).ok());
}

TEST_P(AioSyncTest, RetriesASyncInterrupted) {
  SyncInjector eintr(/*hold=*/false, EINTR, /*fails=*/2);
  OPEN_OR_SKIP(e, With(&eintr));
  File* f = OpenFile(*e, 1 << 20);
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(e->Sync(f)->Wait().ok());
  const IoStats s = e->stats();
  EXPECT_EQ(s.syncs, 3u);  // handed to the kernel three times
  EXPECT_EQ(s.resubmits, 2u);
  EXPECT_EQ(eintr.syncs.load(), 3);
}

TEST_P(AioSyncTest, SyncsAReadOnlyFileAndRefusesNoFile) {
  OPEN_OR_SKIP(e);
  ASSERT_NE(OpenFile(*e, 1 << 20, "ro"), nullptr);
  File* ro = OpenFile(*e, 0, "ro", /*read_only=*/true);
  ASSERT_NE(ro, nullptr);
  ASSERT_TRUE(ro->read_only());
  EXPECT_TRUE(e->Sync(ro)->Wait().ok());
  EXPECT_EQ(e->Sync(nullptr).status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Backends, AioSyncTest,
                         ::testing::Values(Backend::kIoUring,
                                           Backend::kThreads),
                         aio_test::BackendSuffix);

}  // namespace
}  // namespace strata::aio
