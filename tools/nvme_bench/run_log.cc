#include "tools/nvme_bench/run_log.h"

#include <cerrno>

#include "common/text.h"

namespace strata::bench {

nlohmann::json LogRecord(const std::string& engine, const JobSpec& spec,
                         int run, const JobProgress& prev,
                         const JobProgress& now) {
  const uint64_t bytes = now.bytes - prev.bytes;
  const uint64_t ios = now.ios - prev.ios;
  const double secs = now.seconds - prev.seconds;
  return {
      {"engine", engine},
      {"rw", RwName(spec.rw)},
      {"bs", spec.bs},
      {"qd", spec.qd},
      {"threads", spec.threads},
      {"run", run},
      {"t", now.seconds},
      {"bytes", bytes},
      {"ios", ios},
      {"gb_per_s", secs > 0 ? bytes / secs / 1e9 : 0.0},
      {"iops", secs > 0 ? ios / secs : 0.0},
      {"lat_mean_us", ios > 0 ? (now.lat_ns - prev.lat_ns) / 1e3 / ios : 0.0},
  };
}

RunLog::~RunLog() {
  if (file_ != nullptr) std::fclose(file_);
}

Status RunLog::Open() {
  if (path_.empty()) return Status::Ok();
  file_ = std::fopen(path_.c_str(), "we");
  if (file_ == nullptr) {
    return Status::InvalidArgument("cannot write --log file '" + path_ +
                                   "': " + ErrnoText(errno) +
                                   "; pass a --log path in a directory you "
                                   "can write");
  }
  return Status::Ok();
}

void RunLog::Start(const JobSpec& spec, int run, std::string engine) {
  spec_ = spec;
  run_ = run;
  engine_ = std::move(engine);
  prev_ = JobProgress{};
}

void RunLog::Add(const JobProgress& now) {
  // Nothing is counted during a ramp.
  if (file_ == nullptr || (now.seconds <= 0 && !now.done)) return;
  const std::string line =
      LogRecord(engine_, spec_, run_, prev_, now).dump() + "\n";
  prev_ = now;
  if ((std::fputs(line.c_str(), file_) < 0 || std::fflush(file_) != 0) &&
      status_.ok()) {
    status_ = Status::IoError("cannot write --log file '" + path_ +
                              "': " + ErrnoText(errno));
  }
}

}  // namespace strata::bench
