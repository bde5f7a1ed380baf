// RangeAllocator: best-fit allocation of aligned ranges inside [0, capacity).
//
// The one allocator behind every tier: the device arena, the pinned host
// pool and the NVMe extent store all carve their memory or file space from
// one big region with it.
//
// Contract
// - Every offset and every allocated size is a multiple of `alignment`
//   (a power of two). A request is rounded up to the alignment.
// - Best fit: the smallest free range that holds the request; ties go to
//   the lowest offset, so a run of equal requests packs from the bottom.
// - Free ranges are coalesced with their neighbours on Free(), so a freed
//   region is whole again as soon as everything in it is freed.
// - Freeing an offset that is not allocated is a programming bug (abort).
// - Not synchronized: the tier that owns it holds its lock around calls.
#ifndef STRATA_SRC_TIER_RANGE_ALLOCATOR_H_
#define STRATA_SRC_TIER_RANGE_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace strata::tier {

class RangeAllocator {
 public:
  RangeAllocator(uint64_t capacity, uint64_t alignment);

  // The offset of a new range of at least `bytes` (rounded up to the
  // alignment), or nullopt when no free range is large enough.
  // `bytes` == 0 is treated as one alignment unit.
  std::optional<uint64_t> Allocate(uint64_t bytes);
  // Returns the range that starts at `offset` to the free lists.
  void Free(uint64_t offset);

  // The size actually reserved for the range at `offset` (aborts if none).
  uint64_t SizeOf(uint64_t offset) const;
  uint64_t RoundUp(uint64_t bytes) const;

  uint64_t capacity() const { return capacity_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t used() const { return used_; }
  uint64_t free_bytes() const { return capacity_ - used_; }
  uint64_t largest_free() const;
  size_t free_ranges() const { return free_by_offset_.size(); }
  size_t allocations() const { return allocated_.size(); }

 private:
  void InsertFree(uint64_t offset, uint64_t size);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_;
  uint64_t alignment_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_by_offset_;           // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (size, offset)
  std::map<uint64_t, uint64_t> allocated_;                // offset -> size
};

}  // namespace strata::tier

#endif  // STRATA_SRC_TIER_RANGE_ALLOCATOR_H_
