// strata-nvme-bench's --sync, --fsync N and --log: the options, the fsync
// gate of one thread, jobs that sync, fio's command and sync count, and the
// log's records. Part of nvme_bench_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <fstream>
#include <future>
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

// A file whose Sync() waits until the test lets it return.
class HeldFile : public aio::File {
 public:
  const std::string& path() const override { return path_; }
  uint64_t size() const override { return 0; }
  bool direct() const override { return true; }
  bool read_only() const override { return false; }
  uint32_t mem_align() const override { return 1; }
  uint32_t offset_align() const override { return 1; }
  Status Sync() override {
    entered.set_value();
    release.get_future().wait();
    return Status::Ok();
  }
  Status DropCache() override { return Status::Ok(); }

  std::promise<void> entered;
  std::promise<void> release;

 private:
  std::string path_ = "held";
};

// The slots a gate hands back, with a wait for a count of them.
struct Resumed {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<void*> slots;
  void Add(void* s) {
    std::lock_guard<std::mutex> lock(mu);
    slots.push_back(s);
    cv.notify_all();
  }
  void WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return slots.size() >= n; });
  }
};

TEST(FsyncGateTest, HoldsWritesUntilTheSyncAfterEveryNReturns) {
  using A = FsyncGate::Admission;
  HeldFile file;
  Resumed resumed;
  int a, b, c, d;
  {
    FsyncGate gate(
        {&file}, /*every=*/2, /*limit=*/3, [&](void* s) { resumed.Add(s); },
        [](const Status&) {});
    EXPECT_EQ(gate.Admit(&a), A::kGo);
    EXPECT_EQ(gate.Admit(&b), A::kGo);
    EXPECT_EQ(gate.Admit(&c), A::kParked);  // the interval's 2 are issued
    EXPECT_FALSE(gate.Completed(&a));
    EXPECT_TRUE(gate.Completed(&b));  // both back: the sync is due
    file.entered.get_future().wait();
    EXPECT_EQ(gate.Admit(&d), A::kParked);  // while it runs
    EXPECT_EQ(gate.syncs(), 0u);
    file.release.set_value();
    resumed.WaitFor(3);
    EXPECT_EQ(gate.syncs(), 1u);
    EXPECT_EQ(gate.Admit(&c), A::kGo);
    EXPECT_EQ(gate.Admit(&d), A::kDone);  // 3 writes in all
    EXPECT_FALSE(gate.Completed(&c));     // 3 of 4: no second sync
    EXPECT_EQ(gate.syncs(), 1u);
  }
  std::sort(resumed.slots.begin(), resumed.slots.end());
  std::vector<void*> want = {&b, &c, &d};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(resumed.slots, want);
}

// Counts, per thread's slice, the writes submitted and completed, and
// whether a write was submitted before the previous interval's writes
// were all back (which a sync between them requires).
class IntervalInjector : public aio::FaultInjector {
 public:
  IntervalInjector(uint64_t slice, uint64_t every)
      : slice_(slice), every_(every) {}
  uint32_t SubmitLength(bool write, uint64_t offset, uint32_t len) override {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t k = submitted_[offset / slice_]++;
    if (write && completed_[offset / slice_] < k / every_ * every_) early_++;
    return len;
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
      if (IsWrite(rw)) {
        EXPECT_EQ(check.early(), 0) << RwName(rw) << " " << n;
      }
    }
  }
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
