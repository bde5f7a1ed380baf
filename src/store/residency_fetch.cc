// The residency manager's demand fetches: checking one, placing and pinning
// its chunks (Note [Eviction order]), counting what it found, and the
// writes a write fetch begins. The contract is in residency.h; the rest of
// the public entry points are in residency.cc.
#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "common/interrupt.h"
#include "src/store/residency.h"

namespace strata::store {

Status Residency::CheckFetch(int group, Tier tier,
                             const FetchOptions& opt) const {
  if (group < 0 || group >= static_cast<int>(groups_.size())) {
    return Status::InvalidArgument("no group " + std::to_string(group) + " (" +
                                   std::to_string(groups_.size()) +
                                   " registered)");
  }
  if (tier == Tier::kNvme) {
    return Status::InvalidArgument(
        "cannot fetch to NVMe: fetch to the device or the host");
  }
  const GroupLayout& layout = groups_[group].layout;
  if (tier == Tier::kDevice &&
      (opt.roles & layout.roles & ~layout.device_roles) != 0) {
    return Status::InvalidArgument(
        "group '" + layout.name +
        "': a role asked for is not in its placement's "
        "device_roles; fetch it to the host");
  }
  if (opt.discard && !opt.write) {
    return Status::InvalidArgument(
        "FetchOptions::discard needs write: a discard fetch hands out "
        "memory whose tensor bytes are undefined until the caller writes "
        "them all");
  }
  if ((opt.roles & layout.roles) == 0) {
    return Status::InvalidArgument("group '" + layout.name +
                                   "' has none of the requested roles");
  }
  return Status();
}

// A write fetch is all or nothing: its chunks are made valid and pinned
// first, and only once every one is there, with no transfer reading it, do
// the other copies become stale. A fetch that fails part-way has changed no
// copy anywhere.
Result<Residency::Fetched> Residency::Fetch(int group, Tier tier,
                                            const FetchOptions& opt) {
  Access access;
  (opt.write ? (opt.discard ? access.overwrite : access.update) : access.read) =
      opt.roles;
  return FetchFor(group, tier, opt, access, false);
}

Result<Residency::Fetched> Residency::FetchToHost(int group,
                                                  const Access& access,
                                                  bool speculative) {
  return FetchFor(
      group, Tier::kHost,
      {.roles = access.all(), .write = access.written() != 0, .record = false},
      access, speculative);
}

Result<Residency::Fetched> Residency::FetchFor(int group, Tier tier,
                                               const FetchOptions& opt,
                                               const Access& access,
                                               bool speculative) {
  STRATA_CHECK((access.checked & ~access.written()) == 0 &&
               "a fetch checks only the roles it writes");
  Lock lk(mu_);
  STRATA_RETURN_IF_ERROR(CheckFetch(group, tier, opt));
  if (opt.record && trace_.in_step()) {
    position_ =
        trace_.OnFetch({.group = group, .tier = tier, .roles = opt.roles});
  }
  const int position = opt.record ? position_ : -1;
  Hold hold;
  hold.group = group;
  hold.tier = tier;
  hold.thread = std::this_thread::get_id();
  std::vector<int> ids = ChunksOf(group, opt.roles);
  FetchTally tally;
  Status placed = PinAll(lk, ids, opt, access, hold, tally);
  // Note [Eviction order]: the fetch's own copies split the room that
  // eviction made; they go, and are placed again into all of it, with
  // prefetches kept out meanwhile; then once more with every cached copy
  // gone.
  for (int again = 0;
       again < 2 && placed.code() == StatusCode::kResourceExhausted; ++again) {
    ++placing_[tier];
    placed = again == 0 ? DropUnpinned(lk, ids, tier)
                        : MakeRoomInOnePiece(lk, ids, tier);
    tally.Restart();
    if (placed.ok()) placed = PinAll(lk, ids, opt, access, hold, tally);
    --placing_[tier];
  }
  if (opt.record) Count(ids.size(), tally);
  STRATA_RETURN_IF_ERROR(placed);
  Fetched fetched;
  HandOverChecks(hold, access.checked, fetched.unchecked, false);
  if (Status s = BeginWrites(lk, hold, access, speculative); !s.ok()) {
    HandOverChecks(hold, access.checked, fetched.unchecked, true);
    return s;
  }
  if (opt.record && access.written() != 0) {
    const uint64_t serial = ++caller_writes_;
    for (int id : hold.chunks) {
      if (!Writes(hold, id)) continue;
      chunks_[id].caller_fetch = serial;
      chunks_[id].caller_version = chunks_[id].version;
    }
  }
  fetched.position = position;
  for (size_t i = 0; i < hold.chunks.size(); ++i) {
    const int id = hold.chunks[i];
    fetched.base[chunks_[id].role] =
        static_cast<char*>(CopyBySerial(id, tier, hold.serials[i]).ptr);
  }
  const uint64_t pin = next_pin_++;
  holds_.emplace(pin, std::move(hold));
  fetched.pin = internal::PinOwner::Make(pin_owner_, pin);
  fetched.hold = pin;
  return fetched;
}

Status Residency::BeginWrites(Lock& lk, Hold& hold, const Access& access,
                              bool speculative) {
  if (access.written() == 0) return Status();
  // A writer from now on: no other tier's write fetch makes the copies
  // stale (and so retirable) while this one waits for their readers.
  hold.written = access.written();
  for (int id : hold.chunks) chunks_[id].writers += Writes(hold, id);
  if (speculative) {
    if (Status s = WriteDownForSpeculation(lk, hold); !s.ok()) {
      Unpin(hold);
      return s;
    }
  }
  auto unread = [&] {
    for (int id : hold.chunks) {
      if (Writes(hold, id) && chunks_[id].copy[hold.tier].readers > 0) {
        return false;
      }
    }
    return true;
  };
  if (Status s = internal::WaitUntil(changed_, lk, unread,
                                     "transfers copying from the copies");
      !s.ok()) {
    Unpin(hold);
    return s;
  }
  hold.versions.assign(hold.chunks.size(), 0);
  for (size_t i = 0; i < hold.chunks.size(); ++i) {
    Chunk& c = chunks_[hold.chunks[i]];
    if (!Writes(hold, hold.chunks[i])) continue;
    if (speculative) StartSpeculation(c);
    Invalidate(c, &hold.tier);
    if ((access.overwrite & RoleBit(c.role)) != 0) c.lost.clear();
    hold.versions[i] = c.version;
  }
  return Status();
}

// Fetch's chunks made valid and pinned at hold.tier, largest first: each is
// placed while the tier has the most room in one piece, so the fetch's own
// small chunks cannot split the room a large one needs. On failure nothing
// stays pinned.
Status Residency::PinAll(Lock& lk, std::vector<int>& ids,
                         const FetchOptions& opt, const Access& access,
                         Hold& hold, FetchTally& tally) {
  std::stable_sort(ids.begin(), ids.end(), [this](int a, int b) {
    return chunks_[a].bytes > chunks_[b].bytes;
  });
  for (int id : ids) {
    const RoleMask role = RoleBit(chunks_[id].role);
    const ChunkAccess how{.write = (access.written() & role) != 0,
                          .discard = (access.overwrite & role) != 0,
                          .checked = (access.checked & role) != 0,
                          .stream = opt.stream};
    if (Status s = FetchChunk(lk, id, hold.tier, how, tally); !s.ok()) {
      Unpin(hold);
      hold.chunks.clear();
      hold.serials.clear();
      return s;
    }
    hold.chunks.push_back(id);
    hold.serials.push_back(chunks_[id].copy[hold.tier].serial);
  }
  return Status();
}

// The fetch's own copies dropped and, once no copy at the tier is in
// flight, every other unpinned cached one too, so that the room is in one
// piece again (and best fit packs the fetch from its bottom).
Status Residency::MakeRoomInOnePiece(Lock& lk, const std::vector<int>& ids,
                                     Tier tier) {
  STRATA_RETURN_IF_ERROR(DropUnpinned(lk, ids, tier));
  STRATA_RETURN_IF_ERROR(internal::WaitUntil(
      changed_, lk, [&] { return !AnyBusy(tier); }, "copies in flight"));
  return EvictCached(lk, tier);
}

// Drops the copies of `ids` at `tier` that nothing holds (not homes).
Status Residency::DropUnpinned(Lock& lk, const std::vector<int>& ids,
                               Tier tier) {
  for (int id : ids) {
    const Chunk& c = chunks_[id];
    const Copy& copy = c.copy[tier];
    if (c.home == tier || !copy.allocated() || copy.busy() || copy.pins > 0 ||
        copy.readers > 0 || copy.fenced()) {
      continue;
    }
    STRATA_RETURN_IF_ERROR(Drop(lk, id, tier));
  }
  return Status();
}

// Makes one chunk valid at `tier` for a demand fetch and pins it there,
// tallying what the fetch found; Fetch makes it writable.
Status Residency::FetchChunk(Lock& lk, int id, Tier tier,
                             const ChunkAccess& how, FetchTally& tally) {
  const Chunk& c = chunks_[id];
  Copy& dst = chunks_[id].copy[tier];
  const bool prefetched = dst.prefetched;
  tally.late += dst.busy() && prefetched;
  STRATA_ASSIGN_OR_RETURN(const bool landing, PinLanding(id, tier, how));
  if (landing) return Status();
  const auto start = std::chrono::steady_clock::now();
  bool hit = false;
  Status s = Ensure(lk, id, tier, Reason::For(how.discard), &hit);
  // A write fetch hands its copy out only once no transfer is still copying
  // from it; a copy whose NVMe read is unchecked, once checked or to the
  // fetch that checks it, and not while a pass checks it (Note [Unchecked
  // host copies]). The copy may move meanwhile, so ensure it again.
  while (s.ok()) {
    if (how.discard) dst.unchecked = Unchecked();  // its bytes do not matter
    const bool check = dst.unchecked.digest != nullptr && !how.checked;
    const bool checking = c.checking && !how.checked;
    if (!check && !checking && !(how.write && dst.readers > 0)) break;
    hit = hit && check;  // a check is not a miss; a wait is a stall
    if (check) {
      s = CheckHost(lk, id);
    } else if (checking) {
      s = CheckSelfWait(c, id, tier);
      if (s.ok()) {
        s = internal::WaitOnce(changed_, lk, "a pass verifying what it read");
      }
    } else {
      s = internal::WaitOnce(changed_, lk, "a transfer copying from the copy");
    }
    if (s.ok()) s = Ensure(lk, id, tier, Reason::For(how.discard), nullptr);
  }
  tally.hits += hit;
  tally.prefetch_hits += hit && prefetched;
  if (!hit) {
    tally.stall +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  }
  if (!s.ok()) return s;
  ++dst.pins;
  dst.last_use = ++clock_;
  return Status();
}

void Residency::Count(size_t chunks, const FetchTally& tally) {
  counters_.fetches += chunks;
  counters_.hits += tally.hits;
  counters_.prefetch_hits += tally.prefetch_hits;
  counters_.late_prefetches += tally.late;
  counters_.stall_seconds += tally.stall;
}

Result<bool> Residency::PinLanding(int id, Tier tier, const ChunkAccess& how) {
  const Chunk& c = chunks_[id];
  Copy& dst = chunks_[id].copy[tier];
  if (how.stream == nullptr || how.write || c.writers > 0 ||
      dst.state != CopyState::kFilling || dst.landing.impl() == nullptr) {
    return false;
  }
  STRATA_RETURN_IF_ERROR(device_->StreamWait(how.stream, dst.landing));
  ++dst.pins;
  dst.last_use = ++clock_;
  return true;
}

}  // namespace strata::store
