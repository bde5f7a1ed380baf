#include "tools/nvme_bench/fio.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace strata::bench {
namespace {

constexpr int kExecFailed = 127;

// Runs argv, returning its stdout; stderr passes through.
Result<std::string> Capture(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return Status::Internal(std::string("pipe: ") + std::strerror(errno));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return Status::Internal(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(kExecFailed);
  }
  close(fds[1]);
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == kExecFailed) {
    return Status::NotFound(
        "cannot run '" + argv[0] +
        "': install fio (apt-get install fio), pass --fio PATH, "
        "or drop --vs-fio");
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return Status::Internal("'" + argv[0] + "' failed (exit status " +
                            std::to_string(WEXITSTATUS(wstatus)) +
                            "); its messages are above");
  }
  return out;
}

// lat_ns.percentile[key] in microseconds; 0 if fio did not report it.
double Percentile(const nlohmann::json& dir, const char* key) {
  const auto lat = dir.find("lat_ns");
  if (lat == dir.end() || !lat->contains("percentile")) return 0;
  const auto& p = lat->at("percentile");
  return p.contains(key) ? p.at(key).get<double>() / 1e3 : 0;
}

}  // namespace

std::vector<std::string> FioCommand(const std::string& fio,
                                    const std::string& path,
                                    const JobSpec& spec, bool direct,
                                    const std::vector<std::string>& extra) {
  const uint64_t slice = spec.size / spec.bs / spec.threads * spec.bs;
  std::vector<std::string> cmd = {
      fio,
      "--name=strata-vs-fio",
      "--filename=" + path,
      "--ioengine=io_uring",
      "--rw=" + std::string(RwName(spec.rw)),
      "--bs=" + std::to_string(spec.bs),
      "--iodepth=" + std::to_string(spec.qd),
      "--numjobs=" + std::to_string(spec.threads),
      "--size=" + std::to_string(slice),
      "--offset_increment=" + std::to_string(slice),
      "--direct=" + std::string(direct ? "1" : "0"),
      "--thread",
      "--group_reporting",
      "--lat_percentiles=1",
      "--allow_file_create=0",
      "--fallocate=none",
      "--randseed=" + std::to_string(spec.seed),
      "--output-format=json",
  };
  if (!direct) {
    cmd.push_back(IsWrite(spec.rw) ? "--end_fsync=1" : "--invalidate=1");
  }
  if (spec.seconds > 0) {
    cmd.push_back("--time_based");
    cmd.push_back("--runtime=" +
                  std::to_string(static_cast<uint64_t>(spec.seconds * 1000)) +
                  "ms");
  }
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

Result<JobResult> ParseFioJson(const std::string& text, const JobSpec& spec) {
  const size_t start = text.find('{');
  if (start == std::string::npos) {
    return Status::Internal("fio printed no JSON");
  }
  nlohmann::json doc = nlohmann::json::parse(text.substr(start), nullptr,
                                             /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.contains("jobs") || doc["jobs"].empty()) {
    return Status::Internal("cannot parse fio's JSON output");
  }
  const nlohmann::json& job = doc["jobs"][0];
  const char* key = IsWrite(spec.rw) ? "write" : "read";
  if (!job.contains(key)) {
    return Status::Internal(std::string("fio's JSON has no '") + key +
                            "' section");
  }
  const nlohmann::json& dir = job.at(key);
  JobResult r;
  r.spec = spec;
  r.backend = "fio-io_uring";
  r.bytes = dir.value("io_bytes", uint64_t{0});
  r.ios = dir.value("total_ios", uint64_t{0});
  const double bw = dir.value("bw_bytes", 0.0);
  r.seconds = bw > 0 ? r.bytes / bw : 0;
  r.lat_p50_us = Percentile(dir, "50.000000");
  r.lat_p99_us = Percentile(dir, "99.000000");
  r.lat_p999_us = Percentile(dir, "99.900000");
  r.usr_pct = job.value("usr_cpu", 0.0);
  r.sys_pct = job.value("sys_cpu", 0.0);
  if (r.bytes == 0 || r.seconds <= 0) {
    return Status::Internal("fio reported no I/O");
  }
  return r;
}

Result<JobResult> RunFio(const std::vector<std::string>& command,
                         const JobSpec& spec) {
  STRATA_ASSIGN_OR_RETURN(std::string out, Capture(command));
  return ParseFioJson(out, spec);
}

}  // namespace strata::bench
