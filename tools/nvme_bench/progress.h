// strata-nvme-bench's progress on stderr: a status line rewritten in place
// on a terminal, one line every few seconds otherwise, and the texts it
// shows, as pure functions.
//
// Thread safety: none; Progress is updated from one thread.
#ifndef STRATA_TOOLS_NVME_BENCH_PROGRESS_H_
#define STRATA_TOOLS_NVME_BENCH_PROGRESS_H_

#include <cstdint>
#include <string>

#include "tools/nvme_bench/verify.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {

class Progress {
 public:
  explicit Progress(bool enabled);

  void Update(const std::string& text);
  // Erases the status line on a terminal.
  void Clear();

 private:
  bool enabled_;
  bool tty_;
  bool dirty_ = false;
  uint64_t last_ns_ = 0;
};

// Bytes moved after `seconds` of a job.
struct ProgressSample {
  uint64_t bytes = 0;
  double seconds = 0;
};

// "<label>: 45% 1.234 GB/s": how much of `spec` is done (of --time when it
// has one, else of its bytes; at most 100%, as a job's last report comes
// after its deadline) and the rate between the samples `prev` and `now`,
// not since the start.
std::string JobProgressText(const std::string& label, const JobSpec& spec,
                            ProgressSample prev, ProgressSample now);

// "verify: writing 12M of 64M", "verify: 1234 of 10000 random ops",
// "verify: reading back 64M of 64M".
std::string VerifyProgressText(VerifyPhase phase, uint64_t done,
                               uint64_t total);

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_PROGRESS_H_
