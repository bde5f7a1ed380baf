// --fsync N for one thread of a job: after every N of its writes complete,
// an fdatasync of each of the job's files (one sync point, whatever the
// number of files: Note [Striping] in workload.h), and no further write of
// the thread is issued until they return (fio's fsync=N).
//
// Note [Fsync gate]
// The gate only counts, under a lock; it owns no thread. The job submits
// the sync itself, as an asynchronous Engine::Sync, from the completion
// callback of the write that brings the interval's last one back, and
// hands the slots the gate parked meanwhile back from the sync's own
// callback. No thread waits for a sync, so the run pays the device's sync
// time and no thread wake-up, as fio's io_uring engine (an IORING_OP_FSYNC
// once the interval has drained). The sync goes out only once every write
// of its interval is back because Engine::Sync is not ordered after writes
// still in flight.
//
// A gate is in one phase; each event answers and moves it on as this table
// says. The interval ends at the N-th write admitted after the last sync;
// `limit` caps the writes admitted in all.
//
//   phase      event                          answer          next
//   kIssuing   Admit, `limit` writes admitted kDone           kIssuing
//   kIssuing   Admit, the interval's N-th     kGo             kDraining
//   kIssuing   Admit, an earlier one          kGo             kIssuing
//   kIssuing   Completed                      false           kIssuing
//   kDraining  Admit                          kParked         kDraining
//   kDraining  Completed, not the N-th back   false           kDraining
//   kDraining  Completed, the N-th back       true (parked)   kSyncing
//   kSyncing   Admit                          kParked         kSyncing
//   kSyncing   Synced                         parked slots    kIssuing
//
// Any other event is a bug in the caller and aborts: nothing completes
// while the sync runs (the interval is all back), and only a due sync ends.
//
// Thread safety: every method may be called from any thread.
#ifndef STRATA_TOOLS_NVME_BENCH_FSYNC_GATE_H_
#define STRATA_TOOLS_NVME_BENCH_FSYNC_GATE_H_

#include <cstdint>
#include <mutex>
#include <vector>

namespace strata::bench {

class FsyncGate {
 public:
  enum class Phase { kIssuing, kDraining, kSyncing };  // Note [Fsync gate]
  enum class Admission { kGo, kParked, kDone };

  // Syncs after every `every` (>= 1) writes, of at most `limit` writes.
  FsyncGate(uint64_t every, uint64_t limit);
  FsyncGate(const FsyncGate&) = delete;
  FsyncGate& operator=(const FsyncGate&) = delete;

  // Before a write is issued for `slot`: kGo counts it; kParked keeps the
  // slot until Synced() hands it back; kDone: all `limit` writes are issued.
  Admission Admit(void* slot);
  // After each admitted write of `slot` completes, whether or not it
  // succeeded (or failed to submit). True when it made the sync due: the
  // gate then holds the slot, as Admit's kParked, and the caller submits
  // the sync.
  bool Completed(void* slot);
  // The due sync is over (done, failed, or not submitted): counts it and
  // returns every parked slot, for the caller to issue again.
  std::vector<void*> Synced();

  uint64_t syncs() const;
  Phase phase() const;

 private:
  uint64_t IntervalEnd() const { return (syncs_ + 1) * every_; }

  const uint64_t every_;
  const uint64_t limit_;
  mutable std::mutex mu_;
  Phase phase_ = Phase::kIssuing;
  uint64_t issued_ = 0;
  uint64_t completed_ = 0;
  uint64_t syncs_ = 0;
  std::vector<void*> parked_;
};

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_FSYNC_GATE_H_
