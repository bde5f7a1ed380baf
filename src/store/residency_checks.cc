// The residency manager's host copies whose NVMe reads are verified by the
// pass that uses them (Note [Unchecked host copies]), and the chunks such a
// pass found corrupt. The contract is in residency.h.
#include <string>
#include <utility>

#include "src/store/residency.h"

namespace strata::store {
namespace {

// A mismatch the store reported, naming the chunk.
Status Named(const std::string& chunk, const Status& failed) {
  return Status(failed.code(), chunk + ": " + failed.message());
}

}  // namespace

// Note [Unchecked host copies]
// Why: every byte read from NVMe is verified against the digest its write
// recorded (src/tier/nvme_store.h). The store does it once the read ends,
// in a pass over bytes that no one else has touched yet: for the 107M GPT
// of torch_offload_bench.py with fp32 state on NVMe, 1.28 GB of memory
// traffic a step on the prefetch thread (docs/PERF.md). The optimizer's
// pass reads those bytes anyway; verified there, piece by piece while
// each piece is in cache, they cost the hashing alone.
// How: the roles a group names with CheckInPass are read from NVMe with
// ReadCheck::kCaller, and their host copy becomes kValid with `unchecked`
// set: the digest its bytes must match and the extent they came from. A
// fetch that names the role in Access::checked (the optimizer's write
// fetch) is handed that (Fetched::unchecked) and the copy is no longer
// unchecked: its pass verifies each piece before it steps it
// (src/optim/step_check.h) and calls MarkLost when one fails. Any other
// use verifies the copy first (CheckHost): a fetch to the host that does
// not name it (a checkpoint, a caller's view) and the fill of a device
// copy from it. A prefetch leaves it unchecked; a fetch that overwrites
// the chunk only drops the mark.
// Why it is safe: no byte of an unchecked copy reaches anyone unverified.
// The copy is a cache of the NVMe copy, valid beside it, so no write-down
// starts from it; all that pins it or copies from it checks first, or
// takes the check over. While a pass holds the check (`checking`), other
// fetches of the host copy wait for the hold's release, as fetches at
// other tiers wait for any writer. CheckHost counts as a reader of the
// copy while it hashes without the lock, so no write fetch, eviction or
// free of a retired copy changes the bytes meanwhile; two threads may
// check one copy at once, each correctly. Any change of state (stale,
// freed) ends the mark.
// Failures: a copy that CheckHost finds corrupt goes stale, so the next
// use reads NVMe again and fails again, as a read the store verifies
// does; but one that a checking fetch pinned meanwhile (it is still
// placing its other chunks) keeps its mark, so that fetch's pass finds
// the bytes corrupt too. A pass that finds a corrupt piece has stepped
// some pieces and not others: MarkLost makes every chunk its hold writes
// fail every fetch with the mismatch until overwritten (a checkpoint's
// load) or restored (EndSpeculation's undo brings the old extent back,
// verified at its next read).

void Residency::CheckInPass(int group, RoleMask roles) {
  Lock lk(mu_);
  STRATA_CHECK(group >= 0 && group < static_cast<int>(groups_.size()));
  groups_[group].checked_in_pass = roles;
}

Status Residency::Mismatch(int group, Role role, const Unchecked& read,
                           const tier::Segment& bad, uint64_t got) const {
  const Status failed = nvme_->Mismatch(read.extent, bad, got);
  Lock lk(mu_);
  return Named(Describe(chunks_[ChunksOf(group, RoleBit(role)).at(0)]), failed);
}

void Residency::MarkLost(uint64_t hold, const Status& why) {
  Lock lk(mu_);
  const auto it = holds_.find(hold);
  STRATA_CHECK(it != holds_.end());
  const Hold& h = it->second;
  for (int id : h.chunks) {
    if (!Writes(h, id)) continue;
    Chunk& c = chunks_[id];
    Invalidate(c, nullptr);
    c.blank = false;
    c.checking = false;
    c.lost = why.message();
  }
  changed_.notify_all();
}

void Residency::HandOverChecks(const Hold& hold, RoleMask checked,
                               RoleArray<Unchecked>& out, bool back) {
  for (int id : hold.chunks) {
    Chunk& c = chunks_[id];
    if ((checked & RoleBit(c.role)) == 0) continue;
    Copy& copy = c.copy[hold.tier];
    if (!back) {
      out[c.role] = std::exchange(copy.unchecked, Unchecked());
      c.checking = out[c.role].digest != nullptr;
    } else {
      c.checking = false;
      if (copy.usable() && out[c.role].digest != nullptr) {
        copy.unchecked = out[c.role];
      }
    }
  }
}

Status Residency::CheckNotLost(const Chunk& c) const {
  if (c.lost.empty()) return Status();
  return Status::DataLoss(Describe(c) + " was lost: " + c.lost +
                          ". Load the last checkpoint");
}

Status Residency::CheckHost(Lock& lk, int id) {
  Copy& copy = chunks_[id].copy[Tier::kHost];
  const Unchecked read = copy.unchecked;
  if (read.digest == nullptr) return Status();
  const uint64_t serial = copy.serial;
  const char* bytes = static_cast<const char*>(copy.ptr);
  ++copy.readers;
  lk.unlock();
  const tier::Segment* bad = tier::FirstMismatch(*read.digest, bytes);
  const uint64_t got =
      bad == nullptr ? 0 : tier::Hash(bytes + bad->offset, bad->bytes);
  lk.lock();
  Copy& after = CopyBySerial(id, Tier::kHost, serial);
  --after.readers;
  changed_.notify_all();
  FreeIfUnheld(serial);  // a copy retired meanwhile
  // The mark ends here, unless another check or the fetch that took it
  // over ended it meanwhile. A corrupt copy goes stale; one pinned already
  // (by a fetch that verifies it in its pass, still placing its other
  // chunks) keeps its mark, which that fetch takes over.
  if (after.unchecked.digest == read.digest) {
    if (bad == nullptr) {
      after.unchecked = Unchecked();
    } else if (after.pins == 0) {
      after.unchecked = Unchecked();
      if (after.usable()) after.state = CopyState::kStale;
    }
  }
  if (bad == nullptr) return Status();
  return Named(Describe(chunks_[id]), nvme_->Mismatch(read.extent, *bad, got));
}

}  // namespace strata::store
