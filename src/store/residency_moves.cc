// The residency manager's moves: how a copy becomes valid at a tier (Ensure,
// Fill), how room is made for it (Note [Eviction order]) and how a copy is
// dropped or written toward its home. The contract is in residency.h; the
// public entry points are in residency.cc.
#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "common/interrupt.h"
#include "common/text.h"
#include "src/store/residency.h"

namespace strata::store {
namespace {

int Index(Tier tier) { return static_cast<int>(tier); }

// The tier one step from `tier` toward `home`.
Tier TowardHome(Tier tier, Tier home) {
  return static_cast<Tier>(Index(tier) + (Index(home) > Index(tier) ? 1 : -1));
}

}  // namespace

// Makes chunk `id` valid at `tier` for `why`. Returns with the lock held;
// `hit`, when not null, says whether it was valid on arrival.
Status Residency::Ensure(Lock& lk, int id, Tier tier, Reason why, bool* hit) {
  Chunk& c = chunks_[id];
  Copy& dst = c.copy[tier];
  if (hit != nullptr) *hit = dst.usable();
  Status status;
  while (!dst.usable()) {
    if (dst.busy() || dst.fenced()) {
      status = internal::WaitOnce(changed_, lk, "a copy in flight");
      if (!status.ok()) break;
      continue;
    }
    // A write-fetched copy is changing until its release: nothing may be
    // copied from it. A demand waits for the release (Note [Waits the
    // caller could end]); a prefetch gives up.
    if (c.writers > 0) {
      if (!why.demand()) break;
      status = CheckSelfWait(c, id, tier);
      if (status.ok()) {
        status = internal::WaitOnce(changed_, lk,
                                    "a write view another thread holds");
      }
      if (!status.ok()) break;
      continue;
    }
    // A stale copy that a view still holds keeps its old bytes for that
    // view: a demand retires it (Note [Retired copies]), a prefetch gives
    // up.
    if (HeldStale(dst)) {
      if (!why.demand()) break;
      status = Retire(lk, id, tier, why);
      if (!status.ok()) break;
      continue;
    }
    const Tier from =
        why.kind == Reason::Kind::kDiscard ? tier : SourceOf(c, tier);
    const Copy& src = c.copy[from];
    if (from != tier && (src.busy() || src.fenced())) {
      status = internal::WaitOnce(changed_, lk, "a copy in flight");
      if (!status.ok()) break;
      continue;
    }
    if (from != tier && !src.usable()) {
      // A lost chunk has no valid copy (MarkLost). The device fills from
      // the host: its copy comes first.
      STRATA_RETURN_IF_ERROR(CheckNotLost(c));
      STRATA_CHECK(tier == Tier::kDevice &&
                   "a written chunk has no valid copy");
      const Reason hop = why.demand() ? Reason{Reason::Kind::kHop} : why;
      status = Ensure(lk, id, Tier::kHost, hop, nullptr);
      if (!status.ok()) break;
      continue;
    }
    status = Fill(lk, id, tier, from, why);
    if (!status.ok()) break;
  }
  if (status.ok() && why.demand()) dst.prefetched = false;
  return status;
}

// Zeros for a chunk never written; for the device, the host; for the host,
// the device while it holds the bytes, else NVMe.
Tier Residency::SourceOf(const Chunk& c, Tier tier) const {
  if (c.blank) return tier;
  if (tier == Tier::kDevice) return Tier::kHost;
  if (c.copy[Tier::kDevice].holds_data()) return Tier::kDevice;
  return TowardHome(tier, Tier::kNvme);
}

// One transfer into `tier` from `from` (== tier: zero fill). Allocates the
// destination first, holding nothing while it may wait (see Note [Eviction
// order]); if the source went away meanwhile, the caller re-plans, as it
// does after a host source was first checked (Note [Unchecked host
// copies]). Returns with the lock held.
Status Residency::Fill(Lock& lk, int id, Tier tier, Tier from, Reason why) {
  Chunk& c = chunks_[id];
  Copy& dst = c.copy[tier];
  if (from == Tier::kHost && c.copy[from].unchecked.digest != nullptr) {
    return CheckHost(lk, id);
  }
  if (!dst.allocated()) {
    STRATA_RETURN_IF_ERROR(Allocate(lk, id, tier, why));
  }
  Copy* src = from == tier ? nullptr : &c.copy[from];
  const bool stale = c.writers > 0 || (src != nullptr && !src->usable());
  if (dst.state != CopyState::kStale || HeldStale(dst) || stale) {
    return Status();
  }
  if (src != nullptr) ++src->readers;
  dst.state = CopyState::kFilling;
  const uint64_t version = c.version;
  Status status = Transfer(lk, id, tier, from, why);
  if (src != nullptr) --src->readers;
  const bool valid = status.ok() && version == c.version;
  dst.state = valid ? CopyState::kValid : CopyState::kStale;
  if (valid) {
    dst.prefetched = why.prefetch();
    dst.last_use = ++clock_;
  } else {
    dst.unchecked = Unchecked();
  }
  changed_.notify_all();
  return status;
}

// Fill's transfer, run without the lock; returns with it held. A copy to
// the device keeps its event in `landing` meanwhile (PinLanding).
Status Residency::Transfer(Lock& lk, int id, Tier tier, Tier from, Reason why) {
  Chunk& c = chunks_[id];
  Copy& dst = c.copy[tier];
  const transport::Place to = PlaceOf(c, tier);
  Status status;
  if (why.kind == Reason::Kind::kDiscard) {
    lk.unlock();
    status = ZeroPadding(c, to);
  } else if (from == tier) {
    lk.unlock();
    status = mover_->Zero(to, c.bytes);
  } else if (tier == Tier::kDevice) {
    Result<tier::Event> landing =
        mover_->Start(c.role, PlaceOf(c, from), to, c.bytes);
    if (landing.ok()) dst.landing = *landing;
    lk.unlock();
    status = landing.ok() ? landing->Wait() : landing.status();
  } else if (from == Tier::kNvme &&
             (groups_[c.group].checked_in_pass & RoleBit(c.role)) != 0) {
    // Note [Unchecked host copies].
    const transport::Place src = PlaceOf(c, from);
    lk.unlock();
    Result<std::shared_ptr<const tier::Digest>> digest =
        mover_->ReadUnchecked(c.role, src, to, c.bytes);
    lk.lock();
    if (!digest.ok()) return digest.status();
    dst.unchecked = {std::move(*digest), src.extent};
    return Status();
  } else {
    lk.unlock();
    status = mover_->Copy(c.role, PlaceOf(c, from), to, c.bytes);
  }
  lk.lock();
  dst.landing = tier::Event();
  return status;
}

// The layout is fixed after registration, so this reads it without the lock.
Status Residency::ZeroPadding(const Chunk& c, const transport::Place& to) {
  const GroupLayout& layout = groups_[c.group].layout;
  std::vector<std::pair<uint64_t, uint64_t>> used;  // byte ranges of tensors
  for (const TensorLayout& t : layout.tensors) {
    if ((t.roles & RoleBit(c.role)) == 0) continue;
    used.emplace_back(t.offset[c.role],
                      t.offset[c.role] + TensorBytes(t, c.role));
  }
  std::sort(used.begin(), used.end());
  uint64_t at = 0;
  used.emplace_back(c.bytes, c.bytes);
  for (const auto& [begin, end] : used) {
    if (begin > at) {
      STRATA_RETURN_IF_ERROR(mover_->Zero(
          transport::Place::Memory(to.tier, static_cast<char*>(to.ptr) + at),
          begin - at));
    }
    at = std::max(at, end);
  }
  return Status();
}

uint64_t Residency::FreeBytes(Tier tier) const {
  return tier == Tier::kDevice ? device_->free_bytes() : host_->free_bytes();
}

Status Residency::EvictCached(Tier tier) {
  STRATA_CHECK(tier != Tier::kNvme);
  Lock lk(mu_);
  return EvictCached(lk, tier);
}

// Note [Eviction order]: memory held for good is allocated with no cached
// copy in its way.
Status Residency::EvictCached(Lock& lk, Tier tier) {
  for (;;) {
    const int victim = PickVictim(tier, -1, Reason::Demand());
    if (victim < 0) return Status();
    STRATA_RETURN_IF_ERROR(Drop(lk, victim, tier));
  }
}

// Note [Eviction order].
Status Residency::Allocate(Lock& lk, int id, Tier tier, Reason why) {
  Chunk& c = chunks_[id];
  for (;;) {
    if (c.copy[tier].allocated()) return Status();
    if (why.prefetch() && placing_[tier] > 0) {
      return Status::Unavailable("a fetch is placing its chunks");
    }
    const Status tried = TryAllocate(c, tier);
    if (tried.ok()) return Status();
    const int victim = PickVictim(tier, id, why);
    if (victim >= 0) {
      STRATA_RETURN_IF_ERROR(Drop(lk, victim, tier));
      continue;
    }
    if (why.planned()) {
      return Status::Unavailable("no room for a prefetch");
    }
    if (AnyBusy(tier)) {
      STRATA_RETURN_IF_ERROR(
          internal::WaitOnce(changed_, lk, "room, while copies move"));
      continue;
    }
    if (why.prefetch()) return Status::Unavailable("no room for a prefetch");
    return Status::ResourceExhausted(
        "no room for " + Describe(c) + " after evicting every copy that can " +
        "go (" + tried.message() + "); what stays on " + TierLabel(tier) +
        ": " + Occupants(tier) + ". Release views or raise the " +
        TierLabel(tier) + " budget");
  }
}

// For Allocate's error: what holds a tier once nothing can be evicted.
std::string Residency::Occupants(Tier tier) const {
  uint64_t homes = 0, held = 0;
  std::string fetched;
  int named = 0;
  for (const Chunk& c : chunks_) {
    const Copy& copy = c.copy[tier];
    if (!copy.allocated()) continue;
    if (c.home == tier) {
      homes += c.bytes;
    } else if (copy.pins > 0 && named < 4) {
      fetched += (named++ > 0 ? ", " : "") + Describe(c);
    } else {
      held += c.bytes;
    }
  }
  for (const auto& [serial, retired] : retired_) {
    if (retired.tier != tier || named >= 4) continue;
    fetched += (named++ > 0 ? ", " : "") + Describe(chunks_[retired.chunk]) +
               " (a stale copy)";
  }
  std::string out = HumanBytes(homes) + " of homes";
  if (named > 0) out += "; copies fetched (pinned) by views: " + fetched;
  if (held > 0) out += "; " + HumanBytes(held) + " of other copies in use";
  return out;
}

Status Residency::TryAllocate(Chunk& c, Tier tier) {
  Copy& copy = c.copy[tier];
  STRATA_CHECK(!copy.allocated());
  if (tier == Tier::kNvme) {
    STRATA_ASSIGN_OR_RETURN(copy.extent, nvme_->Allocate(c.bytes));
  } else {
    STRATA_ASSIGN_OR_RETURN(copy.ptr, tier == Tier::kDevice
                                          ? device_->Allocate(c.bytes)
                                          : host_->Allocate(c.bytes));
  }
  copy.state = CopyState::kStale;
  copy.serial = next_serial_++;
  return Status();
}

// Planned prefetches only take copies used after their own position.
int Residency::PickVictim(Tier tier, int requester, Reason why) const {
  const bool following = trace_.valid() && position_ >= 0;
  int64_t prefetch_distance = std::numeric_limits<int64_t>::max();
  if (why.planned()) {
    if (!following) return -1;
    prefetch_distance =
        trace_.NextUseDistance(chunks_[requester].group, position_);
  }
  int best = -1;
  int64_t best_score = std::numeric_limits<int64_t>::min();
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const Chunk& c = chunks_[i];
    const Copy& copy = c.copy[tier];
    // A prefetch pins nothing, so it would otherwise evict the chunks of
    // its group that it made valid a moment ago, to place the next one.
    if (why.prefetch() && requester >= 0 &&
        c.group == chunks_[requester].group) {
      continue;
    }
    if (static_cast<int>(i) == requester || c.home == tier ||
        !copy.allocated() || copy.busy() || copy.pins > 0 || copy.readers > 0 ||
        copy.fenced()) {
      continue;
    }
    int64_t score;
    if (copy.state == CopyState::kStale) {
      score = std::numeric_limits<int64_t>::max();
    } else if (following) {
      const int64_t next = trace_.NextUseDistance(c.group, position_);
      score = next < 0 ? std::numeric_limits<int64_t>::max() - 1 : next;
      if (why.planned() && score <= prefetch_distance) continue;
    } else {
      score = -static_cast<int64_t>(copy.last_use);
    }
    if (score > best_score) best_score = score, best = static_cast<int>(i);
  }
  return best;
}

bool Residency::MustWriteDown(const Chunk& c, Tier tier) const {
  return c.copy[tier].usable() && !c.blank && !OtherValid(c, tier);
}

// Drops the copy at `tier`, writing it one tier toward home first when it
// holds the only valid bytes. On a failed write the copy stays valid.
Status Residency::Drop(Lock& lk, int id, Tier tier) {
  Chunk& c = chunks_[id];
  if (MustWriteDown(c, tier)) {
    STRATA_RETURN_IF_ERROR(WriteDown(lk, id, tier));
  }
  FreeCopy(c, tier);
  ++counters_.evictions;
  changed_.notify_all();
  return Status();
}

// Copies the only valid copy at `tier` one tier toward home (kFlushing
// meanwhile). Returns with the lock held and the copy back at rest.
Status Residency::WriteDown(Lock& lk, int id, Tier tier) {
  Chunk& c = chunks_[id];
  Copy& copy = c.copy[tier];
  const Tier to = TowardHome(tier, c.home);
  Copy& lower = c.copy[to];
  const uint64_t version = c.version;
  copy.state = CopyState::kFlushing;
  Status status;
  while (lower.busy() || lower.fenced()) changed_.wait(lk);
  if (HeldStale(lower)) {
    status = Retire(lk, id, to, Reason::Demand());
  } else if (!lower.allocated()) {
    status = Allocate(lk, id, to, Reason::Demand());
  }
  if (status.ok()) {
    lower.state = CopyState::kFilling;
    std::shared_ptr<const tier::Digest> digest =
        c.digest_version == version ? c.digest : nullptr;
    lk.unlock();
    status = mover_->Copy(c.role, PlaceOf(c, tier), PlaceOf(c, to), c.bytes,
                          std::move(digest));
    lk.lock();
    const bool valid = status.ok() && version == c.version;
    lower.state = valid ? CopyState::kValid : CopyState::kStale;
    if (status.ok()) ++counters_.writebacks;
  }
  copy.state = version == c.version ? CopyState::kValid : CopyState::kStale;
  changed_.notify_all();
  return status;
}

void Residency::FreeCopy(Chunk& c, Tier tier) {
  Copy& copy = c.copy[tier];
  if (!copy.allocated()) return;
  FreeMemory(tier, copy);
  copy = Copy();
}

void Residency::FreeMemory(Tier tier, const Copy& copy) {
  if (tier == Tier::kNvme) {
    nvme_->Free(copy.extent);
  } else if (tier == Tier::kDevice) {
    device_->Free(copy.ptr);
  } else {
    host_->Free(copy.ptr);
  }
}

// A write fetch at `keep`, or a Discard (`keep` null): every other copy
// is stale from now on (a moving one becomes stale when its move ends, by
// the version).
void Residency::Invalidate(Chunk& c, const Tier* keep) {
  ++c.version;
  c.blank = keep == nullptr;
  for (Tier t : kTiers) {
    if (keep != nullptr && t == *keep) continue;
    Copy& copy = c.copy[t];
    copy.prefetched = false;
    copy.unchecked = Unchecked();
    if (copy.state == CopyState::kValid) copy.state = CopyState::kStale;
    const bool idle =
        !copy.busy() && copy.readers == 0 && copy.pins == 0 && !copy.fenced();
    if (t != c.home && idle) FreeCopy(c, t);
  }
}

// Note [Discarded bytes]
// Some roles' contents end with a step: the optimizer reads a group's
// gradients for its step, and the next step's first micro-batch
// overwrites them without reading. A dirty copy of such a chunk evicted
// later would be written toward its home for nothing. Discard ends the
// chunk's bytes instead: it becomes blank again, as if never written
// (it reads as zeros, without I/O), its copies go stale (the idle ones
// above home are freed, a moving one ends stale by the version, a view
// keeps its old bytes: Note [Retired copies]), and nothing of it is
// written down. The bytes a write-down would have moved count in
// EngineStats::discarded_bytes.
//
Status Residency::Discard(int group, RoleMask roles) {
  Lock lk(mu_);
  if (group < 0 || group >= static_cast<int>(groups_.size())) {
    return Status::InvalidArgument("no group " + std::to_string(group));
  }
  const std::vector<int> ids = ChunksOf(group, roles);
  for (int id : ids) {
    const Chunk& c = chunks_[id];
    if (c.writers > 0 || c.speculative) {
      return Status::FailedPrecondition(
          Describe(c) +
          (c.writers > 0 ? " is fetched for writing; release it"
                         : " holds speculative bytes; end the speculation") +
          " before discarding its bytes");
    }
  }
  for (int id : ids) {
    Chunk& c = chunks_[id];
    if (c.blank) continue;
    // A write-down would have moved the bytes only the copies above home
    // hold.
    if (!c.copy[c.home].holds_data()) counters_.discarded_bytes += c.bytes;
    Invalidate(c, nullptr);
  }
  changed_.notify_all();
  return Status();
}

bool Residency::OtherValid(const Chunk& c, Tier tier) const {
  for (Tier t : kTiers) {
    if (t != tier && c.copy[t].usable()) return true;
  }
  return false;
}

bool Residency::AnyBusy(Tier tier) const {
  for (const Chunk& c : chunks_) {
    const Copy& copy = c.copy[tier];
    if (copy.busy() || copy.readers > 0 || copy.fenced()) return true;
  }
  // A retired copy whose device work has not run frees itself when it has.
  for (const auto& [serial, retired] : retired_) {
    if (retired.tier == tier && retired.copy.fenced()) return true;
  }
  return false;
}

transport::Place Residency::PlaceOf(const Chunk& c, Tier tier) const {
  const Copy& copy = c.copy[tier];
  return {tier, copy.ptr, copy.extent};
}

std::string Residency::Describe(const Chunk& c) const {
  return "group '" + groups_[c.group].layout.name + "' (" +
         std::string(RoleName(c.role)) + ")";
}

}  // namespace strata::store
