// store::PendingUpdates: readers of a group wait for its queued update, a
// failed update stays failed until cleared, and WaitAll covers every group.
#include "src/store/pending_updates.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace strata::store {
namespace {

TEST(PendingUpdatesTest, AReaderWaitsForItsGroupOnly) {
  PendingUpdates pending;
  EXPECT_TRUE(pending.Wait(0).ok());  // nothing queued: no wait
  pending.Mark(0);
  pending.Mark(0);  // two updates queued (two steps)
  pending.Mark(1);
  EXPECT_TRUE(pending.Wait(2).ok());
  std::atomic<bool> done{false};
  std::thread reader([&] {
    EXPECT_TRUE(pending.Wait(0).ok());
    done = true;
  });
  pending.Settle(0, Status());
  pending.Settle(1, Status());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(done) << "the reader went on with one of two updates pending";
  pending.Settle(0, Status());
  reader.join();
  EXPECT_TRUE(done);
  EXPECT_TRUE(pending.WaitAll().ok());
  EXPECT_GT(pending.waited_seconds(), 0.0);
}

TEST(PendingUpdatesTest, AFailedUpdateStaysFailedUntilCleared) {
  PendingUpdates pending;
  pending.Mark(3);
  pending.Mark(4);
  pending.Settle(3, Status::IoError("disk gone"));
  pending.Settle(4, Status());
  for (int i = 0; i < 2; ++i) {
    const Status s = pending.Wait(3);
    EXPECT_EQ(s.code(), StatusCode::kIoError);
    EXPECT_EQ(s.message(), "disk gone");
  }
  EXPECT_TRUE(pending.Wait(3, PendingUpdates::Failed::kIgnore).ok());
  EXPECT_TRUE(pending.Wait(4).ok());
  EXPECT_EQ(pending.WaitAll().code(), StatusCode::kIoError);
  pending.ClearFailed();
  EXPECT_TRUE(pending.Wait(3).ok());
  EXPECT_TRUE(pending.WaitAll().ok());
}

TEST(PendingUpdatesTest, WaitAllWaitsForEveryGroup) {
  PendingUpdates pending;
  for (int g = 0; g < 8; ++g) pending.Mark(g);
  std::atomic<int> settled{0};
  std::thread worker([&] {
    for (int g = 0; g < 8; ++g) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++settled;
      pending.Settle(g, Status());
    }
  });
  EXPECT_TRUE(pending.WaitAll().ok());
  EXPECT_EQ(settled.load(), 8);
  worker.join();
}

}  // namespace
}  // namespace strata::store
