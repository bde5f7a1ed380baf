// strata-nvme-bench's output: the disk's counters, the table, the JSON
// records and --recommend.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testutil/testutil.h"
#include "tools/nvme_bench/device_stat.h"
#include "tools/nvme_bench/report.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {
namespace {
// A known line of /sys/block/vda/stat (17 fields, Linux 5.5 and later).
constexpr char kStatLine[] =
    "52247596  2965674 4347640544 19527176 39460462  4117119 5719445747 "
    "11178107       32  2018216 30835658   693190     1098 6343619072   "
    "126895    65178     3479\n";

TEST(DiskStatTest, ParsesEveryKernelsStatLine) {
  auto c = ParseDiskStat(kStatLine);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->reads, 52247596u);
  EXPECT_EQ(c->read_merges, 2965674u);
  EXPECT_EQ(c->read_sectors, 4347640544u);
  EXPECT_EQ(c->writes, 39460462u);
  EXPECT_EQ(c->write_merges, 4117119u);
  EXPECT_EQ(c->write_sectors, 5719445747u);
  // Kernels before 4.18 wrote 11 fields.
  auto old = ParseDiskStat("1 2 3 4 5 6 7 8 9 10 11");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->writes, 5u);
  EXPECT_EQ(old->write_sectors, 7u);
  EXPECT_FALSE(ParseDiskStat("1 2 3").ok());
  EXPECT_FALSE(ParseDiskStat("").ok());
  EXPECT_FALSE(ParseDiskStat("1 2 3 4 5 6 7 8 9 10 x").ok());
}

TEST(DiskStatTest, DeltaCountsWhatTheDeviceServed) {
  DiskCounters a, b;
  a.reads = 100, a.read_merges = 5, a.read_sectors = 800;
  b = a;
  b.reads += 10;        // 10 requests reached the device
  b.read_merges += 30;  // 30 more were merged into them
  b.read_sectors += 10 * 2048;
  b.writes += 2;
  b.write_sectors += 16;
  const DeviceFigures f = Delta(a, b);
  EXPECT_EQ(f.requests, 12u);
  EXPECT_EQ(f.merges, 30u);
  EXPECT_EQ(f.bytes, (10 * 2048 + 16) * 512u);
  EXPECT_DOUBLE_EQ(f.mean_request_bytes(), f.bytes / 12.0);
  EXPECT_EQ(Delta(b, a).requests, 0u);  // never negative
}

// A sysfs tree in which the scratch directory's device is partition 1 of
// disk "fakedisk": the disk's counters are the ones read.
TEST(DiskStatTest, FindsThePartitionsDisk) {
  namespace fs = std::filesystem;
  testutil::ScratchDir dir;
  struct stat st;
  ASSERT_EQ(stat(dir.path().c_str(), &st), 0);
  if (major(st.st_dev) == 0) GTEST_SKIP() << "scratch is on no block device";
  const fs::path sys = dir.File("sys");
  const fs::path disk = sys / "devices/virtual/block/fakedisk";
  fs::create_directories(disk / "fakedisk1");
  fs::create_directories(sys / "dev/block");
  std::ofstream(disk / "fakedisk1/partition") << "1\n";
  std::ofstream(disk / "fakedisk1/stat") << "9 9 9 9 9 9 9 9 9 9 9\n";
  std::ofstream(disk / "stat") << kStatLine;
  const std::string id =
      std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  fs::create_symlink("../../devices/virtual/block/fakedisk/fakedisk1",
                     sys / "dev/block" / id);
  auto found = DiskStat::ForPath(dir.path(), sys.string());
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->name(), "fakedisk");
  auto c = found->Read();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->reads, 52247596u);
}

TEST(DiskStatTest, NamesAPathOnNoBlockDevice) {
  auto none = DiskStat::ForPath("/proc/self");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("no block device"), std::string::npos)
      << none.status().message();
}

JobResult Fake(Rw rw, size_t bs, int qd, int threads, double gbps) {
  JobResult r;
  r.spec = JobSpec{rw, bs, qd, threads, 1 << 30};
  r.backend = "io_uring";
  r.submit_batch = 2;
  r.bytes = static_cast<uint64_t>(gbps * 1e9);
  r.ios = r.bytes / bs;
  r.seconds = 1;
  return r;
}

Row FakeRow(Rw rw, size_t bs, int qd, std::vector<double> runs) {
  Row row;
  row.strata_gbps = runs;
  row.strata = Fake(rw, bs, qd, 1, runs[MedianIndex(runs)]);
  return row;
}

TEST(ReportTest, RecommendsTheCheapestNearBestConfiguration) {
  std::vector<Row> rows(4);
  rows[0].strata = Fake(Rw::kRead, 1 << 20, 128, 1, 3.00);
  rows[1].strata = Fake(Rw::kRead, 1 << 20, 32, 1, 2.97);  // within 2%
  rows[2].strata = Fake(Rw::kRead, 1 << 20, 8, 1, 2.00);
  rows[3].strata = Fake(Rw::kWrite, 128 << 10, 32, 2, 1.50);
  const std::string text = Recommend(rows);
  EXPECT_NE(text.find("recommended for read: bs=1M qd=32 threads=1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\"queue_depth\": 32"), std::string::npos);
  EXPECT_NE(text.find("\"submit_batch\": 2"), std::string::npos) << text;
  EXPECT_NE(text.find("recommended for write: bs=128K qd=32 threads=2"),
            std::string::npos);
}

// The pick wins beyond the spread of the runs, not by one lucky run.
TEST(ReportTest, RecommendsOnlyWhatWinsBeyondTheSpread) {
  // qd 128's median is best, but qd 32's runs overlap its: the cheaper wins.
  std::vector<Row> level = {
      FakeRow(Rw::kRandRead, 4096, 128, {1.95, 1.83, 1.99}),
      FakeRow(Rw::kRandRead, 4096, 32, {1.83, 1.90, 1.86})};
  EXPECT_NE(Recommend(level).find("bs=4K qd=32"), std::string::npos)
      << Recommend(level);
  // Here every run of qd 128 beats every run of qd 32 by more than the noise.
  std::vector<Row> apart = {
      FakeRow(Rw::kRandRead, 4096, 128, {1.95, 1.93, 1.99}),
      FakeRow(Rw::kRandRead, 4096, 32, {1.70, 1.75, 1.72})};
  const std::string text = Recommend(apart);
  EXPECT_NE(text.find("bs=4K qd=128"), std::string::npos) << text;
  EXPECT_NE(text.find("runs 1.930-1.990"), std::string::npos) << text;
}

TEST(ReportTest, JsonRecordHasTheDocumentedFields) {
  Row row;
  row.strata = Fake(Rw::kRead, 1 << 20, 32, 1, 2.0);
  row.strata.device = DeviceFigures{500, 1500, 2'000'000'000};
  row.strata_gbps = {2.0, 1.9, 2.1};
  row.fio = Fake(Rw::kRead, 1 << 20, 32, 1, 1.6);
  row.fio_gbps = {1.6, 1.5, 1.7};
  row.fio_buffers = "huge pages";
  row.disk = "vda";
  const nlohmann::json j = RowJson(row);
  for (const char* key :
       {"rw", "bs", "qd", "threads", "direct", "backend", "bytes", "seconds",
        "gb_per_s", "gib_per_s", "iops", "lat_us", "cpu", "device",
        "runs_gb_per_s", "fio", "strata_over_fio"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  for (const char* key :
       {"min", "mean", "p50", "p99", "p999", "p9999", "max"}) {
    EXPECT_TRUE(j["lat_us"].contains(key)) << key;
    EXPECT_TRUE(j["fio"]["lat_us"].contains(key)) << key;
  }
  EXPECT_TRUE(j["cpu"].contains("sys"));
  EXPECT_TRUE(j["fio"]["cpu"].contains("usr"));
  EXPECT_EQ(j["fio"]["runs_gb_per_s"].size(), 3u);
  EXPECT_EQ(j["fio"]["buffers"], "huge pages");
  EXPECT_FALSE(j["fio"].contains("device"));
  EXPECT_EQ(j["device"]["disk"], "vda");
  EXPECT_EQ(j["device"]["requests"], 500u);
  EXPECT_EQ(j["device"]["merges"], 1500u);
  EXPECT_DOUBLE_EQ(j["device"]["mean_request_bytes"].get<double>(), 4e6);
  EXPECT_NEAR(j["strata_over_fio"].get<double>(), 1.25, 1e-12);
  EXPECT_NEAR(j["gib_per_s"].get<double>(), 2e9 / (1 << 30), 1e-9);
  EXPECT_EQ(MedianIndex({3.0, 1.0, 2.0}), 2u);
}

// A run whose requests the block layer merged says so: the device served
// 500 requests of the 1907 submitted.
TEST(ReportTest, TableMarksRunsTheDeviceSawDifferently) {
  Row row;
  row.disk = "vda";
  row.strata = Fake(Rw::kWrite, 1 << 20, 32, 1, 2.0);
  row.strata.device = DeviceFigures{500, 1407, 2'000'000'000};
  row.strata_gbps = {2.0};
  row.fio = Fake(Rw::kWrite, 1 << 20, 32, 1, 2.0);
  row.fio->device = DeviceFigures{1907, 0, 2'000'000'000};
  row.fio_gbps = {2.0};
  EXPECT_FALSE(DeviceDiffers(*row.fio));
  EXPECT_TRUE(DeviceDiffers(row.strata));
  const std::string table = TableHeader() + "\n" + TableRow(row);
  std::istringstream lines(table);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    ++count;
    EXPECT_LE(line.size(), 100u) << line;
  }
  EXPECT_EQ(count, 4);  // header, strata, fio, strata/fio
  EXPECT_NE(table.find("500*"), std::string::npos) << table;
  EXPECT_NE(table.find("3906.2"), std::string::npos) << table;  // dev KiB
  EXPECT_NE(table.find("strata/fio 1.000"), std::string::npos) << table;
  EXPECT_NE(TableNotes({row}).find("/sys/block/vda/stat"), std::string::npos);
  row.disk = "vda+vdb";  // striped over two disks
  EXPECT_NE(TableNotes({row}).find("what vda+vdb served (/sys/block/{vda,vdb}"),
            std::string::npos)
      << TableNotes({row});
  row.strata.device->requests = 1907;
  EXPECT_EQ(TableNotes({row}), "");
}

// --vs-fio with --submit-batch other than 1: the header says that fio
// submits one request an enter, so that the ratio is read as what it is.
TEST(ReportTest, SaysWhenStrataBatchesAndFioDoesNot) {
  EXPECT_EQ(SubmitBatchNote(1), "");
  EXPECT_NE(SubmitBatchNote(0).find("strata submits every ready request(s)"),
            std::string::npos);
  EXPECT_NE(SubmitBatchNote(8).find("up to 8 request(s) an enter"),
            std::string::npos);
  EXPECT_NE(SubmitBatchNote(8).find("the ratio compares different jobs"),
            std::string::npos);
}

}  // namespace
}  // namespace strata::bench
