// The planner: a pure function from (trace, group sizes, budgets,
// bandwidths) to the per-step prefetch and eviction schedule. It touches no
// hardware, so it is tested on its own and printed by Explain() and
// `strata-plan --explain`.
//
// Note [Prefetch window]
// Steps repeat, so the plan is for the steady state of a cyclic trace.
// Every tier that caches copies (device, and host for NVMe-homed chunks)
// gets a byte window: its budget minus the bytes homed there for good.
// At fetch position p the window covers the longest run of upcoming
// fetches p, p+1, ..., q whose distinct groups fit in it together; each of
// them will be needed before anything outside the run, so Belady keeps
// them all and prefetching them evicts nothing that is needed sooner.
// A fetch enters the schedule at the first position whose window reaches
// it, so every fetch is prefetched exactly once per step, as early as the
// budget allows. The host window also keeps room for one group's write-
// back, because evicting a dirty device copy lands there first.
// Evictions are Belady's choices on the same cyclic trace; the residency
// manager applies the same rule at run time, so the listed evictions are
// what a step that follows the trace will do.
#ifndef STRATA_SRC_SCHED_PLANNER_H_
#define STRATA_SRC_SCHED_PLANNER_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "src/sched/trace.h"
#include "strata/engine.h"

namespace strata::sched {

struct PlanGroup {
  std::string name;
  // Bytes the group takes in a tier when fetched there, excluding chunks
  // homed in that tier (those never move).
  std::array<uint64_t, kNumTiers> cached = {};
  // Bytes of the group's chunks homed on NVMe: what a host miss reads.
  uint64_t nvme_homed = 0;
};

struct PlanInput {
  std::vector<TraceEntry> trace;
  std::vector<PlanGroup> groups;
  // Bytes each tier can cache: budget minus what is homed there.
  std::array<uint64_t, kNumTiers> window = {};
  Bandwidths bandwidths;
  // Fetches write (training): every eviction from the device writes back,
  // and NVMe-homed data goes back to NVMe once per step.
  bool writes = false;
};

struct PlanAction {
  int entry = -1;  // trace position being prefetched (or evicted before)
  int group = -1;
  Tier tier = Tier::kDevice;
};

struct PlanStep {
  std::vector<PlanAction> prefetch;  // start these after this fetch
  std::vector<PlanAction> evict;     // Belady's victims at this fetch
  // Bytes the windows hold at this position.
  std::array<uint64_t, kNumTiers> window_bytes = {};
};

struct Plan {
  std::vector<PlanStep> steps;  // one per trace position
  // Steady-state bytes per step between tiers: bytes[from][to].
  std::array<std::array<uint64_t, kNumTiers>, kNumTiers> bytes = {};
  // Time the transfers of one step need at the given bandwidths, per link
  // and in all (links run concurrently, so the floor is the largest).
  double floor_seconds = 0;
  std::string floor_link;
};

// Sets input->window from the budgets, Note [Prefetch window]: each tier's
// budget minus the bytes homed there (`homed`, by Tier), and on the host
// also minus the largest group's cached bytes, the room a write-back needs.
void SetWindows(uint64_t device_budget, uint64_t host_budget,
                const std::array<uint64_t, kNumTiers>& homed, PlanInput* input);

Plan MakePlan(const PlanInput& input);
std::string FormatPlan(const PlanInput& input, const Plan& plan);

}  // namespace strata::sched

#endif  // STRATA_SRC_SCHED_PLANNER_H_
