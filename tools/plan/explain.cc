#include "tools/plan/explain.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <vector>

#include "strata/status.h"

namespace strata::plan {
namespace {

strata::Tier EngineTier(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return strata::Tier::kDevice;
    case Tier::kHost:
      return strata::Tier::kHost;
    case Tier::kNvme:
      return strata::Tier::kNvme;
  }
  STRATA_CHECK(false);
  return strata::Tier::kNvme;
}

RoleMask EngineRoles(std::initializer_list<Role> roles) {
  RoleMask mask = 0;
  for (Role role : roles) {
    switch (role) {
      case Role::kParams:
        mask |= RoleBit(strata::Role::kCompute);
        break;
      case Role::kGrads:
        mask |= RoleBit(strata::Role::kGrad);
        break;
      case Role::kMaster:
        mask |= RoleBit(strata::Role::kMaster);
        break;
      case Role::kOptimState:
        mask |= RoleBit(strata::Role::kState1) | RoleBit(strata::Role::kState2);
        break;
    }
  }
  return mask;
}

// Group g's share of `bytes` split over `groups`; the last takes the rest.
uint64_t Share(uint64_t bytes, uint64_t groups, uint64_t g) {
  const uint64_t each = bytes / groups;
  return g + 1 < groups ? each : bytes - each * (groups - 1);
}

}  // namespace

sched::PlanInput ExplainInput(const Plan& plan, uint64_t groups) {
  STRATA_CHECK(groups >= 1 && groups <= kMaxExplainGroups);
  const Placement& placement = plan.placement;
  constexpr int kDev = static_cast<int>(strata::Tier::kDevice);
  constexpr int kHost = static_cast<int>(strata::Tier::kHost);
  sched::PlanInput in;
  std::array<uint64_t, kNumTiers> homed = {};
  std::array<uint64_t, kNumTiers> cached_total = {};
  for (uint64_t g = 0; g < groups; ++g) {
    sched::PlanGroup pg;
    pg.name = fmt::format("layer.{}", g);
    for (const RolePlacement& r : placement.roles) {
      const uint64_t bytes = Share(r.bytes, groups, g);
      const int home = static_cast<int>(EngineTier(r.tier));
      homed[home] += bytes;
      if (r.tier == Tier::kNvme) pg.nvme_homed += bytes;
      // Backward brings params and gradients to the device; the optimizer
      // brings every role to the host.
      const bool on_device = r.role == Role::kParams || r.role == Role::kGrads;
      if (home != kDev && on_device) pg.cached[kDev] += bytes;
      if (home != kHost) pg.cached[kHost] += bytes;
    }
    for (int t : {kDev, kHost}) cached_total[t] += pg.cached[t];
    in.groups.push_back(std::move(pg));
  }
  constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();
  sched::SetWindows(plan.budgets[kDev].value_or(kUnlimited),
                    plan.budgets[kHost].value_or(kUnlimited), homed, &in);
  // An unlimited tier's window holds every group, and says so in bytes.
  for (int t : {kDev, kHost}) {
    if (!plan.budgets[t].has_value()) in.window[t] = cached_total[t];
  }
  const RoleMask forward = EngineRoles({Role::kParams});
  const RoleMask backward = EngineRoles({Role::kParams, Role::kGrads});
  const RoleMask optimizer = EngineRoles(
      {Role::kParams, Role::kGrads, Role::kMaster, Role::kOptimState});
  const int n = static_cast<int>(groups);
  for (int g = 0; g < n; ++g) {
    in.trace.push_back({g, strata::Tier::kDevice, forward});
  }
  for (int g = n - 1; g >= 0; --g) {
    in.trace.push_back({g, strata::Tier::kDevice, backward});
    in.trace.push_back({g, strata::Tier::kHost, optimizer});
  }
  const auto& gbps = plan.bandwidths.gbps;
  in.bandwidths.host_to_device = gbps[static_cast<int>(Link::kHostToDevice)];
  in.bandwidths.device_to_host = gbps[static_cast<int>(Link::kDeviceToHost)];
  in.bandwidths.nvme_read = gbps[static_cast<int>(Link::kNvmeToHost)];
  in.bandwidths.nvme_write = gbps[static_cast<int>(Link::kHostToNvme)];
  in.writes = true;
  return in;
}

std::string Explain(const Plan& plan, uint64_t groups) {
  const sched::PlanInput in = ExplainInput(plan, groups);
  return sched::FormatPlan(in, sched::MakePlan(in));
}

}  // namespace strata::plan
