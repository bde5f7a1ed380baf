// A stream whose work runs late: the host-emulated device's stand-in for a
// CUDA stream on which a framework queued kernels that the GPU runs long
// after the CPU moved on (Note [Fences] in src/store/residency_holds.cc). Work
// queued here runs only when the test calls Run(), so a test can catch the
// engine reusing, filling or copying memory before the work that uses it.
//
//   testutil::FakeStream stream;
//   stream.Queue([&] { Read(view); });        // a "kernel", not run yet
//   ASSERT_TRUE(view.pin.Release(stream.fence()).ok());
//   ...                                       // the engine must not reuse it
//   stream.Run();                             // the kernel runs now
#ifndef STRATA_TESTS_TESTUTIL_FAKE_STREAM_H_
#define STRATA_TESTS_TESTUTIL_FAKE_STREAM_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <utility>

#include "strata/engine.h"

namespace strata::testutil {

class FakeStream : public HostStream {
 public:
  // The fence naming the work queued so far.
  Fence fence() { return {.stream = this}; }

  void Queue(std::function<void()> work) override {
    std::lock_guard<std::mutex> lock(mu_);
    queued_.push_back(std::move(work));
    ++marked_;
  }
  // Runs everything queued so far, in order, on the calling thread.
  void Run() {
    std::deque<std::function<void()>> work;
    {
      std::lock_guard<std::mutex> lock(mu_);
      work.swap(queued_);
    }
    for (auto& w : work) w();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ran_ += work.size();
    }
    ran_cv_.notify_all();
  }

  uint64_t Mark() override {
    std::lock_guard<std::mutex> lock(mu_);
    return marked_;
  }
  bool Done(uint64_t mark) override {
    std::lock_guard<std::mutex> lock(mu_);
    return ran_ >= mark;
  }
  void Wait(uint64_t mark) override {
    std::unique_lock<std::mutex> lock(mu_);
    ran_cv_.wait(lock, [&] { return ran_ >= mark; });
  }

 private:
  std::mutex mu_;
  std::condition_variable ran_cv_;
  std::deque<std::function<void()>> queued_;  // guarded by mu_
  uint64_t marked_ = 0;                       // guarded by mu_: work queued
  uint64_t ran_ = 0;                          // guarded by mu_: work run
};

}  // namespace strata::testutil

#endif  // STRATA_TESTS_TESTUTIL_FAKE_STREAM_H_
