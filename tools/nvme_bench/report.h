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

  double ratio_vs_fio() const {
    return fio && fio->gb_per_s() > 0 ? strata.gb_per_s() / fio->gb_per_s() : 0;
  }
};

// Index of the run with the median throughput.
size_t MedianIndex(const std::vector<double>& gbps);

std::string TableHeader(bool with_fio);
std::string TableRow(const Row& row);

// One record per row, in the documented schema.
nlohmann::json RowJson(const Row& row);

// Best configuration per access pattern: the highest GB/s, preferring the
// fewest requests in flight (then the smallest blocks) among those within
// 2% of it; with an engine configuration snippet for each.
std::string Recommend(const std::vector<Row>& rows);

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_REPORT_H_
