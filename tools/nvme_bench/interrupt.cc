#include "tools/nvme_bench/interrupt.h"

#include <unistd.h>

#include <csignal>

namespace strata::bench {
namespace {

std::atomic<bool> g_interrupted{false};
std::atomic<int> g_signal{0};
static_assert(std::atomic<bool>::is_always_lock_free &&
              std::atomic<int>::is_always_lock_free);

template <size_t N>
void Say(const char (&text)[N]) {
  ssize_t unused = write(STDERR_FILENO, text, N - 1);
  (void)unused;
}

void OnSignal(int sig) {
  int none = 0;
  const bool first = g_signal.compare_exchange_strong(none, sig);
  g_interrupted.store(true);
  if (sig == SIGPIPE) {
    constexpr char kSay[] =
        "\nstrata-nvme-bench: its output was closed; stopping\n";
    if (first) Say(kSay);
    return;
  }
  // A second Ctrl-C ends the process at once (sigaction and write are
  // async-signal-safe), for a stop that takes too long.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  constexpr char kSay[] =
      "\nstrata-nvme-bench: stopping; the same signal again quits at once, "
      "leaving the data file\n";
  Say(kSay);
}

}  // namespace

const std::atomic<bool>* InstallInterruptHandler() {
  struct sigaction action {};
  action.sa_handler = OnSignal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGINT, SIGTERM}) sigaction(sig, &action, nullptr);
  // nohup ignores SIGHUP, and that choice stands; SIGPIPE likewise.
  for (int sig : {SIGHUP, SIGPIPE}) {
    struct sigaction old {};
    sigaction(sig, nullptr, &old);
    if (old.sa_handler != SIG_IGN) sigaction(sig, &action, nullptr);
  }
  return &g_interrupted;
}

int InterruptSignal() { return g_signal.load(); }

}  // namespace strata::bench
