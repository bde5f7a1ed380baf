#include "src/store/residency.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "common/enum_array.h"
#include "common/text.h"

namespace strata::store {

Residency::Residency(tier::Device* device, tier::PinnedPool* host,
                     tier::NvmeStore* nvme, transport::Mover* mover)
    : device_(device),
      host_(host),
      nvme_(nvme),
      mover_(mover),
      pin_owner_(std::make_shared<internal::PinOwner>(this)),
      watcher_([this] { WatchFences(); }) {}

Residency::~Residency() {
  pin_owner_->Close();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  fence_added_.notify_all();
  watcher_.join();  // after every fence completed
  if (!holds_.empty()) {
    const Hold& first = holds_.begin()->second;
    std::fprintf(stderr,
                 "strata: the engine was destroyed with %zu fetches "
                 "unreleased (group '%s' on %s, ...); their views dangle, "
                 "and releasing them fails. Release every view first\n",
                 holds_.size(), groups_[first.group].layout.name.c_str(),
                 TierLabel(first.tier).c_str());
  }
  for (Chunk& c : chunks_) {
    for (Tier t : kTiers) FreeCopy(c, t);
    if (c.spare.valid()) nvme_->Free(c.spare);
  }
  for (const auto& [serial, retired] : retired_) {
    FreeMemory(retired.tier, retired.copy);
  }
}

int Residency::group_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(groups_.size());
}

const GroupLayout& Residency::layout(int group) const {
  std::lock_guard<std::mutex> lock(mu_);
  return groups_.at(group).layout;
}

uint64_t Residency::GroupBytes(int group, Tier tier, RoleMask roles,
                               Homed homed) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const ChunkLayout& c : groups_.at(group).layout.chunks) {
    if ((RoleBit(c.role) & roles) == 0) continue;
    if (homed == Homed::kExcluded && c.home == tier) continue;
    total +=
        tier == Tier::kHost ? tier::PinnedPool::SizeClass(c.bytes) : c.bytes;
  }
  return total;
}

uint64_t Residency::NvmeHomedBytes(int group, RoleMask roles) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const ChunkLayout& c : groups_.at(group).layout.chunks) {
    if ((RoleBit(c.role) & roles) != 0 && c.home == Tier::kNvme) {
      total += c.bytes;
    }
  }
  return total;
}

uint64_t Residency::SpareBytes(Tier tier) const {
  STRATA_CHECK(tier != Tier::kNvme);
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t fetch = 0;
  for (const Group& g : groups_) {
    fetch = std::max(fetch, g.footprint.fetched[tier]);
  }
  const uint64_t budget =
      tier == Tier::kDevice ? device_->info().budget : host_->info().budget;
  const uint64_t taken = homed_[tier] + fetch;
  return budget > taken ? budget - taken : 0;
}

// In the bytes each tier's allocator takes: size classes on the host,
// whole alignment units on the device and NVMe.
Residency::Footprint Residency::FootprintOf(const GroupLayout& layout) const {
  auto round = [](uint64_t bytes, uint64_t unit) {
    return (bytes + unit - 1) / unit * unit;
  };
  const uint64_t device_unit = device_->info().alignment;
  const uint64_t nvme_unit = nvme_ == nullptr ? 1 : nvme_->alignment();
  Footprint f;
  for (const ChunkLayout& c : layout.chunks) {
    TierArray<uint64_t> bytes;
    bytes[Tier::kDevice] = round(c.bytes, device_unit);
    bytes[Tier::kHost] = tier::PinnedPool::SizeClass(c.bytes);
    bytes[Tier::kNvme] = round(c.bytes, nvme_unit);
    f.homed[c.home] += bytes[c.home];
    if (c.home != Tier::kDevice && (layout.device_roles & RoleBit(c.role))) {
      f.fetched[Tier::kDevice] += bytes[Tier::kDevice];
    }
    if (c.home != Tier::kHost) f.fetched[Tier::kHost] += bytes[Tier::kHost];
  }
  return f;
}

// Setup-time feasibility (DESIGN §3), against every group registered: at
// the device and the host, all homes plus the largest fetch of any one
// group must fit the budget, so that every group can always be fetched
// once nothing else is pinned; NVMe must hold the homes.
Status Residency::CheckFits(const GroupLayout& layout) const {
  const Footprint mine = FootprintOf(layout);
  if (mine.homed[Tier::kNvme] > 0 && nvme_ == nullptr) {
    return Status::FailedPrecondition(
        "group '" + layout.name +
        "' places roles on NVMe but the engine has no NVMe "
        "tier; set nvme_budget and swap_dir "
        "(--nvme-budget, --swap-dir)");
  }
  TierArray<uint64_t> budget;
  budget[Tier::kDevice] = device_->info().budget;
  budget[Tier::kHost] = host_->info().budget;
  budget[Tier::kNvme] = nvme_ == nullptr ? 0 : nvme_->stats().capacity;
  for (Tier t : kTiers) {
    const uint64_t homes = homed_[t] + mine.homed[t];
    int widest = -1;  // the group whose fetch needs most at t; -1: this one
    uint64_t fetch = t == Tier::kNvme ? 0 : mine.fetched[t];
    for (size_t g = 0; g < groups_.size() && t != Tier::kNvme; ++g) {
      if (groups_[g].footprint.fetched[t] > fetch) {
        fetch = groups_[g].footprint.fetched[t];
        widest = static_cast<int>(g);
      }
    }
    if (homes + fetch <= budget[t]) continue;
    return widest < 0 ? TooLarge(layout, t, mine.homed[t] + fetch, budget[t])
                      : Starves(layout, groups_[widest].layout.name, t, homes,
                                fetch, budget[t]);
  }
  return Status();
}

Status Residency::TooLarge(const GroupLayout& layout, Tier t, uint64_t need,
                           uint64_t budget) const {
  std::string msg = "group '" + layout.name + "' needs " + HumanBytes(need) +
                    " on " + TierLabel(t) + "; " + TierLabel(t) +
                    " budget is " + HumanBytes(budget);
  if (homed_[t] > 0) {
    msg +=
        ", of which " + HumanBytes(homed_[t]) + " is homed by earlier groups";
  }
  if (t == Tier::kDevice &&
      (layout.device_roles & ~RoleBit(Role::kCompute) & layout.roles) != 0) {
    // The fetch counts every role that may go to the device; a CPU
    // optimizer needs only the compute copy there.
    return Status::ResourceExhausted(
        msg +
        ", which must hold a fetch of every role that may go to the "
        "device. Raise the device budget, or let only the compute copy "
        "go there (Placement::device_roles, "
        "strata_engine_options.device_roles, "
        "Engine(device_roles=\"compute\"))");
  }
  return Status::ResourceExhausted(
      msg + ". Raise the " + TierLabel(t) +
      " budget or move roles of this group to a lower tier");
}

Status Residency::Starves(const GroupLayout& layout, const std::string& other,
                          Tier t, uint64_t homes, uint64_t fetch,
                          uint64_t budget) const {
  return Status::ResourceExhausted(
      "group '" + layout.name + "' cannot be registered: with its homes, " +
      HumanBytes(homes) + " would be homed on " + TierLabel(t) +
      " for good, and group '" + other + "' needs " + HumanBytes(fetch) +
      " more there to be fetched (" + TierLabel(t) + " budget " +
      HumanBytes(budget) + "), so '" + other +
      "' could never be fetched again. Raise the " + TierLabel(t) +
      " budget or move roles of '" + layout.name + "' or '" + other +
      "' to a lower tier");
}

Result<int> Residency::AddGroup(GroupLayout layout) {
  Lock lk(mu_);
  // Homes are held for good: no cached copy may split the room around
  // them (Note [Eviction order]). Eviction may drop the lock, so the check
  // comes after it.
  const Footprint footprint = FootprintOf(layout);
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    if (footprint.homed[t] > 0) STRATA_RETURN_IF_ERROR(EvictCached(lk, t));
  }
  STRATA_RETURN_IF_ERROR(CheckFits(layout));
  const int id = static_cast<int>(groups_.size());
  Group& g = groups_.emplace_back();
  g.layout = std::move(layout);
  std::vector<int> ids;
  if (Status s = AllocateHomes(g, ids); !s.ok()) {
    for (int c : ids) {
      for (Tier t : kTiers) {
        FreeCopy(chunks_[c], t);
      }
    }
    chunks_.resize(chunks_.size() - ids.size());
    groups_.pop_back();
    return s;
  }
  g.chunks = std::move(ids);
  g.footprint = footprint;
  for (Tier t : kTiers) homed_[t] += g.footprint.homed[t];
  return id;
}

Status Residency::AllocateHomes(Group& g, std::vector<int>& ids) {
  const int group = static_cast<int>(groups_.size()) - 1;
  for (const ChunkLayout& cl : g.layout.chunks) {
    ids.push_back(static_cast<int>(chunks_.size()));
    Chunk& c = chunks_.emplace_back();
    c.group = group;
    c.role = cl.role;
    c.home = cl.home;
    c.bytes = cl.bytes;
    STRATA_RETURN_IF_ERROR(TryAllocate(c, c.home));
    Copy& home = c.copy[c.home];
    if (c.home != Tier::kNvme) {
      // Zero-filled homes are valid from the start; NVMe homes stay
      // invalid until first written, and the chunk reads as zeros.
      STRATA_RETURN_IF_ERROR(mover_->Zero(PlaceOf(c, c.home), c.bytes));
      home.state = CopyState::kValid;
    }
  }
  return Status();
}

std::vector<int> Residency::ChunksOf(int group, RoleMask roles) const {
  std::vector<int> out;
  const Group& g = groups_[group];
  for (size_t i = 0; i < g.chunks.size(); ++i) {
    if ((RoleBit(g.layout.chunks[i].role) & roles) != 0) {
      out.push_back(g.chunks[i]);
    }
  }
  return out;
}

void Residency::BeginStep() {
  std::lock_guard<std::mutex> lock(mu_);
  trace_.BeginStep();
  position_ = -1;
}

bool Residency::EndStep(std::string* diverged) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool adopted = trace_.EndStep();
  position_ = -1;
  if (trace_.invalidations() != reported_invalidations_) {
    reported_invalidations_ = trace_.invalidations();
    if (diverged != nullptr) *diverged = trace_.divergence();
  }
  return adopted;
}

sched::Trace Residency::TraceSnapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return trace_;
}

Status Residency::Prefetch(int group, Tier tier, RoleMask roles, int position) {
  Lock lk(mu_);
  if (group < 0 || group >= static_cast<int>(groups_.size()) ||
      tier == Tier::kNvme) {
    return Status::InvalidArgument("prefetch of group " +
                                   std::to_string(group) + " to " +
                                   TierLabel(tier) + " is not possible");
  }
  if (tier == Tier::kDevice) roles &= groups_[group].layout.device_roles;
  const Reason why = position < 0 ? Reason{Reason::Kind::kPrefetch}
                                  : Reason::Planned(position);
  for (int id : ChunksOf(group, roles)) {
    const Copy& dst = chunks_[id].copy[tier];
    // Counted only where this prefetch started the copy: not when it joined
    // one in flight, nor when it gave up on a copy being written.
    const bool started = !dst.usable() && !dst.busy();
    Status s = Ensure(lk, id, tier, why, nullptr);
    if (s.code() == StatusCode::kUnavailable) {
      ++counters_.abandoned_prefetches;
      return Status();
    }
    if (!s.ok()) return s;
    if (started && dst.usable()) ++counters_.prefetches;
  }
  return Status();
}

// Refused while the group is fetched at `tier`, checked once every copy is
// at rest and before the first goes. A fetch that comes in while copies are
// written down stops the eviction at its chunk (the copies dropped before
// it were written down first).
Status Residency::Evict(int group, Tier tier, RoleMask roles) {
  Lock lk(mu_);
  if (group < 0 || group >= static_cast<int>(groups_.size())) {
    return Status::InvalidArgument("no group " + std::to_string(group));
  }
  const std::vector<int> ids = ChunksOf(group, roles);
  auto at_rest = [&] {
    for (int id : ids) {
      const Copy& copy = chunks_[id].copy[tier];
      if (copy.busy() || copy.readers > 0 || copy.fenced()) return false;
    }
    return true;
  };
  auto fetched = [&] {
    for (int id : ids) {
      if (chunks_[id].copy[tier].pins > 0) return true;
    }
    return false;
  };
  auto refused = [&] {
    return Status::FailedPrecondition("group '" + groups_[group].layout.name +
                                      "' is fetched on " + TierLabel(tier) +
                                      "; release it before evicting");
  };
  changed_.wait(lk, at_rest);
  if (fetched()) return refused();
  for (int id : ids) {
    Chunk& c = chunks_[id];
    Copy& copy = c.copy[tier];
    while (copy.busy() || copy.readers > 0 || copy.fenced()) changed_.wait(lk);
    if (copy.pins > 0) return refused();
    if (c.home == tier || !copy.allocated()) continue;
    STRATA_RETURN_IF_ERROR(Drop(lk, id, tier));
  }
  return Status();
}

void* Residency::Address(int group, Role role, Tier tier,
                         uint64_t offset) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Group& g = groups_.at(group);
  const int index = g.layout.chunk_of_role[role];
  STRATA_CHECK(index >= 0);
  const Copy& copy = chunks_[g.chunks[index]].copy[tier];
  STRATA_CHECK(copy.allocated() && tier != Tier::kNvme);
  return static_cast<char*>(copy.ptr) + offset;
}

EngineStats Residency::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

int Residency::FirstPinnedGroup() const {
  std::lock_guard<std::mutex> lock(mu_);
  int first = -1;
  for (const auto& [pin, hold] : holds_) {
    if (first < 0 || hold.group < first) first = hold.group;
  }
  return first;
}

bool Residency::in_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return trace_.in_step();
}

}  // namespace strata::store
