#include "tests/testutil/watchdog.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace strata::testutil {

Watchdog::Watchdog(int threads, std::chrono::seconds patience)
    : patience_(patience), watcher_() {
  for (int t = 0; t < threads; ++t) logs_.push_back(std::make_unique<Log>());
  watcher_ = std::thread([this] { Watch(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  watcher_.join();
}

void Watchdog::Note(int t, std::string what) {
  {
    Log& log = *logs_.at(t);
    std::lock_guard<std::mutex> lock(log.mu);
    log.last.push_back(std::move(what));
    if (log.last.size() > kKept) log.last.pop_front();
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++noted_;
}

uint64_t Watchdog::progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return noted_;
}

void Watchdog::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t seen = noted_;
  auto since = std::chrono::steady_clock::now();
  while (!stop_) {
    stop_cv_.wait_for(lock, std::chrono::milliseconds(200));
    const auto now = std::chrono::steady_clock::now();
    if (noted_ != seen) {
      seen = noted_;
      since = now;
    } else if (!stop_ && now - since >= patience_) {
      lock.unlock();
      Bark(patience_);
    }
  }
}

void Watchdog::Bark(std::chrono::seconds quiet) {
  std::fprintf(stderr,
               "FAILED: watchdog: no operation started for %lld s; a wait "
               "hangs. Each thread's last operations, oldest first (the "
               "last one is where it hangs):\n",
               static_cast<long long>(quiet.count()));
  for (size_t t = 0; t < logs_.size(); ++t) {
    std::lock_guard<std::mutex> lock(logs_[t]->mu);
    std::fprintf(stderr, "  thread %zu:\n", t);
    for (const std::string& what : logs_[t]->last) {
      std::fprintf(stderr, "    %s\n", what.c_str());
    }
  }
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace strata::testutil
