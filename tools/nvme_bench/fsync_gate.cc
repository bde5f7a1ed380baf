#include "tools/nvme_bench/fsync_gate.h"

#include <utility>

#include "strata/status.h"

namespace strata::bench {

FsyncGate::FsyncGate(uint64_t every, uint64_t limit)
    : every_(every), limit_(limit) {
  STRATA_CHECK(every >= 1);
}

FsyncGate::Admission FsyncGate::Admit(void* slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (phase_ != Phase::kIssuing) {
    parked_.push_back(slot);
    return Admission::kParked;
  }
  if (issued_ >= limit_) return Admission::kDone;
  if (++issued_ == IntervalEnd()) phase_ = Phase::kDraining;
  return Admission::kGo;
}

bool FsyncGate::Completed(void* slot) {
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_CHECK(phase_ != Phase::kSyncing);
  // Admit() stops at the interval's end, so completed_ reaches it only in
  // kDraining, once every write of the interval is back. The slot waits
  // too, so that a run never ends before its last sync returns.
  if (++completed_ != IntervalEnd()) return false;
  phase_ = Phase::kSyncing;
  parked_.push_back(slot);
  return true;
}

std::vector<void*> FsyncGate::Synced() {
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_CHECK(phase_ == Phase::kSyncing);
  ++syncs_;
  phase_ = Phase::kIssuing;
  return std::exchange(parked_, {});
}

uint64_t FsyncGate::syncs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return syncs_;
}

FsyncGate::Phase FsyncGate::phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_;
}

}  // namespace strata::bench
