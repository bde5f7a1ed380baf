#include "src/sched/trace.h"

#include <algorithm>

namespace strata::sched {
namespace {

std::string Describe(const TraceEntry& entry) {
  return "group " + std::to_string(entry.group) + " (" +
         std::string(TierName(entry.tier)) + ")";
}

}  // namespace

void Trace::BeginStep() {
  in_step_ = true;
  recording_.clear();
  following_ = valid_;
  position_ = -1;
}

int Trace::OnFetch(const TraceEntry& entry, bool* diverged) {
  recording_.push_back(entry);
  if (!following_) return -1;
  const size_t at = recording_.size() - 1;
  if (at < entries_.size() && entries_[at] == entry) {
    position_ = static_cast<int>(at);
    return position_;
  }
  divergence_ = "fetch " + std::to_string(at) + " of the step was " +
                Describe(entry) + "; the trace expected " +
                (at < entries_.size() ? Describe(entries_[at])
                                      : std::string("the step to end"));
  following_ = false;
  valid_ = false;
  ++invalidations_;
  if (diverged != nullptr) *diverged = true;
  return -1;
}

bool Trace::EndStep() {
  in_step_ = false;
  ++steps_;
  const bool short_step = following_ && recording_.size() < entries_.size();
  if (short_step) {
    divergence_ = "the step ended after " + std::to_string(recording_.size()) +
                  " of the trace's " + std::to_string(entries_.size()) +
                  " fetches";
    valid_ = false;
    ++invalidations_;
  }
  following_ = false;
  position_ = -1;
  if (valid_ || recording_.empty()) return false;
  Adopt();
  return true;
}

void Trace::Adopt() {
  entries_ = recording_;
  uses_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) {
    const int group = entries_[i].group;
    if (static_cast<size_t>(group) >= uses_.size()) uses_.resize(group + 1);
    uses_[group].push_back(static_cast<int>(i));
  }
  valid_ = true;
}

const std::vector<int>& Trace::UsesOf(int group) const {
  static const std::vector<int> kNone;
  if (group < 0 || static_cast<size_t>(group) >= uses_.size()) return kNone;
  return uses_[group];
}

int64_t Trace::NextUseDistance(int group, int position) const {
  const std::vector<int>& uses = UsesOf(group);
  if (uses.empty()) return -1;
  auto next = std::upper_bound(uses.begin(), uses.end(), position);
  if (next != uses.end()) return *next - position;
  return static_cast<int64_t>(entries_.size()) - position + uses.front();
}

}  // namespace strata::sched
