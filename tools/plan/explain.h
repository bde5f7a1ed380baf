// strata-plan --explain: the engine's own prefetch and eviction schedule
// (sched::MakePlan / FormatPlan) for the model split into equal groups.
//
// The step it schedules is the one the optimizer pipeline runs: forward
// fetches every group's compute copy to the device in order; backward
// fetches the groups in reverse with their gradients, and right after
// each, the CPU optimizer fetches that group's gradients and optimizer
// state to the host. Each role sits at its home from Place(); bytes per
// group are the role's bytes divided by the group count (the last group
// takes the remainder). Windows are the budgets minus what is homed in
// the tier, as in the engine (Note [Prefetch window]); an unlimited tier
// gets a window that holds every group.
//
// Contract: pure; `groups` must be in 1..kMaxExplainGroups (the command
// line checks it, so a violation aborts).
#ifndef STRATA_TOOLS_PLAN_EXPLAIN_H_
#define STRATA_TOOLS_PLAN_EXPLAIN_H_

#include <cstdint>
#include <string>

#include "src/sched/planner.h"
#include "tools/plan/estimate.h"

namespace strata::plan {

inline constexpr uint64_t kMaxExplainGroups = 4096;

sched::PlanInput ExplainInput(const Plan& plan, uint64_t groups);
// FormatPlan of MakePlan(ExplainInput(plan, groups)).
std::string Explain(const Plan& plan, uint64_t groups);

}  // namespace strata::plan

#endif  // STRATA_TOOLS_PLAN_EXPLAIN_H_
