// strata-nvme-bench's mixed jobs (--rw rw/randrw with --rwmixread) and
// --ramp: the command line, the requests' directions, what a ramp leaves
// uncounted, fio's command and JSON, the table and the JSON records. Part
// of nvme_bench_test (nvme_bench_test.cc holds the rest).
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <sstream>

#include "tests/testutil/testutil.h"
#include "tests/tools/nvme_bench_workload.h"
#include "tools/nvme_bench/cli.h"
#include "tools/nvme_bench/fio.h"
#include "tools/nvme_bench/progress.h"
#include "tools/nvme_bench/report.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {
namespace {

Result<BenchOptions> Parse(std::vector<const char*> args) {
  args.insert(args.begin(), {"b", "--path", "/x"});
  bool exit_now = false;
  return ParseCommandLine(static_cast<int>(args.size()),
                          const_cast<char**>(args.data()), &exit_now);
}

TEST(MixCommandLineTest, ParsesMixedPatternsRwmixreadAndRamp) {
  auto o = Parse({"--rw", "randrw,rw", "--rwmixread", "70", "--time", "2",
                  "--ramp", "0.5"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rw, (std::vector<Rw>{Rw::kRandReadWrite, Rw::kReadWrite}));
  EXPECT_EQ(o->rwmixread, 70);
  EXPECT_DOUBLE_EQ(o->ramp, 0.5);
  auto d = Parse({"--rw", "randrw"});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->rwmixread, 50);  // fio's default
  EXPECT_EQ(d->ramp, 0);
  EXPECT_TRUE(IsMixed(Rw::kReadWrite) && IsWrite(Rw::kReadWrite) &&
              IsRead(Rw::kReadWrite) && !IsRandom(Rw::kReadWrite));
  EXPECT_TRUE(IsRandom(Rw::kRandReadWrite) && IsWrite(Rw::kRandReadWrite));
}

TEST(MixCommandLineTest, RejectsABadMixOrRampWithTheFix) {
  for (const char* bad : {"101", "-1"}) {
    auto o = Parse({"--rw", "randrw", "--rwmixread", bad});
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_NE(o.status().message().find("--rwmixread: " + std::string(bad) +
                                        " is not a percentage; give the share "
                                        "of reads in 0..100"),
              std::string::npos)
        << o.status().message();
  }
  auto untimed = Parse({"--ramp", "1"});
  ASSERT_FALSE(untimed.ok());
  EXPECT_NE(untimed.status().message().find("--ramp needs --time"),
            std::string::npos)
      << untimed.status().message();
  EXPECT_NE(untimed.status().message().find("add --time S or drop --ramp"),
            std::string::npos);
  auto negative = Parse({"--ramp", "-1", "--time", "1"});
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("--ramp must be >= 0"),
            std::string::npos);
}

// Requests that reach the engine, by direction.
struct DirectionCounter : aio::FaultInjector {
  uint32_t SubmitLength(bool write, uint64_t, uint32_t len) override {
    (write ? writes : reads).fetch_add(1);
    return len;
  }
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> writes{0};
};

class MixWorkloadTest : public WorkloadTest {
 protected:
  Result<JobResult> Run(const JobSpec& spec, aio::FaultInjector* faults) {
    return RunJob(spec, Target{{path_}, direct_, aio::Backend::kAuto, faults},
                  pool_.data(), pool_.size(), nullptr);
  }
};

// 4096 requests of 4K, each a read with probability 70%: the share is
// counted, not timed, and the engine saw each request's direction.
TEST_F(MixWorkloadTest, ReadShareFollowsRwmixreadAndDirectionsAddUp) {
  for (Rw rw : {Rw::kRandReadWrite, Rw::kReadWrite}) {
    DirectionCounter seen;
    JobSpec spec{rw, 4096, 8, 2, kSize};
    spec.rwmixread = 70;
    auto r = Run(spec, &seen);
    ASSERT_TRUE(r.ok()) << RwName(rw) << ": " << r.status().ToString();
    EXPECT_EQ(r->ios, kSize / 4096);
    EXPECT_NEAR(r->read_share(), 0.70, 0.05) << RwName(rw);
    EXPECT_EQ(r->read.bytes + r->write.bytes, r->bytes);
    EXPECT_EQ(r->bytes, kSize);
    EXPECT_EQ(r->read.ios + r->write.ios, r->ios);
    EXPECT_EQ(r->read.bytes, r->read.ios * 4096);
    EXPECT_EQ(seen.reads.load(), r->read.ios);
    EXPECT_EQ(seen.writes.load(), r->write.ios);
    EXPECT_GT(r->read.lat.p50, 0);
    EXPECT_GT(r->write.lat.p50, 0);
    EXPECT_LE(r->lat.min, std::min(r->read.lat.min, r->write.lat.min));
    // One pass issues every request index once: the same seed draws the
    // same directions, another seed others.
    auto again = Run(spec, nullptr);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->read.ios, r->read.ios);
    spec.seed = 2;
    auto other = Run(spec, nullptr);
    ASSERT_TRUE(other.ok());
    EXPECT_NE(other->read.ios, r->read.ios);
  }
}

TEST_F(MixWorkloadTest, RwmixreadZeroWritesOnlyAndHundredReadsOnly) {
  for (int mix : {0, 100}) {
    DirectionCounter seen;
    JobSpec spec{Rw::kRandReadWrite, 64 << 10, 4, 1, kSize};
    spec.rwmixread = mix;
    auto r = Run(spec, &seen);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const uint64_t all = kSize / (64 << 10);
    EXPECT_EQ(r->read.ios, mix == 100 ? all : 0) << mix;
    EXPECT_EQ(r->write.ios, mix == 0 ? all : 0) << mix;
    EXPECT_EQ(seen.reads.load(), r->read.ios);
    EXPECT_EQ(seen.writes.load(), r->write.ios);
    EXPECT_DOUBLE_EQ(r->read_share(), mix / 100.0);
  }
}

// The offsets the engine was handed, by direction, in order.
struct OffsetRecorder : aio::FaultInjector {
  uint32_t SubmitLength(bool write, uint64_t offset, uint32_t len) override {
    std::lock_guard<std::mutex> lock(mu);
    offsets[write].push_back(offset);
    return len;
  }
  std::mutex mu;
  std::vector<uint64_t> offsets[2];
};

// As fio's rw: reads and writes each walk the file from its start.
TEST_F(MixWorkloadTest, SequentialMixedJobsKeepAnOffsetPerDirection) {
  OffsetRecorder seen;
  JobSpec spec{Rw::kReadWrite, 64 << 10, 1, 1, kSize};
  auto r = Run(spec, &seen);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (int write : {0, 1}) {
    const std::vector<uint64_t>& got = seen.offsets[write];
    EXPECT_EQ(got.size(), write ? r->write.ios : r->read.ios);
    EXPECT_GT(got.size(), 0u);
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(got[k], k * (64 << 10)) << (write ? "write " : "read ") << k;
    }
  }
}

// The ramp's requests reach the device but not the figures; the caller
// hears when the counted part begins (to read the disk's counters then).
TEST_F(MixWorkloadTest, RampedRequestsAreNotCounted) {
  DirectionCounter count;
  JobSpec spec{Rw::kRandRead, 64 << 10, 2, 1, 1 << 20, /*seconds=*/0.1};
  spec.ramp = 0.3;
  Target target{{path_}, direct_, aio::Backend::kAuto, &count};
  std::vector<uint64_t> ramp_ends;  // transfers by then, once per call
  target.on_ramp_end = [&] { ramp_ends.push_back(count.reads.load()); };
  auto r = RunJob(spec, target, pool_.data(), pool_.size(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(ramp_ends.size(), 1u);
  EXPECT_GT(ramp_ends[0], 0u);
  EXPECT_GT(r->ios, 0u);
  EXPECT_LT(r->ios, count.reads.load());
  EXPECT_EQ(r->bytes, r->ios * (64 << 10));
  EXPECT_GE(r->seconds, 0.1);  // the measured part, never before its end
  spec.seconds = 0;
  auto untimed = Run(spec, nullptr);
  ASSERT_FALSE(untimed.ok());
  EXPECT_NE(untimed.status().message().find("--ramp needs --time"),
            std::string::npos);
}

// Progress counts the ramp's seconds: half way at the ramp's end.
TEST(MixProgressTest, PercentCountsTheRamp) {
  JobSpec spec{Rw::kRead, 1 << 20, 32, 1, 1 << 30, /*seconds=*/2};
  spec.ramp = 2;
  EXPECT_EQ(JobProgressText("j", spec, {0, 1.0}, {100'000'000, 2.0}),
            "j: 50% 0.100 GB/s");
}

TEST(MixFioTest, CommandAsksForTheMixAndTheRamp) {
  JobSpec spec{Rw::kRandReadWrite, 4096, 8, 1, 1 << 20, /*seconds=*/2};
  spec.rwmixread = 70;
  spec.ramp = 1.5;
  const auto cmd = FioCommand("fio", {"/d/f"}, spec, false, {});
  auto has = [&](const std::string& arg) {
    return std::find(cmd.begin(), cmd.end(), arg) != cmd.end();
  };
  EXPECT_TRUE(has("--rw=randrw"));
  EXPECT_TRUE(has("--rwmixread=70"));
  EXPECT_TRUE(has("--unified_rw_reporting=both"));
  EXPECT_TRUE(has("--ramp_time=1500ms"));
  EXPECT_TRUE(has("--end_fsync=1"));  // buffered: it writes, and reads
  EXPECT_TRUE(has("--invalidate=1"));
  spec.rw = Rw::kReadWrite;
  spec.ramp = 0;
  const auto seq = FioCommand("fio", {"/d/f"}, spec, true, {});
  EXPECT_NE(std::find(seq.begin(), seq.end(), "--rw=rw"), seq.end());
  for (const std::string& arg : seq) {
    EXPECT_EQ(arg.find("--ramp_time"), std::string::npos);
  }
}

// A real fio 3.33 run: --rw=randrw --rwmixread=70 --bs=64K --numjobs=2,
// 4 MiB each, --unified_rw_reporting=both.
TEST(MixFioTest, ParsesAMixedJobsSectionsAndTheirSum) {
  std::ifstream in(STRATA_TEST_DATA "/fio_randrw.json");
  std::stringstream text;
  text << in.rdbuf();
  JobSpec spec{Rw::kRandReadWrite, 64 << 10, 4, 2, 8 << 20};
  auto r = ParseFioJson(text.str(), spec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->read.bytes, 6160384u);
  EXPECT_EQ(r->read.ios, 94u);
  EXPECT_EQ(r->write.bytes, 2228224u);
  EXPECT_EQ(r->write.ios, 34u);
  EXPECT_EQ(r->bytes, 8388608u);
  EXPECT_EQ(r->ios, 128u);
  EXPECT_NEAR(r->gb_per_s(), (1232076800.0 + 445644800.0) / 1e9, 1e-9);
  EXPECT_NEAR(r->read.lat.p50, 183.296, 1e-9);
  EXPECT_NEAR(r->write.lat.p50, 201.728, 1e-9);
  EXPECT_NEAR(r->lat.p50, 185.344, 1e-9);  // fio's "mixed" section
  EXPECT_NEAR(r->lat.min, 102.924, 1e-9);
  EXPECT_NEAR(r->lat.max, 1822.080, 1e-9);
  EXPECT_NEAR(r->read_share(), 94.0 / 128, 1e-12);
  // Without the "mixed" section the totals still add up.
  nlohmann::json doc = nlohmann::json::parse(text.str());
  doc["jobs"][0].erase("mixed");
  auto no_mixed = ParseFioJson(doc.dump(), spec);
  ASSERT_TRUE(no_mixed.ok());
  EXPECT_EQ(no_mixed->bytes, 8388608u);
  EXPECT_NEAR(no_mixed->lat.p99, 1826.816, 1e-9);  // the larger direction's
  doc["jobs"][0].erase("write");
  EXPECT_FALSE(ParseFioJson(doc.dump(), spec).ok());
}

JobResult FakeMixed(double gbps) {
  JobResult r;
  r.spec = JobSpec{Rw::kRandReadWrite, 4096, 32, 1, 1 << 30};
  r.spec.rwmixread = 70;
  r.backend = "io_uring";
  r.seconds = 1;
  r.bytes = static_cast<uint64_t>(gbps * 1e9) / 4096 * 4096;
  r.ios = r.bytes / 4096;
  r.read.ios = r.ios * 7 / 10;
  r.read.bytes = r.read.ios * 4096;
  r.read.lat.p50 = 90;
  r.write.ios = r.ios - r.read.ios;
  r.write.bytes = r.write.ios * 4096;
  r.write.lat.p50 = 160;
  r.lat.p50 = 100;
  return r;
}

TEST(MixReportTest, MixedRowsHaveALinePerDirectionWithin100Columns) {
  Row row;
  row.disk = "vda";
  row.strata = FakeMixed(1.0);
  row.strata.device = DeviceFigures{244140, 0, 1'000'000'000};
  row.strata_gbps = {1.0};
  row.fio = FakeMixed(1.0);
  row.fio_gbps = {1.0};
  const std::string table = TableHeader() + "\n" + TableRow(row);
  std::istringstream lines(table);
  std::vector<std::string> all;
  for (std::string line; std::getline(lines, line);) {
    EXPECT_LE(line.size(), 100u) << line;
    all.push_back(line);
  }
  // header; strata, its read and write; fio, its read and write; the ratio
  ASSERT_EQ(all.size(), 8u) << table;
  EXPECT_EQ(all[2].find("    read "), 23u) << all[2];
  EXPECT_EQ(all[3].find("    write"), 23u) << all[3];
  EXPECT_NE(all[2].find(" 0.700 "), std::string::npos) << all[2];  // GB/s
  EXPECT_NE(all[3].find(" 160 "), std::string::npos) << all[3];    // p50
  EXPECT_NE(all[5].find("    read "), std::string::npos) << all[5];
}

TEST(MixReportTest, MixedJsonRecordHasEachDirection) {
  Row row;
  row.strata = FakeMixed(1.0);
  row.strata.spec.seconds = 2;
  row.strata.spec.ramp = 0.5;
  row.strata_gbps = {1.0};
  row.fio = FakeMixed(1.0);
  row.fio_gbps = {1.0};
  const nlohmann::json j = RowJson(row);
  EXPECT_EQ(j["rw"], "randrw");
  EXPECT_EQ(j["rwmixread"], 70);
  EXPECT_EQ(j["ramp_seconds"], 0.5);
  for (const nlohmann::json* rec : {&j, &j["fio"]}) {
    for (const char* dir : {"read", "write"}) {
      ASSERT_TRUE(rec->contains(dir)) << dir;
      for (const char* key : {"bytes", "iops", "gb_per_s", "lat_us"}) {
        EXPECT_TRUE((*rec)[dir].contains(key)) << dir << " " << key;
      }
    }
    EXPECT_EQ((*rec)["read"]["bytes"].get<uint64_t>() +
                  (*rec)["write"]["bytes"].get<uint64_t>(),
              (*rec)["bytes"].get<uint64_t>());
    EXPECT_NEAR((*rec)["read_share"].get<double>(), 0.7, 1e-4);
    EXPECT_EQ((*rec)["write"]["lat_us"]["p50"], 160);
  }
  row.strata.spec.rw = Rw::kRandRead;
  row.strata.spec.ramp = 0;
  const nlohmann::json plain = RowJson(row);
  EXPECT_FALSE(plain.contains("read_share"));
  EXPECT_FALSE(plain.contains("rwmixread"));
  EXPECT_FALSE(plain.contains("ramp_seconds"));
}

// --rwmixread 100: the write direction has no request, and so no latency:
// "-" in the table and null in the JSON, not 0 us.
TEST(MixReportTest, ADirectionWithoutRequestsHasNoLatency) {
  Row row;
  row.strata = FakeMixed(1.0);
  row.strata.read.ios += row.strata.write.ios;
  row.strata.read.bytes += row.strata.write.bytes;
  row.strata.write = DirectionResult{};
  row.strata_gbps = {1.0};
  const std::string table = TableRow(row);
  const std::string write = table.substr(table.rfind('\n') + 1);
  EXPECT_NE(write.find("write  0.000        0       -       -        -"),
            std::string::npos)
      << write;
  const nlohmann::json j = RowJson(row);
  EXPECT_TRUE(j["write"]["lat_us"].is_null()) << j["write"];
  EXPECT_EQ(j["read"]["lat_us"]["p50"], 90);
}

}  // namespace
}  // namespace strata::bench
