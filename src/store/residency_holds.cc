// The residency manager's holds: releasing a fetch's pins (with fences,
// Note [Fences], and the prefetch of what a write below the device left
// stale there, Note [Updates below the device]), the copies retired for
// the views that still hold them (Note [Retired copies]) and the waits a
// caller could only end itself (Note [Waits the caller could end]). The
// contract is in residency.h.
#include <utility>

#include "common/thread_name.h"
#include "src/store/residency.h"

namespace strata::store {

// Note [Retired copies]
// A write at one tier makes the copies at the others stale, and a read
// view may hold one of them. Its bytes stay as they were for that view.
// But the engine never waits for such a view's release (its holder may be
// the very thread that waits, which then never returns): a move that needs
// the tier's copy (a fetch there, a write-down into it) retires the held
// copy instead. The retired copy leaves the chunk, with its memory, pins
// and fences, and is freed when the last of them ends; the chunk gets a
// fresh copy at that tier (a home one too: the retired memory then comes
// back as the home copy when it is freed before a fresh one could be
// placed). Each hold names the copy it pinned by serial, so a release
// finds it wherever it went. Retired memory counts against the tier's
// budget like any pinned copy: when nothing can be evicted for the fresh
// copy, the move fails naming the views.
//
// Note [Waits the caller could end]
// Every wait in the residency is ended by another thread: a transfer, the
// fence watcher, or the release of a write view held by another thread.
// A demand fetch that would wait for a write view held by its own thread
// (fetched by it and not released) could wait forever, so it fails with
// kFailedPrecondition naming that view instead.
//
// Note [Fences]
// A GPU runs a caller's kernels long after the CPU queued them, so the end
// of a fetch's pin on the CPU is not the end of its use: kernels may still
// read (or write) the views. A release may therefore name a fence (Fence in
// strata/engine.h, a point on the caller's stream), recorded as a device
// event. Until it completes, the copies the pin held count as in use: they
// are not evicted, not filled, not written down into and not copied from
// (`fences` on the copy; every move that waits for a busy copy also waits
// for a fenced one). The fence watcher thread waits for each fence in
// turn, then clears it and wakes the waiters, so no training thread blocks
// on one. Gradients handed off with a fence are copied to the host on a
// stream ordered after it (Mover::Start). This is the bug class that
// silently corrupts training on a GPU and can never show on a CPU, whose
// "kernels" are done when the call returns: tests model late kernels with
// tests/testutil/fake_stream.h.

// Note [Updates below the device]
// The optimizer writes a group's new compute copy at its home, below the
// device, and so leaves the device copy stale. The plan is for a steady
// state in which only fetches happen: a group the device window keeps was
// never prefetched, and the next forward's first fetch of it waited for
// its copy (0.09 to 0.11 s a step for a 107M-parameter model on the
// host-emulated device; on a GPU, a stall per group over PCIe). So the
// release of a write hold below the device reports the roles it wrote that
// the trace fetches to the device, with the trace position of the first
// such fetch (RefetchHook), and the engine queues a planned prefetch for
// that position: it evicts nothing needed before it (Note [Eviction
// order]), lands while the step's backward or the next forward runs, and
// is abandoned when no room is free. An update that lands under the next
// forward (pending) releases its hold later, and the prefetch follows it.

Status Residency::Release(uint64_t pin, const Fence& after) {
  STRATA_ASSIGN_OR_RETURN(tier::Event fence, device_->Record(after));
  Lock lk(mu_);
  const auto it = holds_.find(pin);
  if (it == holds_.end()) {
    return Status::FailedPrecondition(
        "release of pin " + std::to_string(pin) +
        ", which this engine does not hold: released twice, or not its own");
  }
  const Hold hold = std::move(it->second);
  holds_.erase(it);
  if (!fence.Poll()) {
    for (size_t i = 0; i < hold.chunks.size(); ++i) {
      ++CopyBySerial(hold.chunks[i], hold.tier, hold.serials[i]).fences;
    }
    fenced_.push_back({std::move(fence), hold.tier, hold.chunks, hold.serials});
    fence_added_.notify_one();
  }
  Unpin(hold);
  const Refetch again = RefetchOf(hold);
  lk.unlock();
  if (again.roles != 0) {
    std::lock_guard<std::mutex> hook_lock(hook_mu_);
    if (refetch_hook_) refetch_hook_(hold.group, again.roles, again.position);
  }
  return Status();
}

void Residency::AttachDigest(uint64_t hold, Role role,
                             std::shared_ptr<const tier::Digest> digest) {
  Lock lk(mu_);
  const auto it = holds_.find(hold);
  STRATA_CHECK(it != holds_.end());
  const Hold& h = it->second;
  for (size_t i = 0; i < h.chunks.size(); ++i) {
    Chunk& c = chunks_[h.chunks[i]];
    if (c.role != role) continue;
    STRATA_CHECK(Writes(h, h.chunks[i]));
    if (c.version != h.versions[i]) return;  // another write fetch began
    c.digest = std::move(digest);
    c.digest_version = c.version;
  }
}

void Residency::SetRefetchHook(RefetchHook hook) {
  std::lock_guard<std::mutex> lock(hook_mu_);
  refetch_hook_ = std::move(hook);
}

Residency::Refetch Residency::RefetchOf(const Hold& hold) const {
  if (hold.tier == Tier::kDevice || hold.written == 0 || !trace_.valid()) {
    return {};
  }
  const std::vector<sched::TraceEntry>& entries = trace_.entries();
  for (int p : trace_.UsesOf(hold.group)) {
    const RoleMask roles = entries[p].roles & hold.written;
    if (entries[p].tier == Tier::kDevice && roles != 0) return {roles, p};
  }
  return {};
}

void Residency::Unpin(const Hold& hold) {
  for (size_t i = 0; i < hold.chunks.size(); ++i) {
    const int id = hold.chunks[i];
    --CopyBySerial(id, hold.tier, hold.serials[i]).pins;
    FreeIfUnheld(hold.serials[i]);
    if (Writes(hold, id)) {
      // Its pass verified the bytes it was handed, or lost them.
      --chunks_[id].writers;
      chunks_[id].checking = false;
    }
  }
  changed_.notify_all();
}

void Residency::WatchFences() {
  NameThisThread("strata-fences");
  Lock lk(mu_);
  for (;;) {
    fence_added_.wait(lk, [this] { return stopping_ || !fenced_.empty(); });
    if (fenced_.empty()) return;
    const tier::Event event = fenced_.front().event;
    lk.unlock();
    // A failure of the caller's own work is the caller's to report; the
    // memory is free either way once the event is done.
    (void)event.Wait();
    lk.lock();
    const Fenced done = std::move(fenced_.front());
    fenced_.pop_front();
    for (size_t i = 0; i < done.chunks.size(); ++i) {
      --CopyBySerial(done.chunks[i], done.tier, done.serials[i]).fences;
      FreeIfUnheld(done.serials[i]);
    }
    changed_.notify_all();
  }
}

Residency::Copy& Residency::CopyBySerial(int id, Tier tier, uint64_t serial) {
  Copy& own = chunks_[id].copy[tier];
  if (own.serial == serial) return own;
  const auto it = retired_.find(serial);
  STRATA_CHECK(it != retired_.end() && "a hold names a copy that is gone");
  return it->second.copy;
}

void Residency::Detach(int id, Tier tier) {
  Copy& copy = chunks_[id].copy[tier];
  STRATA_CHECK(HeldStale(copy));
  retired_.emplace(copy.serial, RetiredCopy{id, tier, copy});
  copy = Copy();
  changed_.notify_all();
}

Status Residency::Retire(Lock& lk, int id, Tier tier, Reason why) {
  const uint64_t serial = chunks_[id].copy[tier].serial;
  Detach(id, tier);
  // A fresh home is held for good: allocated as registration does, with
  // no cached copy in its way (Note [Eviction order]).
  Status status = chunks_[id].home == tier ? EvictCached(lk, tier) : Status();
  if (status.ok()) status = Allocate(lk, id, tier, why);
  Chunk& c = chunks_[id];
  if (!status.ok() && c.home == tier && !c.copy[tier].allocated()) {
    // A home copy is never absent: the retired memory is the home again
    // (FreeIfUnheld did this already if its views were released meanwhile).
    const auto it = retired_.find(serial);
    c.copy[tier] = it->second.copy;
    retired_.erase(it);
  }
  return status;
}

void Residency::FreeIfUnheld(uint64_t serial) {
  const auto it = retired_.find(serial);
  if (it == retired_.end()) return;
  Copy& copy = it->second.copy;
  if (copy.pins > 0 || copy.readers > 0 || copy.fenced()) return;
  Chunk& c = chunks_[it->second.chunk];
  const Tier tier = it->second.tier;
  if (c.home == tier && !c.copy[tier].allocated()) {
    c.copy[tier] = copy;  // stale: a write elsewhere holds the bytes
  } else {
    FreeMemory(tier, copy);
  }
  retired_.erase(it);
  changed_.notify_all();
}

Status Residency::CheckSelfWait(const Chunk& c, int id, Tier tier) const {
  const std::thread::id self = std::this_thread::get_id();
  for (const auto& [pin, hold] : holds_) {
    if (hold.thread != self) continue;
    for (int held : hold.chunks) {
      if (held != id || !Writes(hold, held)) continue;
      return Status::FailedPrecondition(
          Describe(c) + " is fetched for writing on " + TierLabel(hold.tier) +
          " by this thread and not released, so a fetch of it on " +
          TierLabel(tier) +
          " would wait for this thread itself; release the write view "
          "first (Note [Waits the caller could end])");
    }
  }
  return Status();
}

}  // namespace strata::store
