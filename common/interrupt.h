// Waits that the caller can interrupt (Ctrl-C from Python).
//
// Note [Interruptible waits]
// A wait of the engine that may last (for a write view another thread
// holds, a gradient buffer, the CPU optimizer, a queued update, the
// prefetches) blocks a thread of the caller's, and a thread blocked in C
// runs no Python signal handler: Ctrl-C did nothing until SIGKILL. So when
// the waiting thread is inside a call of the C ABI (CallerScope, which the
// ABI's Guard opens), such a wait wakes at least every kInterruptPoll and
// looks at the thread's interrupt descriptor (strata_set_interrupt_fd,
// set by the thread: a pipe that a signal handler writes to, like
// Python's wakeup fd; other threads' waits are not ended by it). When
// it is readable, the wait returns kCancelled and the call unwinds as from
// any other error, having released what it pinned; a cancelled call
// changes nothing, so the caller may make it again. The engine's own
// threads never look. Waits for a transfer in flight are interruptible
// too; the few that are not end within one transfer.
//
//   std::unique_lock<std::mutex> lk(mu_);
//   STRATA_RETURN_IF_ERROR(internal::WaitUntil(
//       changed_, lk, [&] { return done_; }, "the CPU optimizer"));
#ifndef STRATA_COMMON_INTERRUPT_H_
#define STRATA_COMMON_INTERRUPT_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "strata/status.h"

namespace strata::internal {

inline constexpr std::chrono::milliseconds kInterruptPoll{100};

// The descriptor whose readability asks the calling thread's waits to
// stop; -1: none.
void SetInterruptFd(int fd);

// While alive, the thread is a caller's inside a call of the C ABI: its
// interruptible waits look at the descriptor. Nests.
class CallerScope {
 public:
  CallerScope() { ++depth_; }
  ~CallerScope() { --depth_; }
  CallerScope(const CallerScope&) = delete;
  CallerScope& operator=(const CallerScope&) = delete;
  static bool inside() { return depth_ > 0; }

 private:
  static thread_local int depth_;
};

// One wait on `cv` (a notification, or kInterruptPoll at most); kCancelled
// naming `what` when the descriptor is readable. `lk` is held on return.
Status WaitOnce(std::condition_variable& cv, std::unique_lock<std::mutex>& lk,
                const char* what);

// Waits until `done()`, or kCancelled as WaitOnce.
template <typename Done>
Status WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lk,
                 Done done, const char* what) {
  while (!done()) STRATA_RETURN_IF_ERROR(WaitOnce(cv, lk, what));
  return Status();
}

}  // namespace strata::internal

#endif  // STRATA_COMMON_INTERRUPT_H_
