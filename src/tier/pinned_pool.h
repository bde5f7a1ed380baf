// The pinned host tier: one slab of locked host memory under a byte budget,
// handed out in size classes and registered once with aio.
//
// How the slab is obtained, best first:
// - from the device's host allocator (`host_allocator`, cudaHostAlloc on a
//   GPU) when there is one and `lock` is not kOff, so copies to and from
//   the device run at full speed;
// - otherwise mmap, backed by explicit huge pages (MAP_HUGETLB) when the
//   system has them reserved, else transparent huge pages (madvise), else
//   4 KiB pages; then mlock.
// Every page is faulted in at creation, locked or not, so the first
// transfer does not pay for page faults.
// The slab is placed on a NUMA node through libnuma: `numa_node` when set,
// else the GPU's node when known, else the calling thread's node.
//
// Budget: the budget is rounded up to a whole 4 KiB page; info().budget is
// the rounded value and no more than that is ever handed out. With huge
// pages the mapping itself is rounded up to 2 MiB (the tail is never used).
//
// Size classes: a request is rounded up to a class (4 classes per power of
// two, at least 4 KiB, always whole 4 KiB pages), so memory freed by one
// chunk fits the next chunk of the same class and the slab does not
// shatter. Ranges come from a best-fit RangeAllocator over the slab.
//
// Locking: LockMode::kRequired turns an mlock failure into an error that
// names RLIMIT_MEMLOCK and how to raise it; kBestEffort prints that advice
// once per process and runs unlocked; kOff never locks (and so never uses
// the device's host allocator, whose memory is always pinned).
//
// Ownership and thread safety: the pool owns the slab; Allocate/Free/stats
// may be called from any thread. The pool registers the slab with the aio
// engine it is given (fixed buffers) and unregisters it on destruction, so
// the engine must outlive the pool, and no aio request may still use pool
// memory when the pool is destroyed (that aborts).
//
// Failure: Create() returns kInvalidArgument for a zero budget or a NUMA
// node that does not exist, kResourceExhausted when the memory cannot be
// mapped or (kRequired) locked, and the engine's error when registration
// fails. Allocate() beyond the budget returns kResourceExhausted. Freeing a
// pointer that Allocate() did not return, or freeing it twice, aborts.
#ifndef STRATA_SRC_TIER_PINNED_POOL_H_
#define STRATA_SRC_TIER_PINNED_POOL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "strata/aio.h"
#include "strata/status.h"

namespace strata::tier {

class HostAllocator;  // src/tier/device.h

enum class LockMode { kRequired, kBestEffort, kOff };

struct PinnedPoolOptions {
  uint64_t budget = 0;     // bytes; > 0
  int numa_node = -1;      // -1: the GPU's node when known, else the caller's
  int gpu_numa_node = -1;  // the device's node, when the device knows it
  LockMode lock = LockMode::kBestEffort;
  bool huge_pages = true;
  // The device's (Device::host_allocator()), or null; it must outlive the
  // pool.
  HostAllocator* host_allocator = nullptr;
};

struct PinnedPoolInfo {
  std::string backing;  // the host allocator's name ("cudaHostAlloc"),
                        // "mmap+hugetlb", "mmap+thp" or "mmap"
  bool locked = false;
  bool registered = false;  // registered with aio as fixed buffers
  int numa_node = -1;       // -1 when unknown
  uint64_t budget = 0;
};

struct PinnedPoolStats {
  uint64_t current = 0;      // bytes handed out now (after size-class rounding)
  uint64_t peak = 0;         // most bytes handed out at once
  uint64_t allocated = 0;    // bytes handed out since creation
  uint64_t freed = 0;        // bytes returned since creation
  uint64_t allocations = 0;  // number of Allocate() calls that succeeded
  uint64_t frees = 0;        // number of Free() calls
};

class PinnedPool {
 public:
  // `engine` may be null (no registration).
  static Result<std::unique_ptr<PinnedPool>> Create(
      const PinnedPoolOptions& options, aio::Engine* engine);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // The size class `bytes` is served from: a multiple of 4096 (at least
  // 4096), >= bytes, and wasting less than max(4096, bytes / 4) bytes.
  // Defined for bytes <= 2^62 (more is a bug: abort).
  static uint64_t SizeClass(uint64_t bytes);

  // 4096-aligned memory of SizeClass(bytes) bytes, or kResourceExhausted
  // naming the tier, the bytes asked for, the bytes free and the budget.
  Result<void*> Allocate(uint64_t bytes);
  // Returns memory from Allocate(); anything else aborts.
  void Free(void* ptr);
  // Whether [ptr, ptr+bytes) lies inside the slab.
  bool Contains(const void* ptr, uint64_t bytes) const;

  const PinnedPoolInfo& info() const;
  PinnedPoolStats stats() const;
  uint64_t free_bytes() const;  // info().budget - stats().current

  class Impl;

 private:
  explicit PinnedPool(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::tier

#endif  // STRATA_SRC_TIER_PINNED_POOL_H_
