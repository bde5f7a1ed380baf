#include "tools/nvme_bench/latency.h"

#include <bit>

namespace strata::bench {

// Values below kSub get one bucket each; above, an octave [2^e, 2^(e+1)) is
// split into kSub equal sub-buckets.
int LatencyHistogram::BucketOf(uint64_t ns) {
  if (ns < kSub) return static_cast<int>(ns);
  const int msb = 63 - std::countl_zero(ns);
  const int shift = msb - kSubBits;
  const auto sub = static_cast<int>((ns >> shift) & (kSub - 1));
  return (shift + 1) * kSub + sub;
}

uint64_t LatencyHistogram::BucketLow(int bucket) {
  if (bucket < kSub) return static_cast<uint64_t>(bucket);
  const int shift = bucket / kSub - 1;
  const uint64_t sub = static_cast<uint64_t>(bucket % kSub);
  return (uint64_t{kSub} + sub) << shift;
}

uint64_t LatencyHistogram::BucketHigh(int bucket) {
  if (bucket < kSub) return static_cast<uint64_t>(bucket) + 1;
  const int shift = bucket / kSub - 1;
  return BucketLow(bucket) + (uint64_t{1} << shift);
}

namespace {

void Lower(std::atomic<uint64_t>& to, uint64_t v) {
  uint64_t cur = to.load(std::memory_order_relaxed);
  while (v < cur &&
         !to.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

void Raise(std::atomic<uint64_t>& to, uint64_t v) {
  uint64_t cur = to.load(std::memory_order_relaxed);
  while (v > cur &&
         !to.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace

void LatencyHistogram::Record(uint64_t ns) {
  counts_[BucketOf(ns)].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(ns, std::memory_order_relaxed);
  Lower(min_, ns);
  Raise(max_, ns);
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  for (int i = 0; i < kBuckets; ++i) {
    counts_[i].fetch_add(other.counts_[i].load(std::memory_order_relaxed),
                         std::memory_order_relaxed);
  }
  sum_.fetch_add(other.sum_.load(std::memory_order_relaxed),
                 std::memory_order_relaxed);
  Lower(min_, other.min_.load(std::memory_order_relaxed));
  Raise(max_, other.max_.load(std::memory_order_relaxed));
}

uint64_t LatencyHistogram::min() const {
  const uint64_t m = min_.load(std::memory_order_relaxed);
  return m == UINT64_MAX ? 0 : m;
}

double LatencyHistogram::mean() const {
  const uint64_t n = count();
  return n > 0 ? static_cast<double>(sum_.load(std::memory_order_relaxed)) / n
               : 0;
}

uint64_t LatencyHistogram::count() const {
  uint64_t n = 0;
  for (const auto& c : counts_) n += c.load(std::memory_order_relaxed);
  return n;
}

double LatencyHistogram::Percentile(double fraction) const {
  const uint64_t total = count();
  if (total == 0) return 0;
  // Rank of the sample, 1-based: the smallest value with at least
  // fraction*total samples at or below it.
  auto rank = static_cast<uint64_t>(fraction * static_cast<double>(total));
  if (rank == 0) rank = 1;
  if (rank > total) rank = total;
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += counts_[i].load(std::memory_order_relaxed);
    if (seen >= rank) {
      return (static_cast<double>(BucketLow(i)) +
              static_cast<double>(BucketHigh(i) - 1)) /
             2;
    }
  }
  return static_cast<double>(BucketLow(kBuckets - 1));
}

}  // namespace strata::bench
