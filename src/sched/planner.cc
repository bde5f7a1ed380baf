#include "src/sched/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>

#include "common/text.h"

namespace strata::sched {
namespace {

constexpr int kDev = static_cast<int>(Tier::kDevice);
constexpr int kHost = static_cast<int>(Tier::kHost);
constexpr int kNvme = static_cast<int>(Tier::kNvme);

// Bytes entry `e` needs cached in tier `t` (0 when it does not touch it).
uint64_t Need(const PlanInput& in, const TraceEntry& e, int t) {
  const PlanGroup& g = in.groups[e.group];
  if (t == kDev) return e.tier == Tier::kDevice ? g.cached[kDev] : 0;
  if (e.tier == Tier::kHost) return g.cached[kHost];
  return g.nvme_homed > 0 ? g.cached[kHost] : 0;
}

// The window of Note [Prefetch window] for one tier over the doubled
// trace: hi[p] is the last position the window starting at p reaches.
void ScheduleTier(const PlanInput& in, int t, Plan& plan) {
  const int n = static_cast<int>(in.trace.size());
  std::map<int, int> count;  // group -> entries in the window
  uint64_t bytes = 0;
  int q = -1;  // last position in the window
  auto entry = [&](int i) -> const TraceEntry& { return in.trace[i % n]; };
  for (int p = 0; p < 2 * n; ++p) {
    if (q < p) q = p - 1;
    while (q + 1 < p + n) {
      const TraceEntry& next = entry(q + 1);
      const uint64_t need = Need(in, next, t);
      const bool fresh = need > 0 && count[next.group] == 0;
      if (fresh && bytes + need > in.window[t] && q >= p) break;
      ++q;
      if (need == 0) continue;
      if (fresh) {
        bytes += need;
        if (p >= n && q > p) {
          plan.steps[p - n].prefetch.push_back(
              {q % n, next.group, static_cast<Tier>(t)});
        }
      }
      ++count[next.group];
    }
    if (p >= n) plan.steps[p - n].window_bytes[t] = bytes;
    const TraceEntry& leaving = entry(p);
    if (Need(in, leaving, t) > 0 && --count[leaving.group] == 0) {
      bytes -= Need(in, leaving, t);
    }
  }
}

int64_t NextUse(const PlanInput& in, int group, int from, int t) {
  const int n = static_cast<int>(in.trace.size());
  for (int d = 1; d <= n; ++d) {
    const TraceEntry& e = in.trace[(from + d) % n];
    if (e.group == group && Need(in, e, t) > 0) return d;
  }
  return std::numeric_limits<int64_t>::max();
}

// Belady on the cyclic trace, twice round: the first lap warms up, the
// second is the steady state whose misses and evictions are recorded.
void SimulateTier(const PlanInput& in, int t, Plan& plan) {
  const int n = static_cast<int>(in.trace.size());
  std::map<int, uint64_t> resident;  // group -> bytes
  uint64_t used = 0;
  for (int i = 0; i < 2 * n; ++i) {
    const TraceEntry& e = in.trace[i % n];
    const uint64_t need = Need(in, e, t);
    if (need == 0 || resident.count(e.group)) continue;
    const bool steady = i >= n;
    while (used + need > in.window[t] && !resident.empty()) {
      auto victim = resident.begin();
      int64_t furthest = -1;
      for (auto it = resident.begin(); it != resident.end(); ++it) {
        const int64_t next = NextUse(in, it->first, i % n, t);
        if (next > furthest) furthest = next, victim = it;
      }
      if (steady) {
        plan.steps[i % n].evict.push_back(
            {i % n, victim->first, static_cast<Tier>(t)});
        if (in.writes && t == kDev) plan.bytes[kDev][kHost] += victim->second;
      }
      used -= victim->second;
      resident.erase(victim);
    }
    resident[e.group] = need;
    used += need;
    if (!steady) continue;
    if (t == kDev) {
      plan.bytes[kHost][kDev] += need;
    } else {
      plan.bytes[kNvme][kHost] += in.groups[e.group].nvme_homed;
    }
  }
}

}  // namespace

void SetWindows(uint64_t device_budget, uint64_t host_budget,
                const std::array<uint64_t, kNumTiers>& homed,
                PlanInput* input) {
  uint64_t largest_host = 0;
  for (const PlanGroup& g : input->groups) {
    largest_host = std::max(largest_host, g.cached[kHost]);
  }
  const uint64_t budget[] = {device_budget, host_budget};
  for (int t : {kDev, kHost}) {
    const uint64_t reserve = homed[t] + (t == kHost ? largest_host : 0);
    input->window[t] = budget[t] > reserve ? budget[t] - reserve : 0;
  }
}

Plan MakePlan(const PlanInput& input) {
  Plan plan;
  if (input.trace.empty()) return plan;
  plan.steps.resize(input.trace.size());
  for (int t : {kDev, kHost}) {
    ScheduleTier(input, t, plan);
    SimulateTier(input, t, plan);
  }
  if (input.writes) {
    // Each NVMe-homed group that a step writes goes back once per step.
    std::vector<bool> seen(input.groups.size());
    for (const TraceEntry& e : input.trace) {
      if (seen[e.group]) continue;
      seen[e.group] = true;
      plan.bytes[kHost][kNvme] += input.groups[e.group].nvme_homed;
    }
  }
  const Bandwidths& bw = input.bandwidths;
  const struct {
    const char* name;
    uint64_t bytes;
    double gbps;
  } links[] = {
      {"host->device", plan.bytes[kHost][kDev], bw.host_to_device},
      {"device->host", plan.bytes[kDev][kHost], bw.device_to_host},
      {"nvme->host", plan.bytes[kNvme][kHost], bw.nvme_read},
      {"host->nvme", plan.bytes[kHost][kNvme], bw.nvme_write},
  };
  for (const auto& link : links) {
    const double seconds = link.gbps > 0 ? link.bytes / (link.gbps * 1e9) : 0;
    if (seconds > plan.floor_seconds) {
      plan.floor_seconds = seconds;
      plan.floor_link = link.name;
    }
  }
  return plan;
}

std::string FormatPlan(const PlanInput& input, const Plan& plan) {
  if (input.trace.empty()) return "no trace yet: the first step records it\n";
  std::string out = fmt::format(
      "trace: {} fetches over {} groups; windows: device {}, host {}\n",
      input.trace.size(), input.groups.size(), HumanBytes(input.window[kDev]),
      HumanBytes(input.window[kHost]));
  auto name = [&](int group) { return input.groups[group].name; };
  for (size_t p = 0; p < plan.steps.size(); ++p) {
    const PlanStep& step = plan.steps[p];
    const TraceEntry& e = input.trace[p];
    out += fmt::format("{:5} fetch {} -> {}  [window device {}, host {}]", p,
                       name(e.group), TierName(e.tier),
                       HumanBytes(step.window_bytes[kDev]),
                       HumanBytes(step.window_bytes[kHost]));
    for (const PlanAction& a : step.evict) {
      out += fmt::format("  evict {}@{}", name(a.group), TierName(a.tier));
    }
    for (const PlanAction& a : step.prefetch) {
      out += fmt::format("  prefetch #{} {}->{}", a.entry, name(a.group),
                         TierName(a.tier));
    }
    out += "\n";
  }
  out += fmt::format(
      "per step: host->device {}, device->host {}, nvme->host {}, "
      "host->nvme {}\n",
      HumanBytes(plan.bytes[kHost][kDev]), HumanBytes(plan.bytes[kDev][kHost]),
      HumanBytes(plan.bytes[kNvme][kHost]),
      HumanBytes(plan.bytes[kHost][kNvme]));
  out += fmt::format("I/O floor: {:.3f} s per step, bound by {}\n",
                     plan.floor_seconds,
                     plan.floor_link.empty() ? "nothing" : plan.floor_link);
  return out;
}

}  // namespace strata::sched
