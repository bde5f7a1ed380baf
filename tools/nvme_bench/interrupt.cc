#include "tools/nvme_bench/interrupt.h"

#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <ctime>

namespace strata::bench {
namespace {

std::atomic<bool> g_interrupted{false};
std::atomic<int> g_signal{0};
std::atomic<int64_t> g_first_ns{0};
static_assert(std::atomic<bool>::is_always_lock_free &&
              std::atomic<int>::is_always_lock_free &&
              std::atomic<int64_t>::is_always_lock_free);

// Signals closer than this to the first are the same event: timeout(1)
// signals its child and then the child's process group, the child twice.
constexpr int64_t kSameEventNs = 1'000'000'000;

int64_t NowNs() {  // clock_gettime is async-signal-safe
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

template <size_t N>
void Say(const char (&text)[N]) {
  ssize_t unused = write(STDERR_FILENO, text, N - 1);
  (void)unused;
}

void OnSignal(int sig) {
  int none = 0;
  if (g_signal.compare_exchange_strong(none, sig)) {
    g_first_ns.store(NowNs());
    g_interrupted.store(true);
    if (sig == SIGPIPE) {
      Say("\nstrata-nvme-bench: its output was closed; stopping\n");
    } else {
      Say("\nstrata-nvme-bench: stopping; a second signal quits at once, "
          "leaving the data file\n");
    }
    return;
  }
  if (sig == SIGPIPE || NowNs() - g_first_ns.load() < kSameEventNs) return;
  // A second signal, for a stop that takes too long, ends the process with
  // the default action (sigaction and raise are async-signal-safe; the
  // signal is blocked until this handler returns).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);
}

}  // namespace

const std::atomic<bool>* InstallInterruptHandler() {
  struct sigaction action {};
  action.sa_handler = OnSignal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);  // one handler at a time
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) {
    sigaddset(&action.sa_mask, sig);
  }
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
