#include "tools/nvme_bench/fio.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace strata::bench {
namespace {

constexpr int kExecFailed = 127;
// How long fio may take to stop after the SIGINT passed on to it.
constexpr uint64_t kStopGraceNs = 10'000'000'000ull;

// What a child printed and how it ended.
struct Captured {
  std::string out;
  int exit_status = -1;  // -1: killed by a signal
};

// Starts argv with its stdout (and stderr, with `merge_stderr`) on
// `write_fd`; returns its pid.
Result<pid_t> Spawn(const std::vector<std::string>& argv, int write_fd,
                    bool merge_stderr) {
  // Built before fork: the child of a threaded process must not allocate.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    return Status::Internal(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    dup2(write_fd, STDOUT_FILENO);
    if (merge_stderr) dup2(write_fd, STDERR_FILENO);
    execvp(args[0], args.data());
    _exit(kExecFailed);
  }
  return pid;
}

// Reads `fd` to its end. Once `cancel` is set, passes SIGINT on to `pid`
// (a Ctrl-C from a terminal reaches it anyway; a kill of strata's pid
// alone would not), and SIGKILL if it has not stopped kStopGraceNs later.
std::string Collect(int fd, pid_t pid, const std::atomic<bool>* cancel) {
  std::string out;
  char buf[65536];
  uint64_t stop_sent_ns = 0;
  bool killed = false;
  for (;;) {
    if (cancel != nullptr && cancel->load()) {
      if (stop_sent_ns == 0) {
        kill(pid, SIGINT);
        stop_sent_ns = NowNs();
      } else if (!killed && NowNs() - stop_sent_ns > kStopGraceNs) {
        kill(pid, SIGKILL);
        killed = true;
      }
    }
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;  // timeout or EINTR
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  return out;
}

Result<Captured> Capture(const std::vector<std::string>& argv,
                         bool merge_stderr, const std::atomic<bool>* cancel) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return Status::Internal(std::string("pipe: ") + std::strerror(errno));
  }
  Result<pid_t> pid = Spawn(argv, fds[1], merge_stderr);
  close(fds[1]);
  if (!pid.ok()) {
    close(fds[0]);
    return pid.status();
  }
  Captured c;
  c.out = Collect(fds[0], *pid, cancel);
  close(fds[0]);
  int wstatus = 0;
  while (waitpid(*pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(wstatus)) c.exit_status = WEXITSTATUS(wstatus);
  return c;
}

Status FioNotFound(const std::string& fio) {
  return Status::NotFound("fio not found: cannot run '" + fio +
                          "'; install it (apt-get install fio) or pass "
                          "--fio PATH (or drop --vs-fio)");
}

// fio's messages, each line once (fio prints some twice), on one line.
std::string FioMessages(const std::string& out) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    std::string line = out.substr(start, end - start);
    start = end + 1;
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    line = line.substr(first);
    if (std::find(lines.begin(), lines.end(), line) == lines.end()) {
      lines.push_back(std::move(line));
    }
  }
  std::string text;
  for (const std::string& line : lines) {
    text += (text.empty() ? "" : "; ") + line;
  }
  return text.empty() ? "(no message)" : text;
}

// lat_ns.percentile[key] in microseconds; 0 if fio did not report it.
double Percentile(const nlohmann::json& dir, const char* key) {
  const auto lat = dir.find("lat_ns");
  if (lat == dir.end() || !lat->contains("percentile")) return 0;
  const auto& p = lat->at("percentile");
  return p.contains(key) ? p.at(key).get<double>() / 1e3 : 0;
}

// The latencies fio reports for one direction (lat_ns: submit to
// completion, as strata's).
LatencyUs Latency(const nlohmann::json& dir) {
  LatencyUs l;
  const auto lat = dir.find("lat_ns");
  if (lat == dir.end()) return l;
  l.min = lat->value("min", 0.0) / 1e3;
  l.mean = lat->value("mean", 0.0) / 1e3;
  l.max = lat->value("max", 0.0) / 1e3;
  l.p50 = Percentile(dir, "50.000000");
  l.p99 = Percentile(dir, "99.000000");
  l.p999 = Percentile(dir, "99.900000");
  l.p9999 = Percentile(dir, "99.990000");
  return l;
}

std::string Milliseconds(double seconds) {
  return std::to_string(static_cast<uint64_t>(seconds * 1000)) + "ms";
}

// fio's figures for one direction ("read", "write", "mixed").
DirectionResult Direction(const nlohmann::json& dir) {
  return DirectionResult{.bytes = dir.value("io_bytes", uint64_t{0}),
                         .ios = dir.value("total_ios", uint64_t{0}),
                         .lat = Latency(dir)};
}

// Without fio's "mixed" section (a --fio-opt changed its reporting), the
// percentiles of all requests are not known: the larger direction's stand
// in, an upper bound.
LatencyUs Combined(const DirectionResult& a, const DirectionResult& b) {
  const uint64_t n = a.ios + b.ios;
  return LatencyUs{
      .min = std::min(a.ios ? a.lat.min : b.lat.min,
                      b.ios ? b.lat.min : a.lat.min),
      .mean = n ? (a.lat.mean * a.ios + b.lat.mean * b.ios) / n : 0,
      .p50 = std::max(a.lat.p50, b.lat.p50),
      .p99 = std::max(a.lat.p99, b.lat.p99),
      .p999 = std::max(a.lat.p999, b.lat.p999),
      .p9999 = std::max(a.lat.p9999, b.lat.p9999),
      .max = std::max(a.lat.max, b.lat.max)};
}

// The figures of `job` that `spec` asked for: one direction's, or for a
// mixed job the sum of fio's "read" and "write" sections, each kept.
Status ParseDirections(const nlohmann::json& job, const JobSpec& spec,
                       JobResult* r) {
  const bool mixed = IsMixed(spec.rw);
  double bw = 0;
  for (const bool write : {false, true}) {
    if (!mixed && write != IsWrite(spec.rw)) continue;
    const char* key = write ? "write" : "read";
    if (!job.contains(key)) {
      return Status::Internal(std::string("fio's JSON has no '") + key +
                              "' section");
    }
    const nlohmann::json& dir = job.at(key);
    (write ? r->write : r->read) = Direction(dir);
    bw += dir.value("bw_bytes", 0.0);
  }
  r->bytes = r->read.bytes + r->write.bytes;
  r->ios = r->read.ios + r->write.ios;
  r->seconds = bw > 0 ? r->bytes / bw : 0;
  if (!mixed) {
    r->lat = IsWrite(spec.rw) ? r->write.lat : r->read.lat;
  } else if (job.contains("mixed")) {
    r->lat = Latency(job.at("mixed"));
  } else {
    r->lat = Combined(r->read, r->write);
  }
  return Status::Ok();
}

// fio's --filename: the files separated by ':', a ':' inside a name
// escaped as '\:' (as --path takes it).
std::string FioFileNames(const std::vector<std::string>& paths) {
  std::string out;
  for (const std::string& path : paths) {
    if (!out.empty()) out += ':';
    for (char c : path) {
      if (c == ':') out += '\\';
      out += c;
    }
  }
  return out;
}

// One report of fio's (FioReports).
Result<JobResult> ParseReport(const nlohmann::json& doc, const JobSpec& spec) {
  const nlohmann::json& job = doc["jobs"][0];
  JobResult r;
  r.spec = spec;
  r.backend = "fio-io_uring";
  STRATA_RETURN_IF_ERROR(ParseDirections(job, spec, &r));
  // fio counts its fsyncs (fsync=N) in the job's "sync" section.
  if (const auto sync = job.find("sync"); sync != job.end()) {
    r.syncs = sync->value("total_ios", uint64_t{0});
  }
  // With group_reporting fio sums CPU time and run time over its numjobs
  // threads: its usr_cpu is a thread's average. strata's is the process's,
  // summed over threads, as a percentage of one core.
  r.usr_pct = job.value("usr_cpu", 0.0) * spec.threads;
  r.sys_pct = job.value("sys_cpu", 0.0) * spec.threads;
  if (r.bytes == 0 || r.seconds <= 0) {
    return Status::Internal("fio reported no I/O");
  }
  return r;
}

// The index just past the end of the JSON value that opens at
// text[begin], or npos if the text ends first.
size_t ObjectEnd(const std::string& text, size_t begin) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = begin; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string::npos;
}

}  // namespace

std::vector<std::string> FioCommand(const std::string& fio,
                                    const std::vector<std::string>& paths,
                                    const JobSpec& spec, bool direct,
                                    const std::vector<std::string>& extra) {
  // Note [Striping]: fio divides a job's size among its files and applies
  // offset_increment to each; it switches files after every request.
  const int files = static_cast<int>(paths.size());
  const uint64_t slice = BlocksPerThread(spec, files) * spec.bs;
  std::vector<std::string> cmd = {
      fio,
      "--name=strata-vs-fio",
      "--filename=" + FioFileNames(paths),
      "--ioengine=io_uring",
      "--rw=" + std::string(RwName(spec.rw)),
      "--bs=" + std::to_string(spec.bs),
      "--iodepth=" + std::to_string(spec.qd),
      "--numjobs=" + std::to_string(spec.threads),
      "--size=" + std::to_string(slice),
      "--offset_increment=" + std::to_string(slice / files),
      "--direct=" + std::string(direct ? "1" : "0"),
      "--thread",
      "--group_reporting",
      "--lat_percentiles=1",
      "--allow_file_create=0",
      "--fallocate=none",
      "--randseed=" + std::to_string(spec.seed),
      "--output-format=json",
  };
  if (IsMixed(spec.rw)) {
    cmd.push_back("--rwmixread=" + std::to_string(spec.rwmixread));
    // Adds a "mixed" section: the percentiles of all requests together.
    cmd.push_back("--unified_rw_reporting=both");
  }
  if (!direct && IsWrite(spec.rw)) cmd.push_back("--end_fsync=1");
  if (!direct && IsRead(spec.rw)) cmd.push_back("--invalidate=1");
  if (spec.fsync > 0) cmd.push_back("--fsync=" + std::to_string(spec.fsync));
  if (spec.seconds > 0) {
    cmd.push_back("--time_based");
    cmd.push_back("--runtime=" + Milliseconds(spec.seconds));
  }
  if (spec.ramp > 0) cmd.push_back("--ramp_time=" + Milliseconds(spec.ramp));
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

Result<std::vector<nlohmann::json>> FioReports(const std::string& text) {
  std::vector<nlohmann::json> reports;
  for (size_t start = text.find('{'); start != std::string::npos;
       start = text.find('{', start)) {
    const size_t end = ObjectEnd(text, start);
    // A report cut short stays null.
    nlohmann::json doc =
        end == std::string::npos
            ? nlohmann::json()
            : nlohmann::json::parse(text.begin() + start, text.begin() + end,
                                    nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object() || !doc.contains("jobs") || doc["jobs"].empty()) {
      return Status::Internal("cannot parse fio's JSON output");
    }
    reports.push_back(std::move(doc));
    start = end;
  }
  if (reports.empty()) return Status::Internal("fio printed no JSON");
  return reports;
}

Result<JobResult> ParseFioJson(const std::string& text, const JobSpec& spec) {
  STRATA_ASSIGN_OR_RETURN(auto reports, FioReports(text));
  return ParseReport(reports.back(), spec);
}

Result<JobResult> RunFio(const std::vector<std::string>& command,
                         const JobSpec& spec, const std::atomic<bool>* cancel,
                         std::vector<nlohmann::json>* reports) {
  STRATA_ASSIGN_OR_RETURN(Captured c, Capture(command, false, cancel));
  // fio stopped by Ctrl-C fails or reports a short run: either way the run
  // was interrupted, not fio's error.
  if (cancel != nullptr && cancel->load()) {
    return Status::Cancelled("interrupted");
  }
  if (c.exit_status == kExecFailed) return FioNotFound(command[0]);
  if (c.exit_status != 0) {
    return Status::Internal(
        "'" + command[0] + "' failed (" +
        (c.exit_status < 0 ? std::string("killed by a signal")
                           : "exit status " + std::to_string(c.exit_status)) +
        "); its messages are above");
  }
  STRATA_ASSIGN_OR_RETURN(auto all, FioReports(c.out));
  STRATA_ASSIGN_OR_RETURN(JobResult r, ParseReport(all.back(), spec));
  if (reports != nullptr) *reports = std::move(all);
  return r;
}

Status CheckFio(const std::vector<std::string>& command) {
  std::vector<std::string> parse_only = command;
  parse_only.push_back("--parse-only");
  STRATA_ASSIGN_OR_RETURN(Captured c, Capture(parse_only, true, nullptr));
  if (c.exit_status == kExecFailed) return FioNotFound(command[0]);
  if (c.exit_status != 0) {
    return Status::InvalidArgument(
        "fio refuses the job --vs-fio would run: " + FioMessages(c.out) +
        "; fix or drop the --fio-opt it names");
  }
  return Status::Ok();
}

}  // namespace strata::bench
