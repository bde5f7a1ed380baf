// Groups whose optimizer update is queued but has not landed yet, so that
// no one reads their old bytes meanwhile (Note [Steps under the next
// forward] in src/optim/pipeline.h). The optimizer marks a group when it
// queues the group's step and settles it when the step is done; the
// engine's demand fetches, Save and Load wait for it. The optimizer's own
// fetches (straight to the residency manager) do not.
//
// Example:
// ```c++
//  PendingUpdates pending;
//  pending.Mark(3);                    // the optimizer queued group 3
//  // on the worker: ... step group 3 ...
//  pending.Settle(3, status);          // landed, or failed with `status`
//  // on the training thread, before reading group 3 (Engine::Fetch):
//  STRATA_RETURN_IF_ERROR(pending.Wait(3));
// ```
//
// A failed update stays failed: every later Wait for the group returns its
// error (the group's bytes are not the model the caller expects), until
// ClearFailed(), which the optimizer calls once it has reported the error.
//
// Thread safety: every method may be called from any thread.
#ifndef STRATA_SRC_STORE_PENDING_UPDATES_H_
#define STRATA_SRC_STORE_PENDING_UPDATES_H_

#include <chrono>
#include <condition_variable>
#include <iterator>
#include <map>
#include <mutex>

#include "common/interrupt.h"
#include "strata/status.h"

namespace strata::store {

class PendingUpdates {
 public:
  // The update of `group` is queued: Wait(group) blocks until Settle.
  void Mark(int group);
  // The update of `group` landed (`outcome` ok) or failed.
  void Settle(int group, const Status& outcome);
  // What Wait returns for a group whose update failed: the error, or
  // nothing (for a fetch that overwrites every byte: a checkpoint's Load).
  enum class Failed { kReport, kIgnore };
  // Blocks while the update of `group` is pending; its failure, if any
  // (kCancelled when the caller interrupts the wait).
  Status Wait(int group, Failed failed = Failed::kReport);
  // Wait for every group.
  Status WaitAll();
  // Forgets failed updates (their error was reported).
  void ClearFailed();
  // Seconds Wait() and WaitAll() have blocked, in all.
  double waited_seconds() const;

 private:
  // Guarded by mu_: a group is absent (nothing pending), pending (ok
  // status, counted), or failed (its error).
  using Lock = std::unique_lock<std::mutex>;
  struct Entry {
    int pending = 0;
    Status failed;
  };
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<int, Entry> entries_;
  double waited_ = 0;

  // Blocks on changed_ until `done` holds, counting the time in waited_;
  // kCancelled when the caller interrupts it (Note [Interruptible waits]).
  template <typename Done>
  Status Block(Lock& lk, Done done) {
    if (done()) return Status();
    const auto start = std::chrono::steady_clock::now();
    Status status =
        internal::WaitUntil(changed_, lk, done, "an optimizer update to land");
    waited_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    return status;
  }
};

}  // namespace strata::store

#endif  // STRATA_SRC_STORE_PENDING_UPDATES_H_
