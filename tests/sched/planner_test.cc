// The trace and the planner are pure: no tiers, no threads.
#include "src/sched/planner.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "src/sched/trace.h"

namespace strata::sched {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TraceEntry Dev(int group) { return {group, Tier::kDevice}; }

// Forward over `n` groups, then back.
std::vector<TraceEntry> ForwardBackward(int n) {
  std::vector<TraceEntry> out;
  for (int g = 0; g < n; ++g) out.push_back(Dev(g));
  for (int g = n - 1; g >= 0; --g) out.push_back(Dev(g));
  return out;
}

Trace Recorded(const std::vector<TraceEntry>& entries) {
  Trace trace;
  trace.BeginStep();
  for (const TraceEntry& e : entries) trace.OnFetch(e);
  EXPECT_TRUE(trace.EndStep());
  return trace;
}

TEST(Trace, FirstStepIsAdoptedAndFollowed) {
  Trace trace = Recorded(ForwardBackward(4));
  ASSERT_TRUE(trace.valid());
  EXPECT_EQ(trace.entries().size(), 8u);
  trace.BeginStep();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(trace.OnFetch(ForwardBackward(4)[i]), i);
  }
  EXPECT_FALSE(trace.EndStep());
  EXPECT_EQ(trace.invalidations(), 0u);
  EXPECT_EQ(trace.steps(), 2u);
}

TEST(Trace, DivergenceInvalidatesAndReRecords) {
  Trace trace = Recorded(ForwardBackward(3));
  trace.BeginStep();
  EXPECT_EQ(trace.OnFetch(Dev(0)), 0);
  bool diverged = false;
  EXPECT_EQ(trace.OnFetch(Dev(2), &diverged), -1);
  EXPECT_TRUE(diverged);
  EXPECT_FALSE(trace.valid());
  EXPECT_NE(trace.divergence().find("expected group 1"), std::string::npos)
      << trace.divergence();
  trace.OnFetch(Dev(1));
  EXPECT_TRUE(trace.EndStep());
  EXPECT_EQ(trace.invalidations(), 1u);
  ASSERT_EQ(trace.entries().size(), 3u);
  EXPECT_EQ(trace.entries()[1].group, 2);
}

TEST(Trace, ShortStepInvalidates) {
  Trace trace = Recorded(ForwardBackward(2));
  trace.BeginStep();
  trace.OnFetch(Dev(0));
  EXPECT_TRUE(trace.EndStep());
  EXPECT_EQ(trace.invalidations(), 1u);
  EXPECT_EQ(trace.entries().size(), 1u);
}

TEST(Trace, TierIsPartOfTheOrder) {
  Trace trace = Recorded({Dev(0), {0, Tier::kHost}});
  trace.BeginStep();
  trace.OnFetch(Dev(0));
  EXPECT_EQ(trace.OnFetch(Dev(0)), -1);
}

TEST(Trace, NextUseWrapsIntoTheNextStep) {
  Trace trace = Recorded(ForwardBackward(4));  // 0 1 2 3 3 2 1 0
  EXPECT_EQ(trace.NextUseDistance(2, 2), 3);   // position 5
  EXPECT_EQ(trace.NextUseDistance(0, 0), 7);
  EXPECT_EQ(trace.NextUseDistance(0, 7), 1);  // next step, position 0
  EXPECT_EQ(trace.NextUseDistance(9, 0), -1);
}

PlanInput Input(const std::vector<TraceEntry>& trace, int groups,
                uint64_t group_bytes, uint64_t device_window,
                uint64_t host_window, bool nvme) {
  PlanInput in;
  in.trace = trace;
  for (int g = 0; g < groups; ++g) {
    PlanGroup pg;
    pg.name = "layer." + std::to_string(g);
    pg.cached = {group_bytes, nvme ? group_bytes : 0, 0};
    pg.nvme_homed = nvme ? group_bytes : 0;
    in.groups.push_back(pg);
  }
  in.window = {device_window, host_window, 0};
  return in;
}

// Every entry whose group is not already in the window is prefetched once,
// at a position before it, and the windows never exceed their budgets.
void CheckSchedule(const PlanInput& in, const Plan& plan, Tier tier) {
  const int n = static_cast<int>(in.trace.size());
  const int t = static_cast<int>(tier);
  std::map<int, int> issued;  // entry -> position
  for (int p = 0; p < n; ++p) {
    EXPECT_LE(plan.steps[p].window_bytes[t], in.window[t]) << "position " << p;
    for (const PlanAction& a : plan.steps[p].prefetch) {
      if (a.tier != tier) continue;
      EXPECT_TRUE(issued.emplace(a.entry, p).second)
          << "entry " << a.entry << " prefetched twice";
      EXPECT_EQ(a.group, in.trace[a.entry].group);
      EXPECT_NE(a.entry, p) << "a demand fetch is not a prefetch";
    }
  }
  EXPECT_FALSE(issued.empty());
}

TEST(Planner, ForwardBackwardDeviceWindow) {
  // 16 groups of 32 MiB, 4 fit on the device.
  PlanInput in =
      Input(ForwardBackward(16), 16, 32 * kMiB, 128 * kMiB, 0, false);
  Plan plan = MakePlan(in);
  ASSERT_EQ(plan.steps.size(), 32u);
  CheckSchedule(in, plan, Tier::kDevice);
  // The window runs 3 fetches ahead: fetch 1 starts layer.4.
  ASSERT_EQ(plan.steps[1].prefetch.size(), 1u) << FormatPlan(in, plan);
  EXPECT_EQ(plan.steps[1].prefetch[0].entry, 4);
  // The step ends on layers 3..0, which the next step starts with: they
  // stay resident and nothing needs prefetching around the boundary.
  EXPECT_TRUE(plan.steps[0].prefetch.empty());
  EXPECT_TRUE(plan.steps[31].prefetch.empty());
  // The turn (15, 15, 14, ...) needs no new prefetch of layer 15.
  for (const PlanAction& a : plan.steps[15].prefetch) EXPECT_NE(a.group, 15);
}

TEST(Planner, EvictionsAreBelady) {
  PlanInput in = Input(ForwardBackward(8), 8, kMiB, 3 * kMiB, 0, false);
  Plan plan = MakePlan(in);
  const int n = static_cast<int>(in.trace.size());
  int evictions = 0;
  for (int p = 0; p < n; ++p) {
    for (const PlanAction& victim : plan.steps[p].evict) {
      ++evictions;
      // The window holds 3 groups: the one fetched at p and the two others
      // used soonest after it, which Belady never evicts.
      std::set<int> soonest;
      for (int d = 1; d < n && soonest.size() < 2; ++d) {
        const int g = in.trace[(p + d) % n].group;
        if (g != in.trace[p].group) soonest.insert(g);
      }
      EXPECT_EQ(soonest.count(victim.group), 0u)
          << "position " << p << " evicted " << victim.group;
      EXPECT_NE(victim.group, in.trace[p].group);
    }
  }
  EXPECT_GT(evictions, 0);
  // Each of the 16 fetches misses except the turn-arounds: bytes moved to
  // the device equal the misses times the group size.
  EXPECT_EQ(plan.bytes[1][0] % kMiB, 0u);
  EXPECT_LT(plan.bytes[1][0], 16 * kMiB);
  EXPECT_GE(plan.bytes[1][0], 10 * kMiB);
}

TEST(Planner, HostWindowReadsAheadFromNvme) {
  PlanInput in =
      Input(ForwardBackward(16), 16, 32 * kMiB, 128 * kMiB, 256 * kMiB, true);
  in.bandwidths.nvme_read = 3.0;
  in.bandwidths.host_to_device = 10.0;
  in.writes = true;
  Plan plan = MakePlan(in);
  CheckSchedule(in, plan, Tier::kHost);
  // The host window (8 groups) runs further ahead than the device's (4).
  int lead[2] = {0, 0};
  for (size_t p = 0; p < plan.steps.size(); ++p) {
    for (const PlanAction& a : plan.steps[p].prefetch) {
      const int ahead = static_cast<int>((a.entry + 32 - p) % 32);
      int& l = lead[static_cast<int>(a.tier)];
      l = std::max(l, ahead);
    }
  }
  EXPECT_EQ(lead[0], 3);
  EXPECT_EQ(lead[1], 7);  // 8 groups fit in the host window
  EXPECT_GT(plan.bytes[2][1], 0u);
  EXPECT_EQ(plan.bytes[1][2], 16 * 32 * kMiB);  // every group written back
  EXPECT_EQ(plan.floor_link, "host->nvme");
  EXPECT_NEAR(plan.floor_seconds, 16 * 32 * kMiB / (1.5e9), 1e-9);
  const std::string text = FormatPlan(in, plan);
  EXPECT_NE(text.find("prefetch #"), std::string::npos);
  EXPECT_NE(text.find("I/O floor"), std::string::npos);
}

TEST(Planner, EmptyTraceGivesEmptyPlan) {
  PlanInput in;
  EXPECT_TRUE(MakePlan(in).steps.empty());
  EXPECT_NE(FormatPlan(in, MakePlan(in)).find("no trace"), std::string::npos);
}

}  // namespace
}  // namespace strata::sched
