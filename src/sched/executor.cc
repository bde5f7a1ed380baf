#include "src/sched/executor.h"

#include "common/interrupt.h"
#include "common/thread_name.h"

namespace strata::sched {

Executor::Executor(int threads) {
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this] {
      NameThisThread("strata-prefetch");
      Run();
    });
  }
}

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void Executor::Submit(uint64_t key, Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!queued_.insert(key).second) return;
    queue_.emplace_back(key, std::move(job));
  }
  work_.notify_one();
}

Status Executor::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  STRATA_RETURN_IF_ERROR(internal::WaitUntil(
      idle_, lock, [this] { return queue_.empty() && running_ == 0; },
      "the prefetches and write-behind"));
  return std::exchange(first_error_, Status());
}

void Executor::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto [key, job] = std::move(queue_.front());
    queue_.pop_front();
    queued_.erase(key);
    ++running_;
    lock.unlock();
    Status status = job();
    lock.lock();
    --running_;
    if (!status.ok() && first_error_.ok()) first_error_ = std::move(status);
    if (queue_.empty() && running_ == 0) idle_.notify_all();
  }
}

}  // namespace strata::sched
