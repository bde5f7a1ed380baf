// strata-nvme-bench --log FILE: bandwidth, IOPS and mean latency over time,
// one JSON object per line, every 0.5 s of each run and once at its end, so
// that the bytes of a run's lines add up to its record's bytes. strata's
// runs are logged as they go, fio's (--vs-fio) from fio's reports once
// they end (fio_log.h).
//
// Thread safety: none; a log is written from the thread that runs jobs.
#ifndef STRATA_TOOLS_NVME_BENCH_RUN_LOG_H_
#define STRATA_TOOLS_NVME_BENCH_RUN_LOG_H_

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "strata/status.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {

// The line for the interval from `prev` to `now` of the `run`-th (1-based)
// run of `spec` by `engine` ("strata" or "fio"): {"engine","rw","bs","qd",
// "threads","run","t","bytes","ios","gb_per_s","iops","lat_mean_us"}, "t"
// being `now`'s seconds since the start and the rest the interval's.
nlohmann::json LogRecord(const std::string& engine, const JobSpec& spec,
                         int run, const JobProgress& prev,
                         const JobProgress& now);

class RunLog {
 public:
  // An empty path logs nothing.
  explicit RunLog(std::string path) : path_(std::move(path)) {}
  ~RunLog();
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;

  // Creates or truncates the file; the error names the path and the fix.
  Status Open();
  // Whether a path was given (and opened): lines are written.
  bool enabled() const { return file_ != nullptr; }
  // Starts the `run`-th run of `spec` by `engine`; Add() then logs its
  // reports.
  void Start(const JobSpec& spec, int run, std::string engine = "strata");
  void Add(const JobProgress& now);
  // The first write that failed, or OK.
  Status status() const { return status_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  JobSpec spec_;
  int run_ = 0;
  std::string engine_;
  JobProgress prev_;
  Status status_;
};

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_RUN_LOG_H_
