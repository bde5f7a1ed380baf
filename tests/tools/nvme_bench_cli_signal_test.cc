// strata-nvme-bench stopped by a signal, as a user stops it: Ctrl-C, a
// closed pipe, a stop while the file is prefilled.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "tests/testutil/testutil.h"
#include "tests/tools/nvme_bench_cli.h"

namespace strata::bench {
namespace {

// The bench started with its output to `log`, or only its stderr there
// when `out` (the write end of a pipe) is given; returns its pid.
pid_t Start(const std::string& args, const std::string& log, int out = -1) {
  const std::string cmd = "exec " STRATA_BENCH_BIN " " + args;
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out >= 0 ? out : fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    signal(SIGPIPE, SIG_DFL);  // as a shell's pipeline starts it
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Whether `text` appeared in `log` within a minute (the watchdog of the
// tests here).
bool AwaitText(const std::string& log, const std::string& text) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!Contains(ReadText(log), text)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Ctrl-C: the rows that finished, in the table and the JSON, the file
// removed, exit status 130. --time 10 leaves the second configuration ten
// seconds to be interrupted in, once the first row is out.
TEST(NvmeBenchCliTest, CtrlCReportsWhatFinishedAndRemovesTheFile) {
  testutil::ScratchDir dir;
  const std::string json = dir.File("out.json");
  const std::string log = dir.File("log");
  const pid_t pid = Start("--path " + dir.path() +
                              " --rw read,write --bs 64K --qd 4 --size 8M "
                              "--time 10 --quiet --json " +
                              json,
                          log);
  ASSERT_GT(pid, 0);
  const bool row = AwaitText(log, "\nread ");
  kill(pid, row ? SIGINT : SIGKILL);
  int ws = 0;
  ASSERT_EQ(waitpid(pid, &ws, 0), pid);
  const std::string out = ReadText(log);
  ASSERT_TRUE(row) << "no row within 60 s:\n" << out;
  ASSERT_TRUE(WIFEXITED(ws)) << out;
  EXPECT_EQ(WEXITSTATUS(ws), 130) << out;
  const size_t line = out.find("interrupted: 1 of 2 configurations finished");
  EXPECT_NE(line, std::string::npos) << out;
  EXPECT_GT(line, out.find("\nread ")) << out;
  const nlohmann::json records = ReadJson(json);
  ASSERT_TRUE(records.is_array()) << ReadText(json);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["rw"], "read");
  EXPECT_FALSE(std::filesystem::exists(dir.File("strata-nvme-bench.dat")));
}

// Ctrl-C while the file is prefilled: no configuration finished, and
// --json says so with an empty list, as a stop in the first job does.
TEST(NvmeBenchCliTest, CtrlCWhilePrefillingWritesAnEmptyJson) {
  testutil::ScratchDir dir;
  const std::string json = dir.File("out.json");
  const std::string log = dir.File("log");
  const pid_t pid = Start(
      "--path " + dir.path() + " --rw read --size 1G --json " + json, log);
  ASSERT_GT(pid, 0);
  AwaitText(log, "prefill:");
  kill(pid, SIGINT);
  int ws = 0;
  ASSERT_EQ(waitpid(pid, &ws, 0), pid);
  const std::string out = ReadText(log);
  if (!Contains(out, "interrupted: while prefilling")) {
    GTEST_SKIP() << "the prefill ended before the signal:\n" << out;
  }
  EXPECT_EQ(WEXITSTATUS(ws), 130) << out;
  EXPECT_EQ(ReadJson(json), nlohmann::json::array()) << ReadText(json);
  EXPECT_FALSE(std::filesystem::exists(dir.File("strata-nvme-bench.dat")));
}

// `strata-nvme-bench ... | head`: once the reader is gone, the next row's
// write raises SIGPIPE, which stops the sweep like Ctrl-C: the rows that
// finished in the JSON, the file removed, exit status 141, never killed
// with the data file left behind.
TEST(NvmeBenchCliTest, AClosedOutputStopsTheRunAndRemovesTheFile) {
  testutil::ScratchDir dir;
  const std::string json = dir.File("out.json");
  const std::string log = dir.File("log");
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);  // no reader left in the child
  const pid_t pid = Start("--path " + dir.path() +
                              " --rw read --bs 64K,128K,256K --qd 4 "
                              "--size 8M --time 2 --quiet --json " +
                              json,
                          log, pipe_fds[1]);
  ASSERT_GT(pid, 0);
  close(pipe_fds[1]);
  std::string out;
  char buf[4096];
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!Contains(out, "\nread ") &&
         std::chrono::steady_clock::now() < deadline) {
    pollfd p{pipe_fds[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = read(pipe_fds[0], buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  const bool row = Contains(out, "\nread ");
  close(pipe_fds[0]);
  if (!row) kill(pid, SIGKILL);
  int ws = 0;
  ASSERT_EQ(waitpid(pid, &ws, 0), pid);
  ASSERT_TRUE(row) << "no row within 60 s:\n" << out << ReadText(log);
  ASSERT_TRUE(WIFEXITED(ws)) << ReadText(log);
  EXPECT_EQ(WEXITSTATUS(ws), 128 + SIGPIPE) << ReadText(log);
  EXPECT_TRUE(Contains(ReadText(log), "its output was closed; stopping"))
      << ReadText(log);
  const nlohmann::json records = ReadJson(json);
  ASSERT_TRUE(records.is_array()) << ReadText(json);
  EXPECT_EQ(records.size(), 2u) << records.dump();
  EXPECT_FALSE(std::filesystem::exists(dir.File("strata-nvme-bench.dat")));
}

}  // namespace
}  // namespace strata::bench
