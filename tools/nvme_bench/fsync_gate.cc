#include "tools/nvme_bench/fsync_gate.h"

#include <utility>

namespace strata::bench {

FsyncGate::FsyncGate(std::vector<aio::File*> files, uint64_t every,
                     uint64_t limit, std::function<void(void* slot)> resume,
                     std::function<void(const Status&)> fail)
    : files_(std::move(files)),
      every_(every),
      limit_(limit),
      resume_(std::move(resume)),
      fail_(std::move(fail)),
      thread_([this] { Loop(); }) {}

FsyncGate::~FsyncGate() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

FsyncGate::Admission FsyncGate::Admit(void* slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!due_ && issued_ >= limit_) return Admission::kDone;
  // The writes of the current interval are all issued: wait for its sync.
  if (due_ || issued_ >= (syncs_ + 1) * every_) {
    parked_.push_back(slot);
    return Admission::kParked;
  }
  ++issued_;
  return Admission::kGo;
}

bool FsyncGate::Completed(void* slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++completed_;
    // Admit() holds issued_ at the interval's end, so completed_ reaches
    // it only once every write of the interval is back. The slot waits
    // too, so that a run never ends before its last sync returns.
    if (completed_ != (syncs_ + 1) * every_) return false;
    due_ = true;
    parked_.push_back(slot);
  }
  cv_.notify_one();
  return true;
}

uint64_t FsyncGate::syncs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return syncs_;
}

void FsyncGate::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return due_ || stop_; });
    if (!due_) return;
    lock.unlock();
    for (aio::File* file : files_) {
      const Status st = file->Sync();
      if (!st.ok()) fail_(st);
    }
    lock.lock();
    ++syncs_;
    due_ = false;
    std::vector<void*> parked = std::move(parked_);
    parked_.clear();
    lock.unlock();
    for (void* slot : parked) resume_(slot);
    lock.lock();
  }
}

}  // namespace strata::bench
