#include "tools/nvme_bench/interrupt.h"

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
