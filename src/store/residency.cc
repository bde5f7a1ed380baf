#include "src/store/residency.h"

#include <chrono>
#include <limits>
#include <utility>

#include "common/text.h"

namespace strata::store {
namespace {

int Index(Tier tier) { return static_cast<int>(tier); }

// The tier one step from `tier` toward `home`.
Tier TowardHome(Tier tier, Tier home) {
  return static_cast<Tier>(Index(tier) + (Index(home) > Index(tier) ? 1 : -1));
}

std::string TierLabel(Tier tier) { return std::string(TierName(tier)); }

}  // namespace

Residency::Residency(tier::Device* device, tier::PinnedPool* host,
                     tier::NvmeStore* nvme, transport::Mover* mover)
    : device_(device), host_(host), nvme_(nvme), mover_(mover) {}

Residency::~Residency() {
  for (Chunk& c : chunks_) {
    for (Tier t : {Tier::kDevice, Tier::kHost, Tier::kNvme}) FreeCopy(c, t);
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
                               bool cached_only) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const ChunkLayout& c : groups_.at(group).layout.chunks) {
    if ((RoleBit(c.role) & roles) == 0) continue;
    if (cached_only && c.home == tier) continue;
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

// Setup-time feasibility (DESIGN §3): the group's homes must fit in what is
// left of each tier, and fetching the whole group must fit next to every
// home copy. Both are checked against what is free now, so a registration
// that passes can always be fetched once nothing else is pinned.
Status Residency::CheckFits(const GroupLayout& layout) const {
  std::array<uint64_t, kNumTiers> homed = {}, fetched = {};
  for (const ChunkLayout& c : layout.chunks) {
    const uint64_t host_bytes = tier::PinnedPool::SizeClass(c.bytes);
    homed[Index(c.home)] += c.home == Tier::kHost ? host_bytes : c.bytes;
    if (c.home != Tier::kDevice && (layout.device_roles & RoleBit(c.role))) {
      fetched[Index(Tier::kDevice)] += c.bytes;
    }
    if (c.home != Tier::kHost) fetched[Index(Tier::kHost)] += host_bytes;
  }
  const std::array<uint64_t, kNumTiers> free = {
      device_->free_bytes(), host_->free_bytes(),
      nvme_ == nullptr ? 0 : nvme_->stats().capacity - nvme_->stats().used};
  const std::array<uint64_t, kNumTiers> budget = {
      device_->info().budget, host_->info().budget,
      nvme_ == nullptr ? 0 : nvme_->stats().capacity};
  for (Tier t : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
    const int i = Index(t);
    if (t == Tier::kNvme && homed[i] > 0 && nvme_ == nullptr) {
      return Status::FailedPrecondition(
          "group '" + layout.name +
          "' places roles on NVMe but the engine has no NVMe "
          "tier; set nvme_budget and swap_dir "
          "(--nvme-budget, --swap-dir)");
    }
    const uint64_t need = homed[i] + (t == Tier::kNvme ? 0 : fetched[i]);
    if (need <= free[i]) continue;
    std::string msg = "group '" + layout.name + "' needs " + HumanBytes(need) +
                      " on " + TierLabel(t) + "; " + TierLabel(t) +
                      " budget is " + HumanBytes(budget[i]);
    if (free[i] < budget[i]) {
      msg += ", of which " + HumanBytes(budget[i] - free[i]) +
             " is homed by earlier groups";
    }
    msg += ". Raise the " + TierLabel(t) +
           " budget or move roles of this group to a lower tier";
    return Status::ResourceExhausted(std::move(msg));
  }
  return Status();
}

Result<int> Residency::AddGroup(GroupLayout layout) {
  Lock lk(mu_);
  STRATA_RETURN_IF_ERROR(CheckFits(layout));
  const int id = static_cast<int>(groups_.size());
  Group& g = groups_.emplace_back();
  g.layout = std::move(layout);
  std::vector<int> ids;
  if (Status s = AllocateHomes(g, ids); !s.ok()) {
    for (int c : ids) {
      for (Tier t : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
        FreeCopy(chunks_[c], t);
      }
    }
    chunks_.resize(chunks_.size() - ids.size());
    groups_.pop_back();
    return s;
  }
  g.chunks = std::move(ids);
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
    Copy& home = c.copy[Index(c.home)];
    if (c.home != Tier::kNvme) {
      // Zero-filled homes are valid from the start; NVMe homes stay
      // invalid until first written, and the chunk reads as zeros.
      STRATA_RETURN_IF_ERROR(mover_->Zero(PlaceOf(c, c.home), c.bytes));
      home.valid = true;
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

Result<int> Residency::Fetch(int group, Tier tier, RoleMask roles, bool write,
                             bool record) {
  Lock lk(mu_);
  if (group < 0 || group >= static_cast<int>(groups_.size())) {
    return Status::InvalidArgument("no group " + std::to_string(group) + " (" +
                                   std::to_string(groups_.size()) +
                                   " registered)");
  }
  if (tier == Tier::kNvme) {
    return Status::InvalidArgument(
        "cannot fetch to NVMe: fetch to the device or the host");
  }
  const RoleMask allowed = groups_[group].layout.device_roles;
  if (tier == Tier::kDevice &&
      (roles & groups_[group].layout.roles & ~allowed) != 0) {
    return Status::InvalidArgument(
        "group '" + groups_[group].layout.name +
        "': a role asked for is not in its placement's "
        "device_roles; fetch it to the host");
  }
  const std::vector<int> ids = ChunksOf(group, roles);
  if (ids.empty()) {
    return Status::InvalidArgument("group '" + groups_[group].layout.name +
                                   "' has none of the requested roles");
  }
  if (record && trace_.in_step()) {
    position_ = trace_.OnFetch({group, tier, roles});
  }
  const int position = record ? position_ : -1;
  std::vector<int> pinned;
  for (int id : ids) {
    const Copy& dst = chunks_[id].copy[Index(tier)];
    const bool prefetched = dst.prefetched;
    if (record) {
      ++counters_.fetches;
      counters_.late_prefetches += dst.busy && prefetched;
    }
    const auto start = std::chrono::steady_clock::now();
    bool hit = false;
    Status s = Ensure(lk, id, tier, -1, &hit);
    // A write fetch hands its copy out only once no transfer is still
    // copying from it; the copy may move meanwhile, so ensure it again.
    // Such a wait is a stall, not a hit.
    while (s.ok() && write && dst.readers > 0) {
      hit = false;
      changed_.wait(lk);
      s = Ensure(lk, id, tier, -1, nullptr);
    }
    if (record) {
      counters_.hits += hit;
      counters_.prefetch_hits += hit && prefetched;
      if (!hit) {
        counters_.stall_seconds += std::chrono::duration<double>(
                                       std::chrono::steady_clock::now() - start)
                                       .count();
      }
    }
    if (!s.ok()) {
      for (int p : pinned) {
        --chunks_[p].copy[Index(tier)].pins;
        if (write) --chunks_[p].writers;
      }
      changed_.notify_all();
      return s;
    }
    Chunk& c = chunks_[id];
    Copy& copy = c.copy[Index(tier)];
    ++copy.pins;
    copy.last_use = ++clock_;
    pinned.push_back(id);
    if (write) {
      Invalidate(c, tier);
      ++c.writers;
    }
  }
  groups_[group].pins.push_back({tier, write, std::move(pinned)});
  return position;
}

Status Residency::Release(int group) {
  std::lock_guard<std::mutex> lock(mu_);
  if (group < 0 || group >= static_cast<int>(groups_.size()) ||
      groups_[group].pins.empty()) {
    return Status::FailedPrecondition("release of group " +
                                      std::to_string(group) +
                                      " without a matching fetch");
  }
  Pin pin = std::move(groups_[group].pins.back());
  groups_[group].pins.pop_back();
  for (int id : pin.chunks) {
    --chunks_[id].copy[Index(pin.tier)].pins;
    if (pin.write) --chunks_[id].writers;
  }
  changed_.notify_all();
  return Status();
}

Status Residency::Prefetch(int group, Tier tier, RoleMask roles, int entry) {
  Lock lk(mu_);
  if (group < 0 || group >= static_cast<int>(groups_.size()) ||
      tier == Tier::kNvme) {
    return Status::InvalidArgument("prefetch of group " +
                                   std::to_string(group) + " to " +
                                   TierLabel(tier) + " is not possible");
  }
  if (tier == Tier::kDevice) roles &= groups_[group].layout.device_roles;
  for (int id : ChunksOf(group, roles)) {
    bool hit = false;
    Status s = Ensure(lk, id, tier, entry < 0 ? -2 : entry, &hit);
    if (s.code() == StatusCode::kUnavailable) {
      ++counters_.abandoned_prefetches;
      return Status();
    }
    if (!s.ok()) return s;
    if (!hit) ++counters_.prefetches;
  }
  return Status();
}

Status Residency::Evict(int group, Tier tier) {
  Lock lk(mu_);
  if (group < 0 || group >= static_cast<int>(groups_.size())) {
    return Status::InvalidArgument("no group " + std::to_string(group));
  }
  for (int id : ChunksOf(group, kAllRoles)) {
    Chunk& c = chunks_[id];
    Copy& copy = c.copy[Index(tier)];
    while (copy.busy || copy.readers > 0) changed_.wait(lk);
    if (c.home == tier || !copy.allocated) continue;
    if (copy.pins > 0) {
      return Status::FailedPrecondition("group '" + groups_[group].layout.name +
                                        "' is fetched on " + TierLabel(tier) +
                                        "; release it before evicting");
    }
    STRATA_RETURN_IF_ERROR(Drop(lk, id, tier));
  }
  return Status();
}

void* Residency::Address(int group, Role role, Tier tier,
                         uint64_t offset) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Group& g = groups_.at(group);
  const int index = g.layout.chunk_of_role[static_cast<int>(role)];
  STRATA_CHECK(index >= 0);
  const Copy& copy = chunks_[g.chunks[index]].copy[Index(tier)];
  STRATA_CHECK(copy.allocated && tier != Tier::kNvme);
  return static_cast<char*>(copy.ptr) + offset;
}

EngineStats Residency::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

int Residency::FirstPinnedGroup() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!groups_[g].pins.empty()) return static_cast<int>(g);
  }
  return -1;
}

bool Residency::in_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return trace_.in_step();
}

// Makes chunk `id` valid at `tier`. `entry` is -1 for a demand fetch, the
// trace position for a planned prefetch, -2 for an explicit prefetch.
// Returns with the lock held; `hit`, when not null, says whether it was
// valid on arrival.
Status Residency::Ensure(Lock& lk, int id, Tier tier, int entry, bool* hit) {
  Chunk& c = chunks_[id];
  const bool demand = entry == -1;
  Copy& dst = c.copy[Index(tier)];
  if (hit != nullptr) *hit = dst.valid && !dst.busy;
  Status status;
  for (;;) {
    if (dst.valid && !dst.busy) break;
    if (dst.busy) {
      changed_.wait(lk);
      continue;
    }
    // A write-fetched copy is changing until its release: nothing may be
    // copied from it. Demand waits; a prefetch gives up.
    if (c.writers > 0) {
      if (entry != -1 && entry != -3) break;
      changed_.wait(lk);
      continue;
    }
    // The source: zeros, the tier below (toward NVMe), or the device.
    Tier from = tier;
    const Tier below = static_cast<Tier>(Index(tier) + 1);
    if (!c.zero) {
      if (tier == Tier::kDevice) {
        from = Tier::kHost;
        if (!c.copy[Index(Tier::kHost)].valid ||
            c.copy[Index(Tier::kHost)].busy) {
          status = Ensure(lk, id, Tier::kHost, demand ? -3 : entry, nullptr);
          if (!status.ok()) break;
          continue;
        }
      } else if (c.copy[Index(Tier::kDevice)].valid) {
        from = Tier::kDevice;
      } else {
        from = below;
      }
      Copy& src = c.copy[Index(from)];
      if (!src.valid && !src.busy) {
        STRATA_CHECK(false && "a written chunk has no valid copy");
      }
      if (src.busy) {
        changed_.wait(lk);
        continue;
      }
    }
    status = Fill(lk, id, tier, from, entry);
    if (!status.ok()) break;
  }
  if (status.ok() && demand) dst.prefetched = false;
  return status;
}

// One transfer into `tier` from `from` (== tier: zero fill). Allocates the
// destination first, holding nothing while it may wait (see Note [Eviction
// order]); if the source went away meanwhile, the caller re-plans. Returns
// with the lock held.
Status Residency::Fill(Lock& lk, int id, Tier tier, Tier from, int entry) {
  Chunk& c = chunks_[id];
  Copy& dst = c.copy[Index(tier)];
  if (!dst.allocated) {
    STRATA_RETURN_IF_ERROR(Allocate(lk, id, tier, entry));
  }
  Copy* src = from == tier ? nullptr : &c.copy[Index(from)];
  const bool stale =
      c.writers > 0 || (src != nullptr && (!src->valid || src->busy));
  if (dst.busy || dst.valid || stale) return Status();
  if (src != nullptr) ++src->readers;
  dst.busy = true;
  const uint64_t version = c.version;
  const transport::Place to = PlaceOf(c, tier);
  lk.unlock();
  Status status = src == nullptr ? mover_->Zero(to, c.bytes)
                                 : mover_->Copy(PlaceOf(c, from), to, c.bytes);
  lk.lock();
  dst.busy = false;
  if (src != nullptr) --src->readers;
  if (status.ok() && version == c.version) {
    dst.valid = true;
    dst.prefetched = entry >= 0 || entry == -2;
    dst.last_use = ++clock_;
  }
  changed_.notify_all();
  return status;
}

uint64_t Residency::FreeBytes(Tier tier) const {
  return tier == Tier::kDevice ? device_->free_bytes() : host_->free_bytes();
}

Status Residency::MakeRoom(Tier tier, uint64_t bytes) {
  STRATA_CHECK(tier != Tier::kNvme);
  Lock lk(mu_);
  while (FreeBytes(tier) < bytes) {
    const int victim = PickVictim(tier, -1, -1);
    if (victim < 0) break;
    STRATA_RETURN_IF_ERROR(Drop(lk, victim, tier));
  }
  return Status();
}

// Note [Eviction order]. `entry` >= 0 marks a prefetch (see PickVictim).
Status Residency::Allocate(Lock& lk, int id, Tier tier, int entry) {
  Chunk& c = chunks_[id];
  for (;;) {
    if (c.copy[Index(tier)].allocated) return Status();
    if (TryAllocate(c, tier).ok()) return Status();
    const int victim = PickVictim(tier, id, entry);
    if (victim >= 0) {
      STRATA_RETURN_IF_ERROR(Drop(lk, victim, tier));
      continue;
    }
    if (entry >= 0) {
      return Status::Unavailable("no room for a prefetch");
    }
    if (AnyBusy(tier)) {
      changed_.wait(lk);
      continue;
    }
    const uint64_t free = FreeBytes(tier);
    return Status::ResourceExhausted(
        TierLabel(tier) + " tier: cannot fit " + HumanBytes(c.bytes) + " for " +
        Describe(c) + ": " + HumanBytes(free) +
        " free and every other copy there is fetched "
        "(pinned); release groups or raise the " +
        TierLabel(tier) + " budget");
  }
}

Status Residency::TryAllocate(Chunk& c, Tier tier) {
  Copy& copy = c.copy[Index(tier)];
  STRATA_CHECK(!copy.allocated);
  if (tier == Tier::kNvme) {
    STRATA_ASSIGN_OR_RETURN(copy.extent, nvme_->Allocate(c.bytes));
  } else {
    STRATA_ASSIGN_OR_RETURN(copy.ptr, tier == Tier::kDevice
                                          ? device_->Allocate(c.bytes)
                                          : host_->Allocate(c.bytes));
  }
  copy.allocated = true;
  return Status();
}

// Prefetches (entry >= 0) only take copies used after their own position.
int Residency::PickVictim(Tier tier, int requester, int entry) const {
  const bool following = trace_.valid() && position_ >= 0;
  int64_t prefetch_distance = std::numeric_limits<int64_t>::max();
  if (entry >= 0) {
    if (!following) return -1;
    prefetch_distance =
        trace_.NextUseDistance(chunks_[requester].group, position_);
  }
  int best = -1;
  int64_t best_score = std::numeric_limits<int64_t>::min();
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const Chunk& c = chunks_[i];
    const Copy& copy = c.copy[Index(tier)];
    if (static_cast<int>(i) == requester || c.home == tier || !copy.allocated ||
        copy.busy || copy.pins > 0 || copy.readers > 0) {
      continue;
    }
    int64_t score;
    if (!copy.valid) {
      score = std::numeric_limits<int64_t>::max();
    } else if (following) {
      const int64_t next = trace_.NextUseDistance(c.group, position_);
      score = next < 0 ? std::numeric_limits<int64_t>::max() - 1 : next;
      if (entry >= 0 && score <= prefetch_distance) continue;
    } else {
      score = -static_cast<int64_t>(copy.last_use);
    }
    if (score > best_score) best_score = score, best = static_cast<int>(i);
  }
  return best;
}

// Drops the copy at `tier`, writing it one tier toward home first when it
// holds the only valid bytes. On a failed write the copy stays valid.
Status Residency::Drop(Lock& lk, int id, Tier tier) {
  Chunk& c = chunks_[id];
  Copy& copy = c.copy[Index(tier)];
  if (copy.valid && !c.zero && !OtherValid(c, tier)) {
    const Tier to = TowardHome(tier, c.home);
    Copy& lower = c.copy[Index(to)];
    copy.busy = true;
    Status status;
    while (status.ok() && lower.busy) changed_.wait(lk);
    if (status.ok() && !lower.allocated) status = Allocate(lk, id, to, -1);
    if (status.ok()) {
      lower.busy = true;
      const uint64_t version = c.version;
      lk.unlock();
      status = mover_->Copy(PlaceOf(c, tier), PlaceOf(c, to), c.bytes);
      lk.lock();
      lower.busy = false;
      if (status.ok() && version == c.version) lower.valid = true;
      if (status.ok()) ++counters_.writebacks;
    }
    copy.busy = false;
    changed_.notify_all();
    if (!status.ok()) return status;
  }
  FreeCopy(c, tier);
  ++counters_.evictions;
  changed_.notify_all();
  return Status();
}

void Residency::FreeCopy(Chunk& c, Tier tier) {
  Copy& copy = c.copy[Index(tier)];
  if (!copy.allocated) return;
  if (tier == Tier::kNvme) {
    nvme_->Free(copy.extent);
  } else if (tier == Tier::kDevice) {
    device_->Free(copy.ptr);
  } else {
    host_->Free(copy.ptr);
  }
  copy = Copy();
}

// A write fetch at `keep`: every other copy is stale from now on.
void Residency::Invalidate(Chunk& c, Tier keep) {
  ++c.version;
  c.zero = false;
  for (Tier t : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
    if (t == keep) continue;
    Copy& copy = c.copy[Index(t)];
    copy.valid = false;
    copy.prefetched = false;
    const bool idle = !copy.busy && copy.readers == 0 && copy.pins == 0;
    if (t != c.home && idle) FreeCopy(c, t);
  }
}

bool Residency::OtherValid(const Chunk& c, Tier tier) const {
  for (Tier t : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
    const Copy& copy = c.copy[Index(t)];
    if (t != tier && copy.valid && !copy.busy) return true;
  }
  return false;
}

bool Residency::AnyBusy(Tier tier) const {
  for (const Chunk& c : chunks_) {
    const Copy& copy = c.copy[Index(tier)];
    if (copy.busy || copy.readers > 0) return true;
  }
  return false;
}

transport::Place Residency::PlaceOf(const Chunk& c, Tier tier) const {
  const Copy& copy = c.copy[Index(tier)];
  return {tier, copy.ptr, copy.extent};
}

std::string Residency::Describe(const Chunk& c) const {
  return "group '" + groups_[c.group].layout.name + "' (" +
         std::string(RoleName(c.role)) + ")";
}

}  // namespace strata::store
