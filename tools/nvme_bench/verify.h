// strata-nvme-bench --verify: data integrity through the aio engine.
//
// Every 8-byte word of the file is a function of its offset and of the
// generation of the last write that covered it, so any read can be checked
// on its own and a lost, misplaced or torn write shows up. The run writes
// the whole file (generation 1), then issues random reads and writes of
// random aligned sizes at random aligned offsets, up to qd at a time and
// never two overlapping, then reads the whole file back.
#ifndef STRATA_TOOLS_NVME_BENCH_VERIFY_H_
#define STRATA_TOOLS_NVME_BENCH_VERIFY_H_

#include <cstdint>
#include <functional>
#include <string>

#include "strata/status.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {

struct VerifyOptions {
  uint64_t ops = 10000;          // random operations after the first pass
  size_t max_bytes = 4u << 20;   // largest random request
  size_t block_size = 1u << 20;  // engine split size
  int qd = 16;
  int threads = 1;
  uint64_t seed = 1;
};

struct VerifyResult {
  uint64_t reads = 0;  // random reads, plus the pieces of the final pass
  uint64_t writes = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t mismatched_words = 0;
  std::string first_mismatch;  // "" when none
  double seconds = 0;
};

// The three parts of a run, in order.
enum class VerifyPhase { kWrite, kRandom, kReadBack };

// Called about twice a second with the phase and how far it is: bytes of
// the file for kWrite and kReadBack, operations for kRandom.
using VerifyProgressFn =
    std::function<void(VerifyPhase phase, uint64_t done, uint64_t total)>;

// The value of the word at byte `offset` written in generation `gen`.
uint64_t PatternWord(uint64_t offset, uint32_t gen, uint64_t seed);

// Runs the check on `target` (created and preallocated to `file_size` if
// needed) with buffers carved from `buffers` (at least threads * qd *
// max_bytes bytes, aligned for O_DIRECT). kCancelled when target.cancel
// stopped it.
Result<VerifyResult> RunVerify(const Target& target, uint64_t file_size,
                               const VerifyOptions& options, void* buffers,
                               size_t buffer_bytes,
                               const VerifyProgressFn& progress);

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_VERIFY_H_
