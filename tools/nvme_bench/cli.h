// strata-nvme-bench command line.
#ifndef STRATA_TOOLS_NVME_BENCH_CLI_H_
#define STRATA_TOOLS_NVME_BENCH_CLI_H_

#include <cstdint>
#include <string>
#include <vector>

#include "strata/status.h"
#include "tools/nvme_bench/fio_buffers.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {

struct BenchOptions {
  // One or more: a job stripes over them (Note [Striping] in workload.h).
  std::vector<std::string> paths;
  std::vector<Rw> rw = {Rw::kRead, Rw::kWrite};
  std::vector<size_t> bs = {1u << 20};
  std::vector<int> qd = {32};
  std::vector<int> threads = {1};
  uint64_t size = 1ull << 30;
  double seconds = 0;
  double ramp = 0;     // --time only: seconds run first and not counted
  int rwmixread = 50;  // rw and randrw: the percentage of requests that read
  std::string backend = "auto";
  int submit_batch = aio::IoOptions{}.submit_batch;
  bool buffered = false;
  bool sync = false;   // --sync: O_DSYNC
  uint64_t fsync = 0;  // --fsync N: fdatasync after every N writes; 0 off
  std::string log;     // --log FILE: JSON lines over time
  bool pin = true;
  bool huge_pages = true;
  bool vs_fio = false;
  std::string fio = "fio";
  std::vector<std::string> fio_opts;
  // Huge pages unless --no-huge-pages (Note [Fair fio buffers]).
  FioBufferKind fio_buffers = FioBufferKind::kHugePages;
  int repeat = 1;  // 3 with --vs-fio unless given
  std::string json;
  bool recommend = false;
  bool verify = false;
  uint64_t verify_ops = 10000;
  uint64_t verify_max = 4u << 20;
  bool keep = false;
  bool overwrite = false;
  bool create = false;  // --path may name a file that does not exist yet
  // --destroy-data-on DEVICE: jobs may write the raw block devices --path
  // names, each of which DEVICE (one or more) must name too
  // (tools/nvme_bench/raw_device.h).
  std::vector<std::string> destroy_data_on;
  uint64_t seed = 1;
  bool quiet = false;
};

// Whether the run writes: a job that writes (write, randwrite, rw, randrw)
// or --verify.
bool RunWrites(const BenchOptions& o);

// Parses argv. Sets *exit_now (and returns defaults) when --help or
// --version was printed.
Result<BenchOptions> ParseCommandLine(int argc, char** argv, bool* exit_now);

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_CLI_H_
