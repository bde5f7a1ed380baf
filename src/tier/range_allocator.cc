#include "src/tier/range_allocator.h"

#include <iterator>

#include "strata/status.h"

namespace strata::tier {
namespace {

// Checked before capacity_ is rounded with it: a zero alignment would
// otherwise divide by zero before any check could run.
uint64_t CheckedAlignment(uint64_t alignment) {
  STRATA_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0);
  return alignment;
}

}  // namespace

RangeAllocator::RangeAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity & ~(CheckedAlignment(alignment) - 1)),
      alignment_(alignment) {
  if (capacity_ > 0) InsertFree(0, capacity_);
}

uint64_t RangeAllocator::RoundUp(uint64_t bytes) const {
  if (bytes == 0) return alignment_;
  return (bytes + alignment_ - 1) & ~(alignment_ - 1);
}

std::optional<uint64_t> RangeAllocator::Allocate(uint64_t bytes) {
  if (bytes > capacity_) return std::nullopt;
  const uint64_t size = RoundUp(bytes);
  auto fit = free_by_size_.lower_bound({size, 0});
  if (fit == free_by_size_.end()) return std::nullopt;
  const uint64_t offset = fit->second;
  const uint64_t free_size = fit->first;
  EraseFree(free_by_offset_.find(offset));
  if (free_size > size) InsertFree(offset + size, free_size - size);
  allocated_.emplace(offset, size);
  used_ += size;
  return offset;
}

void RangeAllocator::Free(uint64_t offset) {
  auto it = allocated_.find(offset);
  STRATA_CHECK(it != allocated_.end());
  uint64_t start = offset;
  uint64_t size = it->second;
  used_ -= size;
  allocated_.erase(it);
  auto next = free_by_offset_.lower_bound(start);
  if (next != free_by_offset_.end() && next->first == start + size) {
    size += next->second;
    next = std::next(next);
    EraseFree(std::prev(next));
  }
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      EraseFree(prev);
    }
  }
  InsertFree(start, size);
}

uint64_t RangeAllocator::SizeOf(uint64_t offset) const {
  auto it = allocated_.find(offset);
  STRATA_CHECK(it != allocated_.end());
  return it->second;
}

uint64_t RangeAllocator::largest_free() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

void RangeAllocator::InsertFree(uint64_t offset, uint64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void RangeAllocator::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

}  // namespace strata::tier
