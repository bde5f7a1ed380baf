#include "tools/nvme_bench/fio_log.h"

#include <algorithm>
#include <cmath>

namespace strata::bench {
namespace {

// One report's counters. fio's "mixed" section (unified_rw_reporting=both)
// repeats the read and write sections' sums and is left out.
JobProgress Counters(const nlohmann::json& report, uint64_t* lat_samples) {
  const nlohmann::json& job = report["jobs"][0];
  JobProgress p;
  for (const char* key : {"read", "write"}) {
    const auto dir = job.find(key);
    if (dir == job.end()) continue;
    p.bytes += dir->value("io_bytes", uint64_t{0});
    p.ios += dir->value("total_ios", uint64_t{0});
    // With group_reporting, a direction's run time is the longest job's.
    p.seconds = std::max(p.seconds, dir->value("runtime", 0.0) / 1e3);
    const auto lat = dir->find("lat_ns");
    if (lat == dir->end()) continue;
    const uint64_t n = lat->value("N", uint64_t{0});
    p.lat_ns +=
        static_cast<uint64_t>(std::llround(lat->value("mean", 0.0) * n));
    *lat_samples += n;
  }
  return p;
}

// Whether any of `now`'s counters is below `before`'s.
bool Behind(const JobProgress& now, const JobProgress& before) {
  return now.bytes < before.bytes || now.ios < before.ios ||
         now.lat_ns < before.lat_ns || now.seconds < before.seconds;
}

}  // namespace

std::vector<std::string> FioLogOptions() {
  return {"--status-interval=" + std::to_string(kProgressPeriodNs / 1'000'000) +
          "ms"};
}

std::vector<JobProgress> FioProgress(const std::vector<nlohmann::json>& reports,
                                     const JobSpec& spec) {
  std::vector<JobProgress> out;
  for (size_t i = 0; i < reports.size(); ++i) {
    uint64_t lat_samples = 0;
    JobProgress p = Counters(reports[i], &lat_samples);
    p.done = i + 1 == reports.size();
    // Note [fio's ramp]: fio counts the I/O of its --ramp_time in its
    // reports but takes no latency sample of it, and zeroes a job's
    // counters as its ramp ends; a report without a sample is from the
    // ramp. (With a --fio-opt that turns latencies off, only the final
    // report is left.) Each of the numjobs threads ends its ramp on its
    // own: a report taken between their ends counts some ramp, and the
    // next is behind it.
    if (spec.ramp > 0 && lat_samples == 0 && !p.done) continue;
    while (!out.empty() && Behind(p, out.back())) out.pop_back();
    // A report within a tenth of a period of the one before (fio's final
    // one comes a few ms after its last interval's) leaves a sliver whose
    // rates mean nothing: the later one stands for both.
    const double since = p.seconds - (out.empty() ? 0 : out.back().seconds);
    if (since < kProgressPeriodNs / 10 / 1e9) {
      if (!p.done) continue;
      if (!out.empty()) out.pop_back();
    }
    out.push_back(p);
  }
  return out;
}

}  // namespace strata::bench
