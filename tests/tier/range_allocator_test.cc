// RangeAllocator against a brute-force model of the same contract, plus the
// edge cases of its header.
#include "src/tier/range_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <vector>

namespace strata::tier {
namespace {

// The contract of range_allocator.h, the slow way: one flag per alignment
// unit, best fit found by scanning every free run.
class ModelAllocator {
 public:
  ModelAllocator(uint64_t capacity, uint64_t alignment)
      : alignment_(alignment), used_(capacity / alignment, false) {}

  std::optional<uint64_t> Allocate(uint64_t bytes) {
    const uint64_t units =
        bytes == 0 ? 1 : (bytes + alignment_ - 1) / alignment_;
    std::optional<Run> best;
    for (const Run& run : FreeRuns()) {
      if (run.units >= units && (!best || run.units < best->units)) best = run;
    }
    if (!best) return std::nullopt;
    for (uint64_t u = 0; u < units; ++u) used_[best->start + u] = true;
    sizes_[best->start] = units;
    return best->start * alignment_;
  }

  void Free(uint64_t offset) {
    const uint64_t start = offset / alignment_;
    for (uint64_t u = 0; u < sizes_.at(start); ++u) used_[start + u] = false;
    sizes_.erase(start);
  }

  uint64_t used() const {
    uint64_t units = 0;
    for (bool u : used_) units += u;
    return units * alignment_;
  }
  uint64_t largest_free() const {
    uint64_t units = 0;
    for (const Run& run : FreeRuns()) units = std::max(units, run.units);
    return units * alignment_;
  }
  size_t free_ranges() const { return FreeRuns().size(); }
  size_t allocations() const { return sizes_.size(); }
  uint64_t SizeOf(uint64_t offset) const {
    return sizes_.at(offset / alignment_) * alignment_;
  }
  std::vector<uint64_t> Offsets() const {
    std::vector<uint64_t> out;
    for (const auto& [start, units] : sizes_) out.push_back(start * alignment_);
    return out;
  }

 private:
  struct Run {
    uint64_t start;
    uint64_t units;
  };
  // Maximal runs of free units, lowest first.
  std::vector<Run> FreeRuns() const {
    std::vector<Run> runs;
    for (uint64_t u = 0; u < used_.size();) {
      if (used_[u]) {
        ++u;
        continue;
      }
      uint64_t end = u;
      while (end < used_.size() && !used_[end]) ++end;
      runs.push_back({u, end - u});
      u = end;
    }
    return runs;
  }

  uint64_t alignment_;
  std::vector<bool> used_;
  std::map<uint64_t, uint64_t> sizes_;  // first unit -> units
};

void ExpectSameState(const RangeAllocator& real, const ModelAllocator& model) {
  ASSERT_EQ(real.used(), model.used());
  ASSERT_EQ(real.free_bytes(), real.capacity() - model.used());
  ASSERT_EQ(real.largest_free(), model.largest_free());
  ASSERT_EQ(real.free_ranges(), model.free_ranges());
  ASSERT_EQ(real.allocations(), model.allocations());
}

// Thousands of random allocations and frees, some of them impossible, with
// every offset and every observable compared to the model after each step.
void RunRandomOps(uint64_t capacity, uint64_t alignment, uint32_t seed) {
  SCOPED_TRACE("capacity " + std::to_string(capacity) + ", alignment " +
               std::to_string(alignment) + ", seed " + std::to_string(seed));
  RangeAllocator real(capacity, alignment);
  ModelAllocator model(capacity, alignment);
  std::mt19937 rng(seed);
  std::vector<uint64_t> live;
  const uint64_t max_request = capacity / 6;
  for (int op = 0; op < 3000; ++op) {
    if (live.empty() || rng() % 100 < 55) {
      // Mostly small, unaligned requests; now and then one that cannot fit.
      const uint64_t bytes = rng() % 50 == 0 ? capacity + rng() % alignment + 1
                                             : rng() % (max_request + 1);
      const std::optional<uint64_t> got = real.Allocate(bytes);
      const std::optional<uint64_t> want = model.Allocate(bytes);
      ASSERT_EQ(got, want) << "op " << op << ": Allocate(" << bytes << ")";
      if (got) {
        ASSERT_EQ(*got % alignment, 0u);
        ASSERT_EQ(real.SizeOf(*got), model.SizeOf(*got));
        ASSERT_GE(real.SizeOf(*got), bytes);
        ASSERT_LE(*got + real.SizeOf(*got), real.capacity());
        live.push_back(*got);
      }
    } else {
      const size_t pick = rng() % live.size();
      real.Free(live[pick]);
      model.Free(live[pick]);
      live[pick] = live.back();
      live.pop_back();
    }
    ExpectSameState(real, model);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The model only accepts disjoint ranges, so equal offsets and sizes mean
  // the real ranges are disjoint too; check it directly all the same.
  std::vector<uint64_t> offsets = model.Offsets();
  for (size_t i = 1; i < offsets.size(); ++i) {
    ASSERT_LE(offsets[i - 1] + real.SizeOf(offsets[i - 1]), offsets[i]);
  }
  for (uint64_t offset : live) real.Free(offset);
  EXPECT_EQ(real.used(), 0u);
  EXPECT_EQ(real.allocations(), 0u);
  EXPECT_EQ(real.free_ranges(), 1u);  // everything coalesced again
  EXPECT_EQ(real.largest_free(), real.capacity());
}

TEST(RangeAllocatorTest, MatchesBruteForceModelOnRandomOps) {
  ASSERT_NO_FATAL_FAILURE(RunRandomOps(256 * 64, 64, 1));
  ASSERT_NO_FATAL_FAILURE(RunRandomOps(300 * 4096, 4096, 2));
  ASSERT_NO_FATAL_FAILURE(
      RunRandomOps(97 * 512 + 100, 512, 3));  // capacity not a multiple
  ASSERT_NO_FATAL_FAILURE(RunRandomOps(64, 1, 4));
}

TEST(RangeAllocatorTest, ZeroBytesTakesOneAlignmentUnit) {
  RangeAllocator a(4096, 256);
  const std::optional<uint64_t> off = a.Allocate(0);
  ASSERT_TRUE(off.has_value());
  EXPECT_EQ(a.SizeOf(*off), 256u);
  EXPECT_EQ(a.used(), 256u);
  EXPECT_EQ(a.RoundUp(0), 256u);
  EXPECT_EQ(a.RoundUp(257), 512u);
}

TEST(RangeAllocatorTest, ExactFitUsesEverythingAndFreesBackToOneRange) {
  RangeAllocator a(8192, 4096);
  ASSERT_EQ(a.Allocate(8192), std::optional<uint64_t>(0));
  EXPECT_EQ(a.free_bytes(), 0u);
  EXPECT_EQ(a.free_ranges(), 0u);
  EXPECT_EQ(a.largest_free(), 0u);
  EXPECT_EQ(a.Allocate(0), std::nullopt);
  a.Free(0);
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free(), 8192u);
}

TEST(RangeAllocatorTest, CapacityIsRoundedDownToTheAlignment) {
  RangeAllocator a(10000, 4096);
  EXPECT_EQ(a.capacity(), 8192u);
  EXPECT_EQ(a.Allocate(10000), std::nullopt);
  EXPECT_EQ(a.Allocate(8193), std::nullopt);
  EXPECT_TRUE(a.Allocate(8192).has_value());

  RangeAllocator tiny(100, 4096);  // smaller than one unit
  EXPECT_EQ(tiny.capacity(), 0u);
  EXPECT_EQ(tiny.free_ranges(), 0u);
  EXPECT_EQ(tiny.Allocate(0), std::nullopt);
}

TEST(RangeAllocatorTest, RequestsLargerThanCapacityFailWithoutSideEffects) {
  RangeAllocator a(1 << 20, 4096);
  ASSERT_TRUE(a.Allocate(4096).has_value());
  EXPECT_EQ(a.Allocate((1 << 20) + 1), std::nullopt);
  EXPECT_EQ(a.Allocate(std::numeric_limits<uint64_t>::max()), std::nullopt);
  EXPECT_EQ(a.used(), 4096u);
  EXPECT_EQ(a.allocations(), 1u);
  EXPECT_EQ(a.free_ranges(), 1u);
}

TEST(RangeAllocatorTest, BestFitPrefersTheSmallestHoleThenTheLowestOffset) {
  RangeAllocator a(16 * 4096, 4096);
  // Holes of 3, 1, 2 and 1 pages at pages 0, 4, 6 and 10, between 1-page
  // fences at pages 3, 5, 8, 9 and 11.
  const std::vector<uint64_t> pages = {3, 1, 1, 1, 2, 1, 1, 1, 1};
  std::vector<uint64_t> offsets;
  for (uint64_t n : pages) offsets.push_back(*a.Allocate(n * 4096));
  ASSERT_EQ(offsets[7], 10 * 4096u);
  for (size_t hole : {0, 2, 4, 7}) a.Free(offsets[hole]);
  // The tail from page 12 is 4 pages.
  EXPECT_EQ(a.Allocate(4096), std::optional<uint64_t>(4 * 4096));
  EXPECT_EQ(a.Allocate(4096), std::optional<uint64_t>(10 * 4096));
  EXPECT_EQ(a.Allocate(2 * 4096), std::optional<uint64_t>(6 * 4096));
  EXPECT_EQ(a.Allocate(4 * 4096), std::optional<uint64_t>(12 * 4096));
  EXPECT_EQ(a.Allocate(3 * 4096), std::optional<uint64_t>(0));
}

TEST(RangeAllocatorTest, FreeCoalescesWithBothNeighbours) {
  RangeAllocator a(3 * 4096, 4096);
  const uint64_t x = *a.Allocate(4096);
  const uint64_t y = *a.Allocate(4096);
  const uint64_t z = *a.Allocate(4096);
  a.Free(x);
  a.Free(z);
  EXPECT_EQ(a.free_ranges(), 2u);
  a.Free(y);
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free(), 3 * 4096u);
}

TEST(RangeAllocatorDeathTest, MisuseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(RangeAllocator(4096, 0), "check failed");
  EXPECT_DEATH(RangeAllocator(4096, 3), "check failed");
  RangeAllocator a(8192, 4096);
  ASSERT_TRUE(a.Allocate(4096).has_value());
  EXPECT_DEATH(a.Free(4096), "check failed");  // never allocated
  EXPECT_DEATH(a.SizeOf(4096), "check failed");
}

}  // namespace
}  // namespace strata::tier
