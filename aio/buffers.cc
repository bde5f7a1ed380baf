// Engine::RegisterBuffer's bookkeeping: which ranges are registered, in
// which fixed-buffer slot, and how many pieces in flight use each slot.
#include <algorithm>
#include <cstdio>
#include <mutex>

#include "aio/internal.h"

namespace strata::aio::internal {
namespace {

// The kernel takes at most 1 GiB per registered buffer.
constexpr size_t kMaxChunk = size_t{1} << 30;

void WarnUnregisteredOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::fprintf(stderr,
                 "strata aio: the kernel refused to register a buffer "
                 "(memlock limit?); serving it without fixed buffers\n");
  });
}

}  // namespace

BufferRegistry::BufferRegistry(Backend* backend, bool fixed)
    : backend_(backend),
      fixed_(fixed),
      slot_taken_(kMaxFixedBuffers, false),
      slot_users_(std::make_unique<std::atomic<int64_t>[]>(kMaxFixedBuffers)) {}

// Note [Buffer registration]
// Registering with the rings means running code on every ring thread, and a
// ring thread may itself be inside a completion callback that submits, i.e.
// that takes the registry's lock in Acquire(). So backend calls are never made
// under that lock: a registration is first reserved (slot taken, not live),
// then registered without the lock, then published. Pieces that use a slot
// are counted in slot_users_ from Submit() to their completion, and a buffer
// with users cannot be unregistered: the kernel would fail them with EFAULT.
Status BufferRegistry::Register(void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) {
    return Status::InvalidArgument("RegisterBuffer: null or empty buffer");
  }
  const uintptr_t owner = reinterpret_cast<uintptr_t>(data);
  STRATA_ASSIGN_OR_RETURN(std::vector<Registered> chunks,
                          Reserve(owner, bytes));
  if (Publish(owner, AddToBackend(chunks))) WarnUnregisteredOnce();
  return Status::Ok();
}

Result<std::vector<BufferRegistry::Registered>> BufferRegistry::Reserve(
    uintptr_t owner, size_t bytes) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (const Registered& r : ranges_) {
    if (owner < r.start + r.bytes && r.start < owner + bytes) {
      return Status::InvalidArgument(
          "RegisterBuffer: range overlaps a registered buffer");
    }
  }
  std::vector<Registered> chunks;
  for (size_t at = 0; at < bytes; at += kMaxChunk) {
    Registered reg{owner, owner + at, std::min(kMaxChunk, bytes - at), -1,
                   false};
    if (fixed_) {
      auto free = std::find(slot_taken_.begin(), slot_taken_.end(), false);
      if (free != slot_taken_.end()) {
        *free = true;
        reg.slot = static_cast<int>(free - slot_taken_.begin());
      }
    }
    chunks.push_back(reg);
    ranges_.insert(
        std::lower_bound(ranges_.begin(), ranges_.end(), reg,
                         [](const Registered& a, const Registered& b) {
                           return a.start < b.start;
                         }),
        reg);
  }
  return chunks;
}

std::vector<bool> BufferRegistry::AddToBackend(
    const std::vector<Registered>& chunks) {
  std::vector<bool> accepted(chunks.size(), false);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Registered& c = chunks[i];
    accepted[i] =
        c.slot >= 0 &&
        backend_->AddBuffer(c.slot, reinterpret_cast<void*>(c.start), c.bytes);
  }
  return accepted;
}

bool BufferRegistry::Publish(uintptr_t owner,
                             const std::vector<bool>& accepted) {
  bool refused = false;
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (Registered& r : ranges_) {
    if (r.owner != owner) continue;
    const size_t i = (r.start - owner) / kMaxChunk;
    if (accepted[i]) {
      r.live = true;
      continue;
    }
    if (r.slot >= 0) {
      slot_taken_[r.slot] = false;
      r.slot = -1;
      refused = true;
    }
    r.live = true;  // served without a fixed buffer
  }
  return refused;
}

Status BufferRegistry::Unregister(void* data) {
  const uintptr_t owner = reinterpret_cast<uintptr_t>(data);
  std::vector<int> slots;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    bool found = false;
    for (const Registered& r : ranges_) {
      if (r.owner != owner) continue;
      found = true;
      const int64_t users =
          r.slot >= 0 ? slot_users_[r.slot].load(std::memory_order_acquire) : 0;
      if (!r.live || users != 0) {
        return Status::FailedPrecondition(
            "UnregisterBuffer: requests using the buffer are "
            "still in flight (or it is still being registered); "
            "wait for them first");
      }
    }
    if (!found) {
      return Status::InvalidArgument(
          "UnregisterBuffer: buffer was not registered");
    }
    std::erase_if(ranges_, [&](const Registered& r) {
      if (r.owner != owner) return false;
      if (r.slot >= 0) slots.push_back(r.slot);
      return true;
    });
  }
  for (int slot : slots) backend_->RemoveBuffer(slot);
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (int slot : slots) slot_taken_[slot] = false;
  return Status::Ok();
}

int BufferRegistry::Acquire(const void* buf, size_t len) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf);
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = std::upper_bound(
      ranges_.begin(), ranges_.end(), p,
      [](uintptr_t v, const Registered& r) { return v < r.start; });
  if (it == ranges_.begin()) return -1;
  --it;
  if (!it->live || it->slot < 0 || p + len > it->start + it->bytes) return -1;
  slot_users_[it->slot].fetch_add(1, std::memory_order_relaxed);
  return it->slot;
}

void BufferRegistry::Release(int slot) {
  slot_users_[slot].fetch_sub(1, std::memory_order_release);
}

}  // namespace strata::aio::internal
