// A stress test's watchdog: when no thread of the test has started an
// operation for `patience`, it prints the last operations each thread
// started and ends the process with a failure, instead of letting a hung
// wait stall CI until its time limit. A hung thread cannot be unwound, so
// the watchdog cannot fail just the test; the output names what hung.
//
//   testutil::Watchdog watchdog(threads, std::chrono::seconds(60));
//   watchdog.Note(t, "fetch g3 on device, write");  // before each operation
#ifndef STRATA_TESTS_TESTUTIL_WATCHDOG_H_
#define STRATA_TESTS_TESTUTIL_WATCHDOG_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace strata::testutil {

class Watchdog {
 public:
  Watchdog(int threads, std::chrono::seconds patience);
  ~Watchdog();  // stops watching
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Thread `t` (0 .. threads-1) starts `what`; the last few are kept.
  void Note(int t, std::string what);
  uint64_t progress() const;  // operations noted so far

 private:
  static constexpr size_t kKept = 12;
  struct Log {
    std::mutex mu;
    std::deque<std::string> last;  // guarded by mu
  };
  void Watch();
  [[noreturn]] void Bark(std::chrono::seconds quiet);

  // Fixed after construction.
  const std::chrono::seconds patience_;
  std::vector<std::unique_ptr<Log>> logs_;

  // Guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  uint64_t noted_ = 0;

  std::thread watcher_;  // last: starts once everything above exists
};

}  // namespace strata::testutil

#endif  // STRATA_TESTS_TESTUTIL_WATCHDOG_H_
