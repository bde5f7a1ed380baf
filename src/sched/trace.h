// The fetch trace: the order in which one training step fetched its groups.
//
// The first complete step (BeginStep .. EndStep) becomes the trace. Later
// steps are followed along it: OnFetch() returns the fetch's position, which
// the executor uses to prefetch ahead and the eviction policy uses to find
// next uses. A fetch that differs from the trace at its position
// invalidates the trace for the rest of the step; the step's own order is
// recorded all the same and becomes the new trace at EndStep(). That is the
// caller's cue to log, not an error.
//
// Not synchronized: the store calls it under its lock. Pure bookkeeping.
#ifndef STRATA_SRC_SCHED_TRACE_H_
#define STRATA_SRC_SCHED_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "strata/engine.h"

namespace strata::sched {

struct TraceEntry {
  int group = -1;
  Tier tier = Tier::kDevice;
  RoleMask roles = kAllRoles;  // carried along; not part of the comparison
  bool operator==(const TraceEntry& other) const {
    return group == other.group && tier == other.tier;
  }
};

class Trace {
 public:
  void BeginStep();
  // Records a fetch. Returns its position in the trace when the step so far
  // follows it, else -1. `diverged` (when not null) is set to true on the
  // fetch that breaks an adopted trace.
  int OnFetch(const TraceEntry& entry, bool* diverged = nullptr);
  // Ends the step. Returns true when the step's order became the trace
  // (the first step, or a step that diverged).
  bool EndStep();

  bool valid() const { return valid_; }
  bool in_step() const { return in_step_; }
  const std::vector<TraceEntry>& entries() const { return entries_; }
  // Position of the most recent fetch while following, else -1.
  int position() const { return following_ ? position_ : -1; }
  uint64_t invalidations() const { return invalidations_; }
  uint64_t steps() const { return steps_; }
  // "fetch 17 of the step was group 3 (device); the trace expected group 4
  // (device)", for the log line.
  const std::string& divergence() const { return divergence_; }

  // Positions (0..size-1) at which `group` is fetched; empty when absent.
  const std::vector<int>& UsesOf(int group) const;
  // Distance, in fetches, from `position` to the next fetch of `group`,
  // looking into following steps (the trace repeats). -1 when the group is
  // not in the trace.
  int64_t NextUseDistance(int group, int position) const;

 private:
  void Adopt();

  std::vector<TraceEntry> entries_;     // the adopted trace
  std::vector<TraceEntry> recording_;   // this step's fetches
  std::vector<std::vector<int>> uses_;  // group -> positions in entries_
  bool valid_ = false;
  bool in_step_ = false;
  bool following_ = false;
  int position_ = -1;
  uint64_t invalidations_ = 0;
  uint64_t steps_ = 0;
  std::string divergence_;
};

}  // namespace strata::sched

#endif  // STRATA_SRC_SCHED_TRACE_H_
