// strata-nvme-bench's --sync, --fsync N and --log: the options, the fsync
// gate of one thread, jobs that sync, fio's command and sync count, and the
// log's records. Part of nvme_bench_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "tests/testutil/testutil.h"
#include "tools/nvme_bench/cli.h"
#include "tools/nvme_bench/fio.h"
#include "tools/nvme_bench/fsync_gate.h"
#include "tools/nvme_bench/run_log.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {
namespace {

Result<BenchOptions> Parse(std::vector<const char*> args) {
  bool exit_now = false;
  args.insert(args.begin(), {"b", "--path", "/x"});
  return ParseCommandLine(static_cast<int>(args.size()),
                          const_cast<char**>(args.data()), &exit_now);
}

TEST(SyncOptionsTest, ParseAndFsyncNeedsAWriteJob) {
  auto o = Parse({"--rw", "read,randwrite", "--sync", "--fsync", "8", "--log",
                  "/tmp/l.jsonl"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_TRUE(o->sync);
  EXPECT_EQ(o->fsync, 8u);
  EXPECT_EQ(o->log, "/tmp/l.jsonl");
  auto d = Parse({});
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->sync);
  EXPECT_EQ(d->fsync, 0u);
  auto reads = Parse({"--rw", "read,randread", "--fsync", "4"});
  ASSERT_FALSE(reads.ok());
  EXPECT_NE(reads.status().message().find("--fsync"), std::string::npos);
  EXPECT_NE(reads.status().message().find("drop --fsync"), std::string::npos);
}

TEST(FsyncGateTest, HoldsWritesUntilTheSyncAfterEveryNReturns) {
  using A = FsyncGate::Admission;
  using P = FsyncGate::Phase;
  FsyncGate gate(/*every=*/2, /*limit=*/3);
  int a, b, c, d;
  EXPECT_EQ(gate.Admit(&a), A::kGo);
  EXPECT_EQ(gate.phase(), P::kIssuing);
  EXPECT_EQ(gate.Admit(&b), A::kGo);
  EXPECT_EQ(gate.phase(), P::kDraining);  // the interval's 2 are issued
  EXPECT_EQ(gate.Admit(&c), A::kParked);
  EXPECT_FALSE(gate.Completed(&a));
  EXPECT_EQ(gate.phase(), P::kDraining);
  EXPECT_TRUE(gate.Completed(&b));  // both back: the sync is due
  EXPECT_EQ(gate.phase(), P::kSyncing);
  EXPECT_EQ(gate.Admit(&d), A::kParked);  // while it runs
  EXPECT_EQ(gate.syncs(), 0u);
  std::vector<void*> resumed = gate.Synced();
  EXPECT_EQ(gate.syncs(), 1u);
  EXPECT_EQ(gate.phase(), P::kIssuing);
  std::sort(resumed.begin(), resumed.end());
  std::vector<void*> want = {&b, &c, &d};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(resumed, want);
  EXPECT_EQ(gate.Admit(&c), A::kGo);
  EXPECT_EQ(gate.Admit(&d), A::kDone);  // 3 writes in all
  EXPECT_FALSE(gate.Completed(&c));     // 3 of 4: no second sync
  EXPECT_EQ(gate.phase(), P::kIssuing);
  EXPECT_EQ(gate.syncs(), 1u);
}

// A limit at an interval's end: its last sync still runs, and the slots
// parked for it then find the writes all issued.
TEST(FsyncGateTest, TheLastIntervalsSyncRunsBeforeTheGateIsDone) {
  using A = FsyncGate::Admission;
  FsyncGate gate(/*every=*/1, /*limit=*/1);
  int a, b;
  EXPECT_EQ(gate.Admit(&a), A::kGo);
  EXPECT_EQ(gate.Admit(&b), A::kParked);
  EXPECT_TRUE(gate.Completed(&a));
  EXPECT_EQ(gate.Synced().size(), 2u);
  EXPECT_EQ(gate.Admit(&a), A::kDone);
  EXPECT_EQ(gate.Admit(&b), A::kDone);
  EXPECT_EQ(gate.syncs(), 1u);
}

// Counts, per thread's slice, the writes submitted and completed, and the
// syncs that completed; notes a write submitted before the previous
// interval's writes were all back and its sync over (the syncs of both
// threads together are counted, so at least as many as this thread's
// intervals must have ended).
class IntervalInjector : public aio::FaultInjector {
 public:
  IntervalInjector(uint64_t slice, uint64_t every)
      : slice_(slice), every_(every) {}
  uint32_t SubmitLength(bool write, uint64_t offset, uint32_t len) override {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t k = submitted_[offset / slice_]++;
    const uint64_t intervals = k / every_;
    if (write && (completed_[offset / slice_] < intervals * every_ ||
                  syncs_ < intervals)) {
      early_++;
    }
    return len;
  }
  int SyncResult(int result) override {
    std::lock_guard<std::mutex> lock(mu_);
    syncs_++;
    return result;
  }
  uint64_t syncs() {
    std::lock_guard<std::mutex> lock(mu_);
    return syncs_;
  }
  int CompletionResult(bool, uint64_t offset, uint32_t, int result) override {
    std::lock_guard<std::mutex> lock(mu_);
    completed_[offset / slice_]++;
    return result;
  }
  int early() {
    std::lock_guard<std::mutex> lock(mu_);
    return early_;
  }

 private:
  std::mutex mu_;
  uint64_t slice_, every_;
  uint64_t submitted_[8] = {}, completed_[8] = {};
  uint64_t syncs_ = 0;
  int early_ = 0;
};

class SyncJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = aio::PinnedBuffer::Allocate(kPool, aio::PinOptions{false});
    ASSERT_TRUE(b.ok());
    pool_ = std::move(*b);
    auto s = OpenSession(Target{{path_}}, 1, 1, 1 << 20, kSize);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    direct_ = s->files[0]->direct();
  }
  static constexpr uint64_t kSize = 1 << 20;
  static constexpr size_t kPool = 4 << 20;
  testutil::ScratchDir dir_;
  std::string path_ = dir_.File("sync.dat");
  bool direct_ = true;
  aio::PinnedBuffer pool_;
};

// 2 threads of 8 writes of 64 KiB each: floor(8 / N) syncs per thread, and
// no thread's write goes out before its previous interval is back.
TEST_F(SyncJobTest, CountsFloorOfWritesOverNPerThread) {
  for (Rw rw : {Rw::kWrite, Rw::kRandWrite, Rw::kRead}) {
    for (uint64_t n : {1u, 3u, 4u, 9u}) {
      IntervalInjector check(kSize / 2, n);
      JobSpec spec{rw, 64 << 10, 4, 2, kSize};
      spec.fsync = n;
      auto r =
          RunJob(spec, Target{{path_}, direct_, aio::Backend::kAuto, &check},
                 pool_.data(), pool_.size(), nullptr);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->ios, 16u);
      EXPECT_EQ(r->syncs, IsWrite(rw) ? 2 * (8 / n) : 0) << RwName(rw) << n;
      EXPECT_EQ(check.syncs(), r->syncs) << "the engine ran them all";
      if (IsWrite(rw)) {
        EXPECT_EQ(check.early(), 0) << RwName(rw) << " " << n;
      }
    }
  }
}

struct SyncEio : aio::FaultInjector {
  int SyncResult(int) override { return -EIO; }
};

TEST_F(SyncJobTest, AFailedSyncEndsTheJobWithItsError) {
  SyncEio eio;
  JobSpec spec{Rw::kRandWrite, 64 << 10, 4, 2, kSize};
  spec.fsync = 3;
  auto r = RunJob(spec, Target{{path_}, direct_, aio::Backend::kAuto, &eio},
                  pool_.data(), pool_.size(), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find("fdatasync of '" + path_ + "'"),
            std::string::npos)
      << r.status().ToString();
}

TEST_F(SyncJobTest, ATimedJobSyncsAndItsLastReportClosesTheRun) {
  JobSpec spec{Rw::kWrite, 64 << 10, 2, 2, kSize, /*seconds=*/0.2};
  spec.fsync = 4;
  std::vector<JobProgress> reports;
  Target target{{path_}, direct_};
  target.dsync = true;
  auto r = RunJob(spec, target, pool_.data(), pool_.size(),
                  [&](const JobProgress& p) { reports.push_back(p); });
  if (!r.ok() && !direct_) GTEST_SKIP() << "scratch has no O_DIRECT";
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->dsync);
  EXPECT_GE(r->syncs, 2u);  // each thread's first 4 writes
  ASSERT_FALSE(reports.empty());
  EXPECT_TRUE(reports.back().done);
  EXPECT_EQ(reports.back().bytes, r->bytes);
  EXPECT_EQ(reports.back().ios, r->ios);
  EXPECT_DOUBLE_EQ(reports.back().seconds, r->seconds);
}

TEST(SyncFioTest, CommandSyncsAndTheCountIsFiosSyncSection) {
  JobSpec spec{Rw::kWrite, 1 << 20, 32, 4, 1 << 30};
  auto has = [](const std::vector<std::string>& cmd, const std::string& arg) {
    return std::find(cmd.begin(), cmd.end(), arg) != cmd.end();
  };
  const auto plain = FioCommand("fio", {"/d/f"}, spec, true, {});
  EXPECT_TRUE(std::none_of(plain.begin(), plain.end(), [](const auto& a) {
    return a.rfind("--fsync=", 0) == 0;
  }));
  spec.fsync = 16;
  EXPECT_TRUE(has(FioCommand("fio", {"/d/f"}, spec, true, {}), "--fsync=16"));

  std::ifstream in(STRATA_TEST_DATA "/fio_randread.json");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json doc = nlohmann::json::parse(text.str());
  doc["jobs"][0]["sync"]["total_ios"] = 7;
  auto r = ParseFioJson(doc.dump(), JobSpec{Rw::kRandRead, 128 << 10, 8, 2});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->syncs, 7u);
}

TEST(RunLogTest, ARecordIsTheIntervalsFigures) {
  const JobSpec spec{Rw::kRandWrite, 4096, 16, 2};
  const JobProgress prev{
      .bytes = 1'000'000'000, .ios = 1000, .lat_ns = 5'000'000, .seconds = 0.5};
  const JobProgress now{.bytes = 3'000'000'000,
                        .ios = 3000,
                        .lat_ns = 25'000'000,
                        .seconds = 1.0};
  const nlohmann::json j = LogRecord("strata", spec, 2, prev, now);
  EXPECT_EQ(j["engine"], "strata");
  EXPECT_EQ(j["rw"], "randwrite");
  EXPECT_EQ(j["bs"], 4096);
  EXPECT_EQ(j["qd"], 16);
  EXPECT_EQ(j["threads"], 2);
  EXPECT_EQ(j["run"], 2);
  EXPECT_DOUBLE_EQ(j["t"].get<double>(), 1.0);
  EXPECT_EQ(j["bytes"], 2'000'000'000u);
  EXPECT_EQ(j["ios"], 2000u);
  EXPECT_DOUBLE_EQ(j["gb_per_s"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(j["iops"].get<double>(), 4000.0);
  EXPECT_DOUBLE_EQ(j["lat_mean_us"].get<double>(), 10.0);  // 20 ms / 2000
  const nlohmann::json idle = LogRecord("fio", spec, 1, now, now);
  EXPECT_EQ(idle["engine"], "fio");
  EXPECT_EQ(idle["gb_per_s"], 0.0);
  EXPECT_EQ(idle["lat_mean_us"], 0.0);
}

TEST(RunLogTest, WritesOneLinePerReportAndNamesAnUnwritablePath) {
  testutil::ScratchDir dir;
  RunLog log(dir.File("log.jsonl"));
  ASSERT_TRUE(log.Open().ok());
  log.Start(JobSpec{}, 1);
  log.Add(JobProgress{.bytes = 10, .ios = 1, .seconds = 0.5});
  log.Add(JobProgress{.bytes = 30, .ios = 3, .seconds = 0.7, .done = true});
  log.Start(JobSpec{}, 2);
  log.Add(JobProgress{.bytes = 5, .ios = 1, .seconds = 0.1, .done = true});
  ASSERT_TRUE(log.status().ok());
  std::ifstream in(dir.File("log.jsonl"));
  std::vector<uint64_t> bytes;
  for (std::string line; std::getline(in, line);) {
    bytes.push_back(nlohmann::json::parse(line)["bytes"].get<uint64_t>());
  }
  EXPECT_EQ(bytes, (std::vector<uint64_t>{10, 20, 5}));
  RunLog bad(dir.File("no/such/dir/log.jsonl"));
  const Status st = bad.Open();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--log"), std::string::npos);
  EXPECT_NE(st.message().find("no/such/dir"), std::string::npos);
}

}  // namespace
}  // namespace strata::bench
