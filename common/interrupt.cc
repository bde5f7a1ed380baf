#include "common/interrupt.h"

#include <poll.h>

#include <string>

namespace strata::internal {
namespace {

// Per thread: only the threads that asked look (Note [Interruptible
// waits]).
thread_local int interrupt_fd = -1;

bool Interrupted() {
  const int fd = interrupt_fd;
  if (fd < 0) return false;
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  return poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
}

}  // namespace

thread_local int CallerScope::depth_ = 0;

void SetInterruptFd(int fd) { interrupt_fd = fd; }

Status WaitOnce(std::condition_variable& cv, std::unique_lock<std::mutex>& lk,
                const char* what) {
  if (!CallerScope::inside() || interrupt_fd < 0) {
    cv.wait(lk);
    return Status();
  }
  if (Interrupted() ||
      (cv.wait_for(lk, kInterruptPoll) == std::cv_status::timeout &&
       Interrupted())) {
    return Status::Cancelled(std::string("interrupted while waiting for ") +
                             what + " (the interrupt descriptor is readable)");
  }
  return Status();
}

}  // namespace strata::internal
