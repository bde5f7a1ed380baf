// strata-nvme-bench --log as a user runs it: the real binary, small files;
// with --vs-fio, fio's runs logged beside strata's.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "tests/testutil/testutil.h"
#include "tests/tools/nvme_bench_cli.h"

namespace strata::bench {
namespace {

// The log's lines, each checked to parse.
std::vector<nlohmann::json> LogLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    lines.push_back(nlohmann::json::parse(line, nullptr, false));
    EXPECT_FALSE(lines.back().is_discarded()) << line;
  }
  return lines;
}

// Runs the bench on `dir` with `args`, --json out.json and --log log.jsonl
// there. *no_direct: it failed for want of O_DIRECT, which --time needs.
Outcome BenchWithLog(const testutil::ScratchDir& dir, const std::string& args,
                     bool* no_direct) {
  const Outcome o =
      Bench("--path " + dir.path() + " " + args + " --json " +
            dir.File("out.json") + " --log " + dir.File("log.jsonl"));
  *no_direct = o.status != 0 && Contains(o.output, "page cache");
  return o;
}

// A line every 0.5 s of a run and one at its end: the lines of a run add up
// to its record's bytes and the last one's "t" is its seconds.
TEST(NvmeBenchCliTest, LogHasTheRunOverTimeAndAddsUpToItsRecord) {
  testutil::ScratchDir dir;
  bool no_direct = false;
  const Outcome o = BenchWithLog(
      dir, "--rw randread,write --bs 64K --qd 4 --size 8M --time 1.2",
      &no_direct);
  if (no_direct) GTEST_SKIP() << "scratch has no O_DIRECT, which --time needs";
  ASSERT_EQ(o.status, 0) << o.output;
  std::map<std::string, std::vector<nlohmann::json>> by_rw;
  for (const nlohmann::json& j : LogLines(dir.File("log.jsonl"))) {
    for (const char* key :
         {"engine", "rw", "bs", "qd", "threads", "run", "t", "bytes", "ios",
          "gb_per_s", "iops", "lat_mean_us"}) {
      EXPECT_TRUE(j.contains(key)) << key << " in " << j;
    }
    EXPECT_EQ(j["engine"], "strata");
    EXPECT_EQ(j["run"], 1);
    by_rw[j["rw"].get<std::string>()].push_back(j);
  }
  for (const nlohmann::json& r : ReadJson(dir.File("out.json"))) {
    const auto& lines = by_rw[r["rw"].get<std::string>()];
    EXPECT_GE(lines.size(), 2u) << r["rw"];
    uint64_t bytes = 0;
    double t = 0;
    for (const auto& l : lines) {
      bytes += l["bytes"].get<uint64_t>();
      EXPECT_GE(l["t"].get<double>(), t) << "times go back in " << r["rw"];
      t = l["t"].get<double>();
    }
    EXPECT_EQ(bytes, r["bytes"].get<uint64_t>()) << r["rw"];
    ASSERT_FALSE(lines.empty());
    EXPECT_DOUBLE_EQ(lines.back()["t"].get<double>(),
                     r["seconds"].get<double>());
  }
  EXPECT_EQ(by_rw.size(), 2u);
}

// The lines of one run: bytes summed, the first and last "t", how many.
struct RunLines {
  uint64_t bytes = 0;
  double first_t = 0;
  double t = 0;
  int count = 0;
};

// With --vs-fio each fio run (a mixed job of two threads, and a read, with
// a ramp) is logged from fio's reports beside strata's: lines for every
// run of each, times in order, strata's first interval after the ramp a
// whole period, and the bytes of one of fio's runs (the median's) exactly
// those of its record, each run's matching its GB/s.
// fio's buffers are malloc'd: huge pages would be taken from the whole
// machine, where another bench's run may give them back under fio.
TEST(NvmeBenchCliTest, LogHasFiosRunsBesideStratas) {
  if (!HaveFio()) GTEST_SKIP() << "fio is not installed";
  testutil::ScratchDir dir;
  bool no_direct = false;
  const Outcome o = BenchWithLog(dir,
                                 "--rw randrw,read --bs 64K --qd 4 --threads 2"
                                 " --size 8M --time 0.8 --ramp 0.6 --vs-fio"
                                 " --repeat 2 --fio-buffers malloc",
                                 &no_direct);
  if (no_direct) GTEST_SKIP() << "scratch has no O_DIRECT, which --time needs";
  ASSERT_EQ(o.status, 0) << o.output;
  using Key = std::tuple<std::string, std::string, int>;  // engine, rw, run
  std::map<Key, RunLines> runs;
  for (const nlohmann::json& l : LogLines(dir.File("log.jsonl"))) {
    RunLines& r = runs[Key(l["engine"], l["rw"], l["run"])];
    EXPECT_GE(l["t"].get<double>(), r.t) << "times go back: " << l;
    r.bytes += l["bytes"].get<uint64_t>();
    r.t = l["t"].get<double>();
    if (r.count++ == 0) r.first_t = r.t;
  }
  for (const nlohmann::json& rec : ReadJson(dir.File("out.json"))) {
    const std::string rw = rec["rw"];
    const nlohmann::json& fio = rec["fio"];
    bool median_found = false;
    for (int run = 1; run <= 2; ++run) {
      const RunLines& s = runs[Key("strata", rw, run)];
      EXPECT_GE(s.count, 1) << rw << " " << run;
      // The first interval after the ramp is a whole period, no sliver.
      EXPECT_GE(s.first_t, 0.5) << rw << " " << run;
      const RunLines& f = runs[Key("fio", rw, run)];
      ASSERT_GE(f.count, 1) << rw << " run " << run;
      median_found |= f.bytes == fio["bytes"].get<uint64_t>();
      // fio's GB/s is its bytes over its run time, the last line's "t" to
      // within fio's milliseconds.
      const double gbps = fio["runs_gb_per_s"][run - 1].get<double>();
      EXPECT_NEAR(f.bytes / f.t / 1e9, gbps, gbps * 0.02) << rw << " " << run;
    }
    EXPECT_TRUE(median_found)
        << rw << ": no fio run adds up to " << fio["bytes"];
  }
  EXPECT_EQ(runs.size(), 8u);  // 2 engines x 2 jobs x 2 runs
}

}  // namespace
}  // namespace strata::bench
