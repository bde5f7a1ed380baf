// The helpers of strata-nvme-bench's command-line tests: the real binary
// (STRATA_BENCH_BIN) run as a user runs it, and its output files read.
#ifndef STRATA_TESTS_TOOLS_NVME_BENCH_CLI_H_
#define STRATA_TESTS_TOOLS_NVME_BENCH_CLI_H_

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace strata::bench {

struct Outcome {
  int status = -1;
  std::string output;  // stdout and stderr
};

// Runs the benchmark with `args` (and --quiet) under `env`.
inline Outcome Bench(const std::string& args, const std::string& env = "") {
  const std::string cmd =
      env + " " STRATA_BENCH_BIN " " + args + " --quiet 2>&1";
  Outcome out;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) {
    out.output.append(buf.data(), n);
  }
  const int ws = pclose(p);
  out.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
  return out;
}

inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, false);
}

inline bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline bool HaveFio() {
  return std::system("fio --version >/dev/null 2>&1") == 0;
}

inline std::string FirstLine(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace strata::bench

#endif  // STRATA_TESTS_TOOLS_NVME_BENCH_CLI_H_
