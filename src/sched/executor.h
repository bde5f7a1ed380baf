// The executor: runs the plan's prefetches and the caller's explicit
// prefetches on a small pool of transfer threads, in submission order.
// Each job is one group's move to one tier; the residency manager does the
// work, including the write-behind of whatever the move evicts, so a
// demand fetch that follows the plan finds its data already in place.
//
// A job whose key is already queued (not yet started) is not queued again.
// Job errors are kept: Drain() waits for the queue to empty and returns the
// first error since the previous Drain().
//
// Thread safety: every method may be called from any thread.
#ifndef STRATA_SRC_SCHED_EXECUTOR_H_
#define STRATA_SRC_SCHED_EXECUTOR_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "strata/status.h"

namespace strata::sched {

class Executor {
 public:
  using Job = std::function<Status()>;
  explicit Executor(int threads);
  // Finishes the queued jobs, then joins the threads.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void Submit(uint64_t key, Job job);
  Status Drain();

 private:
  void Run();

  // Guarded by mu_.
  std::mutex mu_;
  std::condition_variable work_;  // a job was queued, or stop_
  std::condition_variable idle_;  // running_ or queue_ shrank
  std::deque<std::pair<uint64_t, Job>> queue_;
  std::set<uint64_t> queued_;  // keys of queue_
  int running_ = 0;
  bool stop_ = false;
  Status first_error_;

  // Fixed after construction.
  std::vector<std::thread> threads_;
};

}  // namespace strata::sched

#endif  // STRATA_SRC_SCHED_EXECUTOR_H_
