#include "src/store/pending_updates.h"

namespace strata::store {

void PendingUpdates::Mark(int group) {
  std::lock_guard<std::mutex> lk(mu_);
  ++entries_[group].pending;
}

void PendingUpdates::Settle(int group, const Status& outcome) {
  std::lock_guard<std::mutex> lk(mu_);
  Entry& e = entries_[group];
  if (e.pending > 0) --e.pending;
  if (!outcome.ok() && e.failed.ok()) e.failed = outcome;
  if (e.pending == 0 && e.failed.ok()) entries_.erase(group);
  changed_.notify_all();
}

Status PendingUpdates::Wait(int group, Failed failed) {
  Lock lk(mu_);
  auto it = entries_.end();
  STRATA_RETURN_IF_ERROR(Block(lk, [&] {
    it = entries_.find(group);
    return it == entries_.end() || it->second.pending == 0;
  }));
  if (it == entries_.end() || failed == Failed::kIgnore) return Status();
  return it->second.failed;
}

Status PendingUpdates::WaitAll() {
  Lock lk(mu_);
  STRATA_RETURN_IF_ERROR(Block(lk, [&] {
    for (const auto& [group, e] : entries_) {
      if (e.pending > 0) return false;
    }
    return true;
  }));
  for (const auto& [group, e] : entries_) {
    if (!e.failed.ok()) return e.failed;
  }
  return Status();
}

void PendingUpdates::ClearFailed() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = it->second.pending == 0 ? entries_.erase(it) : std::next(it);
  }
  for (auto& [group, e] : entries_) e.failed = Status();
  changed_.notify_all();
}

double PendingUpdates::waited_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return waited_;
}

}  // namespace strata::store
