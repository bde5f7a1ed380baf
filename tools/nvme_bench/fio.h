// Running fio's io_uring engine on the same file and job as a strata run,
// for strata-nvme-bench --vs-fio.
#ifndef STRATA_TOOLS_NVME_BENCH_FIO_H_
#define STRATA_TOOLS_NVME_BENCH_FIO_H_

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/status.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {

// The fio command line for `spec` on `paths`: ioengine=io_uring, numjobs =
// threads, each job on its own size/threads slice striped over the files
// as strata stripes (Note [Striping] in workload.h), total latency
// percentiles, JSON output. `extra` options are appended verbatim.
std::vector<std::string> FioCommand(const std::string& fio,
                                    const std::vector<std::string>& paths,
                                    const JobSpec& spec, bool direct,
                                    const std::vector<std::string>& extra);

// The JSON reports in fio's --output-format=json output, in order (text
// outside them is ignored): with --status-interval one per interval, then
// the final one. An error if there is none or one does not parse.
Result<std::vector<nlohmann::json>> FioReports(const std::string& text);

// Parses fio's final report (FioReports' last) into a JobResult:
// throughput, IOPS, total-latency percentiles and CPU, summed or averaged
// over jobs.
Result<JobResult> ParseFioJson(const std::string& text, const JobSpec& spec);

// Runs the command and parses its output. Errors say how to install fio.
// Once `cancel` reads true, fio is stopped (SIGINT) and the result is
// kCancelled, whatever fio did. With `reports`, fio's reports (FioReports)
// are returned there too.
Result<JobResult> RunFio(const std::vector<std::string>& command,
                         const JobSpec& spec,
                         const std::atomic<bool>* cancel = nullptr,
                         std::vector<nlohmann::json>* reports = nullptr);

// Before the first run: runs the command with fio's --parse-only, so that
// a missing fio (kNotFound) or an option fio refuses (kInvalidArgument,
// with fio's own message) is found before any time is spent.
Status CheckFio(const std::vector<std::string>& command);

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_FIO_H_
