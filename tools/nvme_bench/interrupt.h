// Stopping strata-nvme-bench early: SIGINT, SIGTERM, SIGHUP (the terminal
// went away) and SIGPIPE (the reader of its output went away, as in
// `strata-nvme-bench ... | head`) set a flag that the running job, the
// verifier and a running fio poll, so that the benchmark stops early,
// reports what finished, writes its JSON, removes its file and exits with
// 128 + the first signal. A second SIGINT, SIGTERM or SIGHUP a second or
// more after the first ends the process at once (the default action),
// leaving the data file; one sooner is the same event (timeout(1) signals
// its child and then the child's process group). SIGPIPE stays caught,
// since every later write to the closed output raises it.
//
// The handler is installed with sigaction, so for SIGINT and SIGTERM it
// replaces a SIG_IGN the process inherited (a shell starts a background job
// without job control with SIGINT ignored); an inherited SIG_IGN of SIGHUP
// or SIGPIPE stays (nohup ignores SIGHUP on purpose). It only stores to
// lock-free atomics, which is async-signal-safe, and uses SA_RESTART so that no
// other system call of the process fails with EINTR on its account.
//
// Thread safety: the flag may be read from any thread.
#ifndef STRATA_TOOLS_NVME_BENCH_INTERRUPT_H_
#define STRATA_TOOLS_NVME_BENCH_INTERRUPT_H_

#include <atomic>

namespace strata::bench {

// Installs the handler for the signals above (again: idempotent) and
// returns the flag it sets.
const std::atomic<bool>* InstallInterruptHandler();

// The signal that set the flag, or 0.
int InterruptSignal();

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_INTERRUPT_H_
