// --fsync N for one thread of a job: after every N of its writes complete,
// an fdatasync of each of the job's files (one sync point, whatever the
// number of files: Note [Striping] in workload.h), and no further write of
// the thread is issued until it returns (fio's fsync=N).
//
// Note [Blocking fsync]: the aio engine has no asynchronous sync request
// and its completion callbacks must not block, so a gate owns one thread
// that waits for the sync to fall due, calls File::Sync() and then hands
// back the slots it parked meanwhile. The sync's time is inside the run,
// plus a thread wake-up (tens of microseconds) that fio's io_uring fsync
// does not pay. Only jobs with --fsync have gates.
//
// Thread safety: Admit() and Completed() may be called from any thread.
#ifndef STRATA_TOOLS_NVME_BENCH_FSYNC_GATE_H_
#define STRATA_TOOLS_NVME_BENCH_FSYNC_GATE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "strata/aio.h"
#include "strata/status.h"

namespace strata::bench {

class FsyncGate {
 public:
  enum class Admission { kGo, kParked, kDone };

  // Syncs `files` after every `every` (>= 1) writes, of at most `limit`
  // writes in all. `resume` gets every parked slot back, on the gate's
  // thread, once the sync it waited for returned; `fail` gets a failed
  // sync's status first.
  FsyncGate(std::vector<aio::File*> files, uint64_t every, uint64_t limit,
            std::function<void(void* slot)> resume,
            std::function<void(const Status&)> fail);
  // Joins the thread; every write admitted must have completed.
  ~FsyncGate();
  FsyncGate(const FsyncGate&) = delete;
  FsyncGate& operator=(const FsyncGate&) = delete;

  // Before a write is issued for `slot`: kGo counts it; kParked keeps the
  // slot until the next sync returns; kDone: all `limit` writes are issued.
  Admission Admit(void* slot);
  // After each admitted write of `slot` completes, whether or not it
  // succeeded (or failed to submit). True when it made a sync due: the gate
  // then holds the slot, as Admit's kParked.
  bool Completed(void* slot);
  uint64_t syncs() const;

 private:
  void Loop();

  const std::vector<aio::File*> files_;
  const uint64_t every_;
  const uint64_t limit_;
  std::function<void(void*)> resume_;
  std::function<void(const Status&)> fail_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t issued_ = 0;
  uint64_t completed_ = 0;
  uint64_t syncs_ = 0;
  bool due_ = false;  // a sync is due or running
  bool stop_ = false;
  std::vector<void*> parked_;
  std::thread thread_;
};

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_FSYNC_GATE_H_
