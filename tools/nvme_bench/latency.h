// Latency histogram for strata-nvme-bench: log-linear buckets (64 per power
// of two, so a percentile is within 1.6% of the true value), lock-free
// recording from any thread, fixed memory whatever the run length.
#ifndef STRATA_TOOLS_NVME_BENCH_LATENCY_H_
#define STRATA_TOOLS_NVME_BENCH_LATENCY_H_

#include <array>
#include <atomic>
#include <cstdint>

namespace strata::bench {

class LatencyHistogram {
 public:
  static constexpr int kSubBits = 6;
  static constexpr int kSub = 1 << kSubBits;
  static constexpr int kOctaves = 64 - kSubBits;
  static constexpr int kBuckets = kSub * (kOctaves + 1);

  void Record(uint64_t ns);
  void Merge(const LatencyHistogram& other);
  uint64_t count() const;
  // Exact, not bucketed: the smallest, largest and mean sample (ns); 0 when
  // empty.
  uint64_t min() const;
  uint64_t max() const { return max_.load(std::memory_order_relaxed); }
  double mean() const;
  // Value (ns) below which `fraction` (0..1] of the samples fall; the
  // midpoint of the bucket holding that rank. 0 when empty.
  double Percentile(double fraction) const;

  static int BucketOf(uint64_t ns);
  static uint64_t BucketLow(int bucket);
  static uint64_t BucketHigh(int bucket);  // exclusive

 private:
  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
  std::atomic<uint64_t> min_{UINT64_MAX};
  std::atomic<uint64_t> max_{0};
  std::atomic<uint64_t> sum_{0};
};

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_LATENCY_H_
