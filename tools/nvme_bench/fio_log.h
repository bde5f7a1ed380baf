// strata-nvme-bench --log with --vs-fio: fio's runs over time, from fio's
// own interval reports, as the JobProgress reports RunLog writes for
// strata's runs, so that both come out as the same records.
//
// Note [fio's interval figures]: fio is asked for --status-interval, a
// full JSON report of its cumulative counters every kProgressPeriodNs,
// rather than for its log files (--write_bw_log, --write_iops_log,
// --write_lat_log with --log_avg_msec):
// - the reports come on fio's stdout, which is read anyway, so there are
//   no files to find and to remove after an error or a Ctrl-C;
// - with group_reporting a report is summed over the numjobs threads
//   already, where the log files come one per job and per figure, with
//   times that do not line up (fio 3.33: bw at 499 ms, lat at 500 ms);
// - the counters are cumulative, so the differences of consecutive
//   reports add up to the final report's bytes exactly, where the log
//   files' averaged KiB/s only come close.
// Limits: fio takes the reports on its own clock, about every 0.5 s; "t" is
// fio's run time in whole milliseconds; an interval's mean latency comes
// from fio's running mean (printed to 6 decimals) times its sample count.
// An interrupted fio run is not logged: its output is not parsed.
//
// Thread safety: none needed; the functions only read their arguments.
#ifndef STRATA_TOOLS_NVME_BENCH_FIO_LOG_H_
#define STRATA_TOOLS_NVME_BENCH_FIO_LOG_H_

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/nvme_bench/workload.h"

namespace strata::bench {

// The options that make fio print a report every kProgressPeriodNs
// besides its final one.
std::vector<std::string> FioLogOptions();

// The progress in fio's `reports` (FioReports) of a run of `spec`, one
// per report after the ramp, cumulative: bytes, ios and summed latency of
// the read and write sections, and fio's run time since the ramp as
// `seconds`. The last is fio's final report, marked done.
std::vector<JobProgress> FioProgress(const std::vector<nlohmann::json>& reports,
                                     const JobSpec& spec);

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_FIO_LOG_H_
