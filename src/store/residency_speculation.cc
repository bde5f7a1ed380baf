// The residency manager's speculative writes (Note [Speculative writes]
// below): spare NVMe extents, the write fetch that keeps the old bytes,
// and keeping or restoring them.
#include <atomic>
#include <utility>
#include <vector>

#include "common/text.h"
#include "src/store/residency.h"

namespace strata::store {

// Note [Speculative writes]
// The optimizer steps a group before it knows whether the step stands
// (Note [Exact steps under overlap] in src/optim/pipeline.h), so the bytes
// it overwrites must survive until it does. A chunk homed on NVMe may get
// a second extent (AddSpares). A speculative write fetch (FetchToHost
// with `speculative`) of it leaves the chunk's current bytes in the extent
// that holds them and points the NVMe copy at the other one, so every
// write-down of the new bytes goes there; a chunk whose only valid copy
// was above NVMe is written down first. EndSpeculation then keeps the new
// bytes (the other extent is the chunk's from now on: nothing moves) or
// restores the old: every copy above NVMe is dropped and the NVMe copy is
// the old extent again, valid as it was (or never written). Old bytes of
// chunks homed on the host or the device are not kept: a caller
// restores those itself.

namespace {

std::atomic<SpeculationHook> speculation_hook{nullptr};

}  // namespace

void SetSpeculationHookForTesting(SpeculationHook hook) {
  speculation_hook = hook;
}

Status Residency::AddSpares(int group, RoleMask roles) {
  Lock lk(mu_);
  if (group < 0 || group >= static_cast<int>(groups_.size())) {
    return Status::InvalidArgument("no group " + std::to_string(group));
  }
  std::vector<Chunk*> added;
  for (int id : ChunksOf(group, roles)) {
    Chunk& c = chunks_[id];
    if (c.home != Tier::kNvme || c.spare.valid()) continue;
    Result<tier::Extent> spare = nvme_->Allocate(c.bytes);
    if (!spare.ok()) {
      for (Chunk* a : added) {
        nvme_->Free(a->spare);
        a->spare = tier::Extent();
      }
      return Status(spare.status().code(),
                    "a second NVMe extent for " + Describe(c) + " (" +
                        HumanBytes(c.bytes) +
                        ") does not fit: " + spare.status().message());
    }
    c.spare = *spare;
    added.push_back(&c);
  }
  return Status();
}

void Residency::DropSpares(int group) {
  Lock lk(mu_);
  for (int id : groups_.at(group).chunks) {
    Chunk& c = chunks_[id];
    if (!c.spare.valid() || c.speculative) continue;
    nvme_->Free(c.spare);
    c.spare = tier::Extent();
  }
}

// Called with the hold's copies valid and pinned at the host.
Status Residency::WriteDownForSpeculation(Lock& lk, const Hold& hold) {
  for (int id : hold.chunks) {
    Chunk& c = chunks_[id];
    if (!Writes(hold, id)) continue;
    if (!c.spare.valid() || c.speculative || c.blank ||
        c.copy[Tier::kNvme].usable()) {
      continue;
    }
    STRATA_RETURN_IF_ERROR(WriteDown(lk, id, Tier::kHost));
  }
  return Status();
}

// Before the write fetch's Invalidate: the NVMe copy holds the chunk's
// bytes (or it was never written), and nothing moves them (the host copy is
// pinned and unread, and NVMe fills nothing but the host).
void Residency::StartSpeculation(Chunk& c) {
  if (!c.spare.valid() || c.speculative) return;
  Copy& nvme = c.copy[Tier::kNvme];
  STRATA_CHECK((c.blank || nvme.usable()) && nvme.readers == 0);
  std::swap(nvme.extent, c.spare);
  c.old_blank = c.blank;
  c.speculative = true;
}

Status Residency::EndSpeculation(int group, Outcome outcome) {
  Lock lk(mu_);
  if (group < 0 || group >= static_cast<int>(groups_.size())) {
    return Status::InvalidArgument("no group " + std::to_string(group));
  }
  for (int id : groups_[group].chunks) {
    Chunk& c = chunks_[id];
    if (!c.speculative) continue;
    if (outcome == Outcome::kKeep) {
      c.speculative = false;
    } else {
      STRATA_RETURN_IF_ERROR(RestoreOldBytes(lk, id));
    }
    if (SpeculationHook hook = speculation_hook.load()) hook();
  }
  changed_.notify_all();
  return Status();
}

// Drops the new bytes everywhere and makes the old extent the NVMe copy
// again, once no move of the chunk is in flight.
Status Residency::RestoreOldBytes(Lock& lk, int id) {
  Chunk& c = chunks_[id];
  auto at_rest = [&] {
    for (Tier t : kTiers) {
      const Copy& copy = c.copy[t];
      if (copy.busy() || copy.readers > 0 || copy.fenced()) return false;
    }
    return true;
  };
  changed_.wait(lk, at_rest);
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    // A view of older bytes keeps them (Note [Retired copies]).
    if (HeldStale(c.copy[t])) Detach(id, t);
    if (c.copy[t].pins > 0) {
      return Status::FailedPrecondition(
          Describe(c) + " is fetched on " + TierLabel(t) +
          ", so its speculative bytes cannot be undone; release it first");
    }
  }
  for (Tier t : {Tier::kDevice, Tier::kHost}) FreeCopy(c, t);
  Copy& nvme = c.copy[Tier::kNvme];
  std::swap(nvme.extent, c.spare);
  nvme.prefetched = false;
  ++c.version;
  c.blank = c.old_blank;
  nvme.state = c.blank ? CopyState::kStale : CopyState::kValid;
  c.speculative = false;
  c.lost.clear();  // the old bytes are the chunk's again
  return Status();
}

bool Residency::Blank(int group, Role role) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Group& g = groups_.at(group);
  const int index = g.layout.chunk_of_role[role];
  return index < 0 || chunks_[g.chunks[index]].blank;
}

uint64_t Residency::Version(int group, Role role) const {
  Lock lk(mu_);
  const Group& g = groups_[group];
  const int index = g.layout.chunk_of_role[role];
  return index < 0 ? 0 : chunks_[g.chunks[index]].version;
}

void Residency::ForgetCallerWrites(int group) {
  Lock lk(mu_);
  for (int id : groups_[group].chunks) chunks_[id].caller_fetch = 0;
}

bool Residency::WrittenTogether(int group, Role a, Role b) const {
  Lock lk(mu_);
  const Group& g = groups_[group];
  const int ia = g.layout.chunk_of_role[a];
  const int ib = g.layout.chunk_of_role[b];
  if (ia < 0 || ib < 0) return false;
  const Chunk& ca = chunks_[g.chunks[ia]];
  const Chunk& cb = chunks_[g.chunks[ib]];
  return ca.caller_fetch != 0 && ca.caller_fetch == cb.caller_fetch &&
         ca.caller_version == ca.version && cb.caller_version == cb.version;
}

}  // namespace strata::store
