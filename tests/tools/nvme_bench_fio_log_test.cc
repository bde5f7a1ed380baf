// fio's runs in strata-nvme-bench --log: fio's interval reports
// (--status-interval) parsed into the records strata's runs get.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/testutil/testutil.h"
#include "tools/nvme_bench/fio.h"
#include "tools/nvme_bench/fio_log.h"
#include "tools/nvme_bench/run_log.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {
namespace {

// What fio 3.33 prints for --rw randrw --numjobs 2 --group_reporting
// --unified_rw_reporting=both --ramp_time --status-interval=500ms, cut to
// the fields read: a report from the ramp (I/O, no latency sample), one
// taken as one job's ramp had ended and the other's not (ahead of the
// next), two interval reports and the final one.
constexpr char kMixedTwoJobs[] = R"(fio: a warning before the JSON
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "strata-vs-fio",
      "job_runtime" : 998,
      "read" : {"io_bytes" : 409600, "total_ios" : 100, "runtime" : 499,
                "lat_ns" : {"mean" : 0.000000, "N" : 0}},
      "write" : {"io_bytes" : 163840, "total_ios" : 40, "runtime" : 499,
                 "lat_ns" : {"mean" : 0.000000, "N" : 0}},
      "mixed" : {"io_bytes" : 573440, "total_ios" : 140, "runtime" : 499,
                 "lat_ns" : {"mean" : 0.000000, "N" : 0}}
    }
  ]
}
{"jobs":[{"job_runtime":700,"read":{"io_bytes":204800,"total_ios":50,"runtime":600,"lat_ns":{"mean":900.000000,"N":2}},"write":{"io_bytes":81920,"total_ios":20,"runtime":600,"lat_ns":{"mean":1900.000000,"N":1}},"mixed":{"io_bytes":286720,"total_ios":70,"runtime":600,"lat_ns":{"mean":1233.333333,"N":3}}}]}
{"jobs":[{"job_runtime":1000,"read":{"io_bytes":40960,"total_ios":10,"runtime":500,"lat_ns":{"mean":1000.500000,"N":10}},"write":{"io_bytes":16384,"total_ios":4,"runtime":498,"lat_ns":{"mean":2000.000000,"N":4}},"mixed":{"io_bytes":57344,"total_ios":14,"runtime":500,"lat_ns":{"mean":1286.071429,"N":14}}}]}
{"jobs":[{"job_runtime":2000,"read":{"io_bytes":61440,"total_ios":15,"runtime":1000,"lat_ns":{"mean":1050.000000,"N":15}},"write":{"io_bytes":24576,"total_ios":6,"runtime":1000,"lat_ns":{"mean":2050.000000,"N":6}},"mixed":{"io_bytes":86016,"total_ios":21,"runtime":1000,"lat_ns":{"mean":1335.714286,"N":21}}}]}
{"jobs":[{"job_runtime":2002,"usr_cpu":1.0,"sys_cpu":2.0,"read":{"io_bytes":81920,"total_ios":20,"runtime":1001,"bw_bytes":81838,"lat_ns":{"mean":1100.000000,"N":20}},"write":{"io_bytes":32768,"total_ios":8,"runtime":1001,"bw_bytes":32735,"lat_ns":{"mean":2100.000000,"N":8}},"mixed":{"io_bytes":114688,"total_ios":28,"runtime":1001,"bw_bytes":114573,"lat_ns":{"mean":1385.714286,"N":28}}}]}
)";

const JobSpec kMixedSpec{.rw = Rw::kRandReadWrite,
                         .bs = 4096,
                         .qd = 4,
                         .threads = 2,
                         .size = 1 << 20,
                         .seconds = 1,
                         .rwmixread = 70,
                         .ramp = 0.5};

std::vector<JobProgress> Progress(const std::string& text,
                                  const JobSpec& spec) {
  auto reports = FioReports(text);
  EXPECT_TRUE(reports.ok()) << reports.status().ToString();
  return reports.ok() ? FioProgress(*reports, spec)
                      : std::vector<JobProgress>{};
}

TEST(FioLogTest, AsksFioForAReportEveryHalfSecond) {
  EXPECT_EQ(FioLogOptions(),
            std::vector<std::string>{"--status-interval=500ms"});
}

TEST(FioLogTest, SplitsFiosReportsAndTheFinalOneIsTheResult) {
  auto reports = FioReports(kMixedTwoJobs);
  ASSERT_TRUE(reports.ok()) << reports.status().ToString();
  EXPECT_EQ(reports->size(), 5u);
  auto r = ParseFioJson(kMixedTwoJobs, kMixedSpec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->bytes, 114688u);
  EXPECT_EQ(r->ios, 28u);
  // A report cut short, or a brace in a string, is no report of its own.
  EXPECT_FALSE(FioReports(std::string(kMixedTwoJobs) + "{\"jobs\": [").ok());
  auto quoted = FioReports(R"({"jobs": [{"jobname": "a}{b"}]} done)");
  ASSERT_TRUE(quoted.ok()) << quoted.status().ToString();
  EXPECT_EQ(quoted->size(), 1u);
  EXPECT_FALSE(FioReports("no json here").ok());
}

// Both directions summed (not fio's "mixed" section, which repeats them),
// the reports with ramp I/O left out, "t" the longest job's run time (not the
// jobs' summed job_runtime), the latency the samples' sum. The report at
// 1.0 s, 1 ms before the final one, gives way to it: no sliver.
TEST(FioLogTest, AMixedJobOfTwoThreadsSumsItsDirections) {
  const std::vector<JobProgress> p = Progress(kMixedTwoJobs, kMixedSpec);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].bytes, 57344u);
  EXPECT_EQ(p[0].ios, 14u);
  EXPECT_EQ(p[0].lat_ns, 18005u);  // 1000.5 * 10 + 2000 * 4
  EXPECT_DOUBLE_EQ(p[0].seconds, 0.5);
  EXPECT_FALSE(p[0].done);
  EXPECT_EQ(p[1].bytes, 114688u);
  EXPECT_EQ(p[1].ios, 28u);
  EXPECT_EQ(p[1].lat_ns, 38800u);  // 1100 * 20 + 2100 * 8
  EXPECT_DOUBLE_EQ(p[1].seconds, 1.001);
  EXPECT_TRUE(p[1].done);
}

// One direction, no ramp: each report counts but the one at 0 s (an
// interval of no length), and the final one's figures are the run's.
TEST(FioLogTest, AReadJobWithoutRampKeepsEveryReport) {
  constexpr char kRead[] = R"(
{"jobs":[{"read":{"io_bytes":0,"total_ios":0,"runtime":0,"lat_ns":{"mean":0.0,"N":0}},"write":{"io_bytes":0,"total_ios":0,"runtime":0}}]}
{"jobs":[{"read":{"io_bytes":1048576,"total_ios":8,"runtime":502,"lat_ns":{"mean":250.0,"N":8}},"write":{"io_bytes":0,"total_ios":0,"runtime":0}}]}
{"jobs":[{"read":{"io_bytes":2097152,"total_ios":16,"runtime":700,"bw_bytes":2995931,"lat_ns":{"mean":300.0,"N":16}},"write":{"io_bytes":0,"total_ios":0,"runtime":0}}]})";
  const JobSpec spec{Rw::kRead, 128 << 10, 1, 1, 2 << 20};
  const std::vector<JobProgress> p = Progress(kRead, spec);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].bytes, 1048576u);
  EXPECT_EQ(p[0].lat_ns, 2000u);
  EXPECT_DOUBLE_EQ(p[0].seconds, 0.502);
  EXPECT_EQ(p[1].bytes, 2097152u);
  EXPECT_EQ(p[1].lat_ns, 4800u);
  EXPECT_TRUE(p[1].done);
}

std::vector<nlohmann::json> LogLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    lines.push_back(nlohmann::json::parse(line, nullptr, false));
  }
  return lines;
}

// fio's lines have strata's schema, say who ran them and add up to the
// bytes of fio's result.
TEST(FioLogTest, FiosLinesHaveStratasSchemaAndAddUpToItsResult) {
  testutil::ScratchDir dir;
  RunLog log(dir.File("log.jsonl"));
  ASSERT_TRUE(log.Open().ok());
  log.Start(kMixedSpec, 1);
  log.Add(JobProgress{.bytes = 4096, .ios = 1, .seconds = 0.5, .done = true});
  log.Start(kMixedSpec, 1, "fio");
  for (const JobProgress& p : Progress(kMixedTwoJobs, kMixedSpec)) log.Add(p);
  ASSERT_TRUE(log.status().ok());
  const std::vector<nlohmann::json> lines = LogLines(dir.File("log.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  const std::set<std::string> schema = {
      "engine", "rw",    "bs",  "qd",       "threads", "run",
      "t",      "bytes", "ios", "gb_per_s", "iops",    "lat_mean_us"};
  uint64_t fio_bytes = 0;
  for (const nlohmann::json& line : lines) {
    ASSERT_TRUE(line.is_object());
    std::set<std::string> keys;
    for (const auto& [key, value] : line.items()) keys.insert(key);
    EXPECT_EQ(keys, schema) << line;
    EXPECT_EQ(line["rw"], "randrw");
    EXPECT_EQ(line["threads"], 2);
    if (line["engine"] == "fio") fio_bytes += line["bytes"].get<uint64_t>();
  }
  EXPECT_EQ(lines[0]["engine"], "strata");
  EXPECT_EQ(lines[1]["engine"], "fio");
  EXPECT_DOUBLE_EQ(lines[1]["t"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(lines[1]["gb_per_s"].get<double>(), 57344 / 0.5 / 1e9);
  EXPECT_DOUBLE_EQ(lines[2]["t"].get<double>(), 1.001);
  // The last interval's 14 ios took 38800 - (1000.5 * 10 + 2000 * 4) ns.
  EXPECT_NEAR(lines[2]["lat_mean_us"].get<double>(), 20.795 / 14, 1e-9);
  auto r = ParseFioJson(kMixedTwoJobs, kMixedSpec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(fio_bytes, r->bytes);
}

}  // namespace
}  // namespace strata::bench
