// strata-nvme-bench output: the table, the JSON records and --recommend.
#ifndef STRATA_TOOLS_NVME_BENCH_REPORT_H_
#define STRATA_TOOLS_NVME_BENCH_REPORT_H_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tools/nvme_bench/workload.h"

namespace strata::bench {

// One configuration of the sweep: the median strata run and, with
// --vs-fio, the median fio run on the same job.
struct Row {
  JobResult strata;
  std::optional<JobResult> fio;
  std::vector<double> strata_gbps;  // every repeat, in run order
  std::vector<double> fio_gbps;
  std::string fio_buffers;  // FioBuffers::kind() of the fio runs
  std::string disk;         // the disks whose counters fill `device`, or ""
  std::vector<std::string> paths;  // the files, as JobResult::files

  double strata_over_fio() const {
    return fio && fio->gb_per_s() > 0 ? strata.gb_per_s() / fio->gb_per_s() : 0;
  }
};

// Index of the run with the median throughput.
size_t MedianIndex(const std::vector<double>& gbps);

// Whether the device served a number of requests that differs from the
// application's by more than 5%: the block layer merged (or split) them,
// and IOPS is not what the drive did.
bool DeviceDiffers(const JobResult& r);

// The table fits 100 columns: one line per run kind (strata, fio) and a
// line with strata/fio and the runs' spread under --vs-fio.
std::string TableHeader();
std::string TableRow(const Row& row);
// Explains the marks TableRow put in `rows`; empty when there are none.
std::string TableNotes(const std::vector<Row>& rows);

// With --vs-fio, a header note when strata submits more than one request
// an io_uring_enter and fio (its default) one; empty for one.
std::string SubmitBatchNote(int submit_batch);

// One record per row, in the documented schema (docs/cli.md).
nlohmann::json RowJson(const Row& row);

// Best configuration per access pattern: the highest median GB/s, then the
// fewest requests in flight (then the smallest blocks) among those whose
// runs it does not beat beyond their spread (ranges widened by 2% for a
// single run); with an engine configuration snippet for each.
std::string Recommend(const std::vector<Row>& rows);

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_REPORT_H_
