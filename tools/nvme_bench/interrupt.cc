#include "tools/nvme_bench/interrupt.h"

#include <unistd.h>

#include <csignal>

namespace strata::bench {
namespace {

std::atomic<bool> g_interrupted{false};
std::atomic<int> g_signal{0};
static_assert(std::atomic<bool>::is_always_lock_free &&
              std::atomic<int>::is_always_lock_free);

void OnSignal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
  g_interrupted.store(true);
  // A second Ctrl-C ends the process at once (sigaction and write are
  // async-signal-safe), for a stop that takes too long.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  constexpr char kSay[] =
      "\nstrata-nvme-bench: stopping; the same signal again quits at once, "
      "leaving the data file\n";
  ssize_t unused = write(STDERR_FILENO, kSay, sizeof(kSay) - 1);
  (void)unused;
}

}  // namespace

const std::atomic<bool>* InstallInterruptHandler() {
  struct sigaction action {};
  action.sa_handler = OnSignal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGINT, SIGTERM}) sigaction(sig, &action, nullptr);
  return &g_interrupted;
}

int InterruptSignal() { return g_signal.load(); }

}  // namespace strata::bench
