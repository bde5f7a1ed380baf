// strata-nvme-bench building blocks: sizes, permutations, latency
// percentiles, fio's JSON and its checks, jobs and the verifier, where a run
// is placed, progress texts, and Ctrl-C. The output's tests are in
// nvme_bench_report_test.cc, mixed jobs' in nvme_bench_mix_test.cc and
// --sync/--fsync/--log's in nvme_bench_sync_test.cc.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "tests/testutil/testutil.h"
#include "tests/tools/fake_kernel.h"
#include "tests/tools/nvme_bench_workload.h"
#include "tools/nvme_bench/cli.h"
#include "tools/nvme_bench/device_stat.h"
#include "tools/nvme_bench/fio.h"
#include "tools/nvme_bench/latency.h"
#include "tools/nvme_bench/place.h"
#include "tools/nvme_bench/progress.h"
#include "tools/nvme_bench/report.h"
#include "tools/nvme_bench/verify.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {
namespace {

TEST(CommandLineTest, ParsesListsAndDefaults) {
  const char* argv[] = {"strata-nvme-bench",
                        "--path",
                        "/x",
                        "--rw",
                        "read,randwrite",
                        "--bs",
                        "128K,1M",
                        "--qd",
                        "1,32",
                        "--threads",
                        "2",
                        "--vs-fio"};
  bool exit_now = false;
  auto o = ParseCommandLine(12, const_cast<char**>(argv), &exit_now);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_FALSE(exit_now);
  EXPECT_EQ(o->rw, (std::vector<Rw>{Rw::kRead, Rw::kRandWrite}));
  EXPECT_EQ(o->bs, (std::vector<size_t>{128 << 10, 1 << 20}));
  EXPECT_EQ(o->qd, (std::vector<int>{1, 32}));
  EXPECT_EQ(o->threads, (std::vector<int>{2}));
  EXPECT_EQ(o->repeat, 3);  // the default with --vs-fio
  EXPECT_EQ(o->size, 1ull << 30);
  EXPECT_EQ(o->fio_buffers, FioBufferKind::kHugePages);
  const char* recommend[] = {"strata-nvme-bench", "--path", "/x",
                             "--recommend"};
  auto r = ParseCommandLine(4, const_cast<char**>(recommend), &exit_now);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->repeat, 3);  // a pick needs the spread of its runs
}

TEST(CommandLineTest, FioBuffersFollowStrataUnlessGiven) {
  bool exit_now = false;
  const char* plain[] = {"b", "--path", "/x", "--no-huge-pages"};
  EXPECT_EQ(
      ParseCommandLine(4, const_cast<char**>(plain), &exit_now)->fio_buffers,
      FioBufferKind::kMalloc);
  const char* given[] = {"b",        "--path",        "/x",
                         "--vs-fio", "--fio-buffers", "malloc"};
  EXPECT_EQ(
      ParseCommandLine(6, const_cast<char**>(given), &exit_now)->fio_buffers,
      FioBufferKind::kMalloc);
  const char* bad[] = {"b", "--path", "/x", "--vs-fio", "--fio-buffers", "thp"};
  auto o = ParseCommandLine(6, const_cast<char**>(bad), &exit_now);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--fio-buffers: 'thp'"),
            std::string::npos);
}

TEST(CommandLineTest, RejectsBadValuesWithTheirName) {
  bool exit_now = false;
  const char* bad_bs[] = {"b", "--path", "/x", "--bs", "1000"};
  auto a = ParseCommandLine(5, const_cast<char**>(bad_bs), &exit_now);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--bs"), std::string::npos);
  const char* bad_rw[] = {"b", "--path", "/x", "--rw", "readwrite"};
  auto b = ParseCommandLine(5, const_cast<char**>(bad_rw), &exit_now);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("readwrite"), std::string::npos);
  const char* no_path[] = {"b"};
  EXPECT_FALSE(
      ParseCommandLine(1, const_cast<char**>(no_path), &exit_now).ok());
}

// An option the run would ignore is refused, naming it and the fix.
TEST(CommandLineTest, OptionsTheRunWouldIgnoreAreRefused) {
  auto refusal = [](std::vector<std::string> args) {
    args.insert(args.begin(), {"b", "--path", "/x"});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    bool exit_now = false;
    auto o =
        ParseCommandLine(static_cast<int>(argv.size()), argv.data(), &exit_now);
    return o.ok() ? std::string("accepted") : o.status().message();
  };
  for (const char* flag : {"--json", "--log"}) {
    EXPECT_NE(refusal({"--verify", flag, "/tmp/f"})
                  .find(std::string("does not take ") + flag),
              std::string::npos);
  }
  EXPECT_NE(refusal({"--verify", "--vs-fio"}).find("does not take --vs-fio"),
            std::string::npos);
  EXPECT_NE(refusal({"--verify", "--bs", "4K,8K"}).find("one --bs"),
            std::string::npos);
  EXPECT_EQ(refusal({"--verify", "--bs", "64K", "--qd", "8"}), "accepted");
  EXPECT_NE(refusal({"--fio-opt=--bogus"}).find("add --vs-fio, or drop"),
            std::string::npos);
  EXPECT_NE(refusal({"--fio-buffers", "malloc"}).find("--fio-buffers"),
            std::string::npos);
  EXPECT_NE(refusal({"--rw", "read", "--rwmixread", "30"}).find("add rw or"),
            std::string::npos);
  EXPECT_EQ(refusal({"--rw", "randrw", "--rwmixread", "30"}), "accepted");
  EXPECT_NE(refusal({"--json", "/tmp/o", "--log", "/tmp/../tmp/o"})
                .find("give each its own file"),
            std::string::npos);
}

// A job asking more of the thread backend's pool (64 threads) than it
// holds runs at what it holds, for strata and fio alike.
TEST(DepthTest, TheThreadPoolsDepthIsTheOneThatRuns) {
  JobSpec spec;
  spec.qd = 100;
  spec.threads = 2;
  auto capped = DepthThatRuns(spec, aio::Backend::kThreads);
  ASSERT_TRUE(capped.ok()) << capped.status().ToString();
  EXPECT_EQ(capped->qd, 32);
  EXPECT_EQ(capped->qd_requested, 100);
  spec.qd = 16;
  auto fits = DepthThatRuns(spec, aio::Backend::kThreads);
  ASSERT_TRUE(fits.ok());
  EXPECT_EQ(fits->qd, 16);
  EXPECT_EQ(fits->qd_requested, 0);
  spec.qd = 100;
  auto uring = DepthThatRuns(spec, aio::Backend::kIoUring);
  ASSERT_TRUE(uring.ok());
  EXPECT_EQ(uring->qd, 100);
}

TEST(CommandLineTest, SizeMustHoldABlockPerThreadInWhole4KUnits) {
  bool exit_now = false;
  for (const char* size : {"0", "256", "6000"}) {
    const char* argv[] = {"b", "--path", "/x", "--size", size};
    auto o = ParseCommandLine(5, const_cast<char**>(argv), &exit_now);
    ASSERT_FALSE(o.ok()) << size;
    EXPECT_NE(o.status().message().find("--size"), std::string::npos);
  }
  const char* small[] = {"b",         "--path", "/x",     "--bs", "1M",
                         "--threads", "4",      "--size", "2M"};
  auto o = ParseCommandLine(9, const_cast<char**>(small), &exit_now);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("too small"), std::string::npos);
  const char* verify[] = {"b", "--path", "/x", "--verify", "--size", "1M"};
  auto v = ParseCommandLine(6, const_cast<char**>(verify), &exit_now);
  ASSERT_FALSE(v.ok());  // --verify-max 4M does not fit in 1M
  EXPECT_NE(v.status().message().find("--verify-max"), std::string::npos);
}

TEST(PermutationTest, IsABijectionForEverySize) {
  for (uint64_t n : {1ull, 2ull, 3ull, 7ull, 64ull, 1000ull, 4097ull}) {
    for (uint64_t seed : {1ull, 99ull}) {
      const Permutation p(n, seed);
      std::vector<bool> seen(n, false);
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t v = p(i);
        ASSERT_LT(v, n);
        ASSERT_FALSE(seen[v]) << "n=" << n << " i=" << i;
        seen[v] = true;
      }
    }
  }
}

TEST(PermutationTest, IsNotTheIdentity) {
  const Permutation p(1 << 16, 5);
  int fixed = 0;
  for (uint64_t i = 0; i < (1 << 16); ++i) fixed += p(i) == i;
  EXPECT_LT(fixed, 32);
}

TEST(LatencyHistogramTest, PercentilesAreWithinTheBucketError) {
  LatencyHistogram h;
  std::mt19937_64 rng(1);
  std::lognormal_distribution<double> dist(11, 1.5);  // ~60 us median
  std::vector<uint64_t> values;
  for (int i = 0; i < 100000; ++i) {
    values.push_back(static_cast<uint64_t>(dist(rng)) + 1);
    h.Record(values.back());
  }
  std::sort(values.begin(), values.end());
  EXPECT_EQ(h.count(), values.size());
  for (double q : {0.5, 0.99, 0.999}) {
    const double exact = values[static_cast<size_t>(q * values.size()) - 1];
    EXPECT_NEAR(h.Percentile(q), exact, exact / 64 + 1) << q;
  }
}

TEST(LatencyHistogramTest, BucketsTileTheRange) {
  for (int b = 0; b + 1 < LatencyHistogram::kBuckets; ++b) {
    ASSERT_EQ(LatencyHistogram::BucketHigh(b),
              LatencyHistogram::BucketLow(b + 1))
        << b;
    ASSERT_EQ(LatencyHistogram::BucketOf(LatencyHistogram::BucketLow(b)), b);
  }
  EXPECT_EQ(LatencyHistogram().Percentile(0.5), 0);
}

TEST(LatencyHistogramTest, MinMaxAndMeanAreExactAndMerge) {
  LatencyHistogram a, b;
  EXPECT_EQ(a.min(), 0u);
  EXPECT_EQ(a.mean(), 0);
  for (uint64_t v : {700, 300, 1000}) a.Record(v);
  b.Record(5000);
  b.Record(100);
  EXPECT_EQ(a.min(), 300u);
  EXPECT_EQ(a.max(), 1000u);
  EXPECT_DOUBLE_EQ(a.mean(), 2000.0 / 3);
  a.Merge(b);
  EXPECT_EQ(a.min(), 100u);
  EXPECT_EQ(a.max(), 5000u);
  EXPECT_DOUBLE_EQ(a.mean(), 7100.0 / 5);
}

TEST(FioTest, ParsesFiosJson) {
  std::ifstream in(STRATA_TEST_DATA "/fio_randread.json");
  std::stringstream text;
  text << "fio: a warning fio printed before the JSON\n" << in.rdbuf();
  JobSpec spec{Rw::kRandRead, 128 << 10, 8, 2, 128 << 20};
  auto r = ParseFioJson(text.str(), spec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->bytes, 134217728u);
  EXPECT_EQ(r->ios, 1024u);
  EXPECT_NEAR(r->gb_per_s(), 1.328888396, 1e-9);
  EXPECT_NEAR(r->lat.p50, 1318.912, 1e-9);
  EXPECT_NEAR(r->lat.p99, 3489.792, 1e-9);
  EXPECT_NEAR(r->lat.p999, 3883.008, 1e-9);
  EXPECT_NEAR(r->lat.p9999, 3883.008, 1e-9);
  EXPECT_NEAR(r->lat.min, 420.950, 1e-9);
  EXPECT_NEAR(r->lat.mean, 1518.779646484, 1e-9);
  EXPECT_NEAR(r->lat.max, 3879.909, 1e-9);
  // fio's usr_cpu is the average of its 2 threads; the table's is the sum.
  EXPECT_NEAR(r->usr_pct, 2 * 3.608247, 1e-9);
  EXPECT_NEAR(r->sys_pct, 2 * 1.030928, 1e-9);
  EXPECT_FALSE(ParseFioJson("no json here", spec).ok());
  EXPECT_FALSE(ParseFioJson("{\"jobs\": []}", spec).ok());
}

TEST(FioTest, CommandRunsTheSameJob) {
  JobSpec spec{Rw::kRandWrite, 1 << 20, 32, 4, 1 << 30, 0, 7};
  const auto cmd = FioCommand("fio", {"/d/f"}, spec, true, {"--fixedbufs"});
  auto has = [&](const std::string& arg) {
    return std::find(cmd.begin(), cmd.end(), arg) != cmd.end();
  };
  EXPECT_TRUE(has("--ioengine=io_uring"));
  EXPECT_TRUE(has("--rw=randwrite"));
  EXPECT_TRUE(has("--bs=1048576"));
  EXPECT_TRUE(has("--iodepth=32"));
  EXPECT_TRUE(has("--numjobs=4"));
  EXPECT_TRUE(has("--size=268435456"));
  EXPECT_TRUE(has("--offset_increment=268435456"));
  EXPECT_TRUE(has("--direct=1"));
  EXPECT_TRUE(has("--filename=/d/f"));
  EXPECT_EQ(cmd.back(), "--fixedbufs");
  spec.seconds = 2.5;
  const auto timed = FioCommand("fio", {"/d/f"}, spec, false, {});
  EXPECT_NE(std::find(timed.begin(), timed.end(), "--runtime=2500ms"),
            timed.end());
  EXPECT_NE(std::find(timed.begin(), timed.end(), "--end_fsync=1"),
            timed.end());
}

TEST_F(WorkloadTest, EveryPatternMovesTheWholeFile) {
  for (Rw rw : {Rw::kWrite, Rw::kRead, Rw::kRandWrite, Rw::kRandRead}) {
    const JobSpec spec{rw, 64 << 10, 4, 2, kSize};
    auto r = RunJob(spec, Target{{path_}, direct_}, pool_.data(), pool_.size(),
                    nullptr);
    ASSERT_TRUE(r.ok()) << RwName(rw) << ": " << r.status().ToString();
    EXPECT_EQ(r->bytes, kSize);
    EXPECT_EQ(r->ios, kSize / (64 << 10));
    EXPECT_GT(r->seconds, 0);
    EXPECT_GT(r->lat.min, 0);
    EXPECT_LE(r->lat.min, r->lat.mean);
    EXPECT_LE(r->lat.mean, r->lat.max);
    EXPECT_LE(r->lat.p50, r->lat.p999);
    EXPECT_LE(r->lat.p9999, r->lat.max * 1.02);
  }
}

TEST_F(WorkloadTest, TimeBasedRunsLoopOverTheFile) {
  const JobSpec spec{Rw::kRandRead, 64 << 10, 2, 1, 1 << 20, 0.3};
  auto r = RunJob(spec, Target{{path_}, direct_}, pool_.data(), pool_.size(),
                  nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GE(r->seconds, 0.3);
  EXPECT_GT(r->bytes, 1u << 20);  // more than one pass over 1 MiB
}

// Through the page cache a timed job measures memory: refused for reads and
// writes alike (a timed buffered write once reported 3.7 GB/s while at most
// 1.07 GB reached the disk).
TEST_F(WorkloadTest, RefusesTimedBufferedJobs) {
  for (Rw rw : {Rw::kRead, Rw::kWrite, Rw::kRandWrite}) {
    const JobSpec spec{rw, 64 << 10, 2, 1, 1 << 20, 0.2};
    auto r = RunJob(spec, Target{{path_}, /*direct=*/false}, pool_.data(),
                    pool_.size(), nullptr);
    ASSERT_FALSE(r.ok()) << RwName(rw);
    EXPECT_NE(r.status().message().find("page cache"), std::string::npos);
  }
  EXPECT_TRUE(CheckTimedBuffered(false, 0).ok());
  EXPECT_TRUE(CheckTimedBuffered(true, 3).ok());
}

TEST_F(WorkloadTest, ReportsIoErrors) {
  testutil::ErrnoInjector eio(EIO, 0, kSize);
  const JobSpec spec{Rw::kRead, 64 << 10, 4, 1, kSize};
  auto r = RunJob(spec, Target{{path_}, direct_, aio::Backend::kAuto, &eio},
                  pool_.data(), pool_.size(), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("EIO"), std::string::npos);
}

// A --verify of `ops` requests of up to 256 KiB, 8 in flight per thread.
VerifyOptions SmallVerify(uint64_t ops, int threads) {
  VerifyOptions vo;
  vo.ops = ops;
  vo.max_bytes = 256 << 10;
  vo.block_size = 64 << 10;
  vo.qd = 8;
  vo.threads = threads;
  return vo;
}

TEST_F(WorkloadTest, VerifyPassesOnAHealthyFile) {
  const VerifyOptions vo = SmallVerify(400, 2);
  auto r = RunVerify(Target{{path_}, direct_}, kSize, vo, pool_.data(),
                     pool_.size(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->mismatched_words, 0u) << r->first_mismatch;
  EXPECT_GT(r->writes, kSize / vo.max_bytes);
  EXPECT_GE(r->bytes_read, kSize);
}

// Completions that come back late, by a different amount for each offset.
class LateCompletions : public aio::FaultInjector {
 public:
  int CompletionResult(bool, uint64_t offset, uint32_t, int result) override {
    std::this_thread::sleep_for(std::chrono::microseconds(offset % 997));
    return result;
  }
};

// The operations of --verify are its seed's alone: the same with
// completions late, though which requests collide in flight then differs.
TEST_F(WorkloadTest, VerifyRunsTheSameOperationsWhateverCompletesWhen) {
  VerifyOptions vo = SmallVerify(300, 1);
  vo.seed = 5;
  auto plain = RunVerify(Target{{path_}, direct_}, kSize, vo, pool_.data(),
                         pool_.size(), nullptr);
  LateCompletions late;
  auto delayed = RunVerify(Target{{path_}, direct_, aio::Backend::kAuto, &late},
                           kSize, vo, pool_.data(), pool_.size(), nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ASSERT_TRUE(delayed.ok()) << delayed.status().ToString();
  EXPECT_EQ(plain->writes, delayed->writes);
  EXPECT_EQ(plain->reads, delayed->reads);
  EXPECT_EQ(plain->bytes_written, delayed->bytes_written);
  EXPECT_EQ(plain->bytes_read, delayed->bytes_read);
  EXPECT_EQ(delayed->mismatched_words, 0u) << delayed->first_mismatch;
}

TEST_F(WorkloadTest, VerifyCatchesACorruptedRead) {
  testutil::BitFlipInjector flip(5 << 20);
  VerifyOptions vo;
  vo.ops = 50;
  vo.max_bytes = 256 << 10;
  auto r = RunVerify(Target{{path_}, direct_, aio::Backend::kAuto, &flip},
                     kSize, vo, pool_.data(), pool_.size(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(flip.flipped.load());
  EXPECT_EQ(r->mismatched_words, 1u);
  EXPECT_NE(r->first_mismatch.find("offset 5242880"), std::string::npos)
      << r->first_mismatch;
}

// Counts the transfers the engine hands the kernel.
struct CountingInjector : aio::FaultInjector {
  uint32_t SubmitLength(bool, uint64_t, uint32_t len) override {
    transfers.fetch_add(1);
    return len;
  }
  std::atomic<uint64_t> transfers{0};
};

// Once its cancel flag is set, a job submits nothing new (the qd requests
// already on their way may still go) and ends with kCancelled.
TEST_F(WorkloadTest, ACancelledJobStopsEarly) {
  CountingInjector count;
  std::atomic<bool> cancel{false};
  uint64_t at_cancel = 0;
  Target target{{path_}, direct_, aio::Backend::kAuto, &count};
  target.cancel = &cancel;
  const JobSpec spec{Rw::kWrite, 64 << 10, 2, 1, 1 << 20, /*seconds=*/60};
  auto r =
      RunJob(spec, target, pool_.data(), pool_.size(), [&](const JobProgress&) {
        if (cancel.exchange(true)) return;
        at_cancel = count.transfers.load();
      });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status().ToString();
  EXPECT_GT(at_cancel, 0u);
  EXPECT_LE(count.transfers.load() - at_cancel, static_cast<uint64_t>(spec.qd));
}

TEST_F(WorkloadTest, ACancelledVerifyStops) {
  std::atomic<bool> cancel{true};
  Target target{{path_}, direct_};
  target.cancel = &cancel;
  VerifyOptions vo;
  vo.max_bytes = 256 << 10;
  auto r = RunVerify(target, kSize, vo, pool_.data(), pool_.size(), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status().ToString();
}

// A script of the test's own in place of fio.
std::string FakeFio(const testutil::ScratchDir& dir, const std::string& body) {
  const std::string path = dir.File("fio");
  std::ofstream(path) << "#!/bin/sh\n" << body;
  chmod(path.c_str(), 0755);
  return path;
}

// Ctrl-C stops fio even when only strata's pid was signalled, and the run
// is "interrupted", not a failure of fio's.
TEST(FioTest, CancelStopsFioAndIsNoFioError) {
  testutil::ScratchDir dir;
  const std::string ready = dir.File("ready"), stopped = dir.File("stopped");
  const std::string fio =
      FakeFio(dir, "sleep 60 >/dev/null 2>&1 &\nchild=$!\ntrap 'echo int > " +
                       stopped + "; kill $child; exit 1' INT\ntouch " + ready +
                       "\nwait $child\n");
  std::atomic<bool> cancel{false};
  std::thread press([&] {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!std::filesystem::exists(ready) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    cancel = true;
  });
  auto r = RunFio({fio}, JobSpec{}, &cancel);
  press.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status().ToString();
  EXPECT_EQ(ReadText(stopped), "int\n");
}

TEST(FioTest, CheckFindsAMissingFioAndReportsFiosOwnMessage) {
  const Status missing = CheckFio({"/nonexistent/fio", "--name=x"});
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("fio not found: cannot run "
                                   "'/nonexistent/fio'; install it (apt-get "
                                   "install fio) or pass --fio PATH"),
            std::string::npos)
      << missing.ToString();

  // fio says it twice; the check runs nothing but --parse-only.
  testutil::ScratchDir dir;
  const std::string fio = FakeFio(
      dir,
      "for a; do [ \"$a\" = --parse-only ] && parse=1; done\n"
      "[ -z \"$parse\" ] && exit 0\n"
      "case \"$*\" in *--bogus*) echo \"fio: unrecognized option "
      "'--bogus'\" >&2\n"
      "  echo \"fio: unrecognized option '--bogus'\" >&2; exit 1;; esac\n");
  EXPECT_TRUE(CheckFio({fio, "--name=x"}).ok());
  const Status bad = CheckFio({fio, "--name=x", "--bogus"});
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(),
            "fio refuses the job --vs-fio would run: fio: unrecognized "
            "option '--bogus'; fix or drop the --fio-opt it names");
}

constexpr char kMountInfo[] =
    "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "30 22 0:25 / /mnt rw shared:2 master:1 - tmpfs tmpfs rw,size=4k\n"
    "31 30 259:1 / /mnt/x rw - xfs /dev/nvme0n1p1 rw\n"
    "32 30 0:40 / /mnt/xy rw - overlay overlay rw\n"
    "33 30 0:41 / /mnt/with\\040space rw - btrfs /dev/sdb rw\n"
    "34 30 259:2 / /mnt/x rw - ext4 /dev/nvme1n1 rw\n"
    "a line that does not parse\n";

TEST(PlaceTest, FindMountTakesTheLongestMountPointThatHoldsThePath) {
  auto source = [](const std::string& path) {
    auto m = FindMount(kMountInfo, path);
    return m ? m->type + " " + m->source : std::string("none");
  };
  EXPECT_EQ(source("/home/me/f"), "ext4 /dev/vda");
  EXPECT_EQ(source("/mnt"), "tmpfs tmpfs");
  EXPECT_EQ(source("/mnt/other"), "tmpfs tmpfs");
  // Two mounts on /mnt/x: the later one is on top.
  EXPECT_EQ(source("/mnt/x/strata-nvme-bench.dat"), "ext4 /dev/nvme1n1");
  EXPECT_EQ(source("/mnt/xy/f"), "overlay overlay");  // not /mnt/x's
  EXPECT_EQ(source("/mnt/with space/f"), "btrfs /dev/sdb");
  EXPECT_EQ(FindMount(kMountInfo, "/mnt/x")->mount_point, "/mnt/x");
  EXPECT_FALSE(FindMount("garbage\n", "/mnt").has_value());
}

TEST(PlaceTest, FileSystemTextNamesTheDeviceOrSaysThereIsNone) {
  EXPECT_EQ(FileSystemText({"ext4", "/dev/vda", 254, 0, true}),
            "ext4, /dev/vda (254:0)");
  EXPECT_EQ(FileSystemText({"tmpfs", "tmpfs", 0, 25, false}),
            "tmpfs (not a block device: figures are memory speed and mean "
            "nothing for a drive)");
  EXPECT_NE(FileSystemText({"overlay", "overlay", 0, 40, false})
                .find("overlay (not a block device"),
            std::string::npos);
}

TEST(PlaceTest, FileSystemOfAScratchDirectoryIsTheMountThatHoldsIt) {
  testutil::ScratchDir dir;
  const FileSystem fs = FileSystemOf(dir.path());
  struct stat st = {};
  ASSERT_EQ(stat(dir.path().c_str(), &st), 0);
  EXPECT_FALSE(fs.type.empty());
  if (major(st.st_dev) != 0) {
    EXPECT_TRUE(fs.block_device);
    EXPECT_EQ(fs.major, major(st.st_dev));
    EXPECT_EQ(fs.minor, minor(st.st_dev));
  }
}

TEST(ProgressTest, PercentStopsAt100AndTheRateIsOfTheLastInterval) {
  const JobSpec timed{Rw::kRead, 1 << 20, 32, 1, 1 << 30, /*seconds=*/2};
  // 1 GB in the first second, 0.2 GB in the next: 0.2 GB/s, not 0.6.
  EXPECT_EQ(JobProgressText("[1/2] read", timed, {1'000'000'000, 1.0},
                            {1'200'000'000, 2.0}),
            "[1/2] read: 100% 0.200 GB/s");
  // The last report of a timed job comes after its deadline.
  EXPECT_EQ(JobProgressText("j", timed, {0, 1.5}, {100'000'000, 2.02}),
            "j: 100% 0.192 GB/s");
  const JobSpec once{Rw::kRead, 1 << 20, 32, 1, 1 << 30};
  EXPECT_EQ(JobProgressText("j", once, {0, 0}, {1 << 29, 0.5}),
            "j: 50% 1.074 GB/s");
  EXPECT_EQ(JobProgressText("j", once, {5, 1.0}, {5, 1.0}), "j: 0% 0.000 GB/s");
}

TEST(ProgressTest, VerifyProgressSaysWhatItCounts) {
  EXPECT_EQ(VerifyProgressText(VerifyPhase::kWrite, 12 << 20, 64 << 20),
            "verify: writing 12M of 64M");
  EXPECT_EQ(VerifyProgressText(VerifyPhase::kRandom, 1234, 10000),
            "verify: 1234 of 10000 random ops");
  EXPECT_EQ(VerifyProgressText(VerifyPhase::kReadBack, 64 << 20, 64 << 20),
            "verify: reading back 64M of 64M");
}

}  // namespace
}  // namespace strata::bench
