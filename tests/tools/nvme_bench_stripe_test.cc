// strata-nvme-bench jobs over several files (Note [Striping] in
// tools/nvme_bench/workload.h): each file serves its share, block b goes to
// file b % F at (b / F) * bs, and the paths, room and fio's command agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tests/tools/nvme_bench_workload.h"
#include "tools/nvme_bench/cli.h"
#include "tools/nvme_bench/device_stat.h"
#include "tools/nvme_bench/fio.h"
#include "tools/nvme_bench/place.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {
namespace {

// Every transfer the engine hands the kernel, in order.
class Transfers : public aio::FaultInjector {
 public:
  uint32_t SubmitLength(bool write, uint64_t offset, uint32_t len) override {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.emplace_back(write, offset);
    return len;
  }
  std::vector<std::pair<bool, uint64_t>> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<bool, uint64_t>> seen_;
};

class StripeTest : public WorkloadTest {
 protected:
  void SetUp() override {
    WorkloadTest::SetUp();
    auto e = aio::Engine::Open(aio::IoOptions{});
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE((*e)->OpenFile(second_, aio::FileOptions{kSize / 2}).ok());
  }
  Result<JobResult> Run(const JobSpec& spec, Transfers* transfers) {
    return RunJob(
        spec, Target{{path_, second_}, direct_, aio::Backend::kAuto, transfers},
        pool_.data(), pool_.size(), nullptr);
  }
  std::string second_ = dir_.File("second.dat");
};

TEST_F(StripeTest, EachFileServesItsShareOfEveryPattern) {
  constexpr size_t kBs = 64 << 10;
  for (Rw rw : {Rw::kWrite, Rw::kRead, Rw::kRandWrite, Rw::kRandRead,
                Rw::kRandReadWrite}) {
    for (int threads : {1, 3}) {
      SCOPED_TRACE(std::string(RwName(rw)) + " threads " +
                   std::to_string(threads));
      const JobSpec spec{rw, kBs, 4, threads, kSize};
      // 128 blocks a file; 3 threads take 42 of each, 84 of the job's.
      const uint64_t blocks = BlocksPerThread(spec, 2) * threads;
      EXPECT_EQ(blocks, threads == 1 ? 256u : 252u);
      Transfers transfers;
      auto r = Run(spec, &transfers);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->bytes, blocks * kBs);
      ASSERT_EQ(r->files.size(), 2u);
      for (const FileResult& f : r->files) {
        EXPECT_EQ(f.ios, blocks / 2);
        EXPECT_EQ(f.bytes, blocks / 2 * kBs);
      }
      // One pass: every offset of a file's share once in each file.
      std::map<uint64_t, int> per_offset;
      for (const auto& [write, offset] : transfers.seen()) ++per_offset[offset];
      EXPECT_EQ(per_offset.size(), blocks / 2);
      for (const auto& [offset, n] : per_offset) {
        EXPECT_LT(offset, kSize / 2);
        EXPECT_EQ(offset % kBs, 0u);
        EXPECT_EQ(n, 2) << "offset " << offset;
      }
    }
  }
}

// One request in flight: the order the engine sees is the stripe's, block
// b at (b / 2) * bs of file b % 2, round robin one block at a time.
TEST_F(StripeTest, SequentialJobsGoRoundRobinOneBlockAtATime) {
  constexpr size_t kBs = 64 << 10;
  const JobSpec spec{Rw::kWrite, kBs, 1, 1, 1 << 20};
  Transfers transfers;
  auto r = Run(spec, &transfers);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto seen = transfers.seen();
  ASSERT_EQ(seen.size(), 16u);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_TRUE(seen[i].first);
    EXPECT_EQ(seen[i].second, i / 2 * kBs) << "request " << i;
  }
  EXPECT_EQ(r->files[0].ios, 8u);
  EXPECT_EQ(r->files[1].ios, 8u);
}

TEST_F(StripeTest, TooSmallForAThreadInEachFileIsAnError) {
  const JobSpec spec{Rw::kRead, 1 << 20, 1, 2, 2 << 20};
  auto r = Run(spec, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("in each file"), std::string::npos)
      << r.status().message();
}

// fio divides a job's size among its files and offsets each job in every
// file: the same blocks as strata's threads.
TEST(StripeFioTest, FioStripesAsStrataDoes) {
  const JobSpec spec{Rw::kRead, 64 << 10, 4, 3, 16 << 20};
  const auto cmd = FioCommand("fio", {"/a/f", "/b/f"}, spec, true, {});
  const auto has = [&](const std::string& arg) {
    return std::find(cmd.begin(), cmd.end(), arg) != cmd.end();
  };
  EXPECT_TRUE(has("--filename=/a/f:/b/f"));
  EXPECT_TRUE(has("--size=" + std::to_string(84 * (64 << 10))));
  EXPECT_TRUE(has("--offset_increment=" + std::to_string(42 * (64 << 10))));
  const auto colon = FioCommand("fio", {"/a:b/f", "/c"}, spec, true, {});
  EXPECT_NE(std::find(colon.begin(), colon.end(), "--filename=/a\\:b/f:/c"),
            colon.end());  // a ':' in a name, escaped as fio reads it
}

Result<BenchOptions> Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "strata-nvme-bench");
  bool exit_now = false;
  return ParseCommandLine(static_cast<int>(args.size()),
                          const_cast<char**>(args.data()), &exit_now);
}

TEST(StripeCliTest, PathsSplitOnColonsAndRepeat) {
  auto o = Parse({"--path", "/a:/b", "--path", "/c", "--size", "3M"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->paths, (std::vector<std::string>{"/a", "/b", "/c"}));
  auto escaped = Parse({"--path", "/d/a\\:b:/c", "--size", "2M"});
  ASSERT_TRUE(escaped.ok()) << escaped.status().ToString();
  EXPECT_EQ(escaped->paths, (std::vector<std::string>{"/d/a:b", "/c"}));

  auto verify = Parse({"--path", "/a:/b", "--verify"});
  ASSERT_FALSE(verify.ok());
  EXPECT_NE(verify.status().message().find("--verify checks one file"),
            std::string::npos);
  EXPECT_FALSE(Parse({"--path", "::"}).ok());
  // One 1 MiB block per thread in each of two files does not fit in 1 MiB.
  auto small = Parse({"--path", "/a:/b", "--size", "1M"});
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("each of the 2 files"),
            std::string::npos)
      << small.status().message();
}

TEST(StripePlaceTest, TheSameFileTwiceIsRefused) {
  testutil::ScratchDir dir;
  BenchOptions o;
  o.paths = {dir.path(), dir.path() + "/"};
  auto twice = PlaceAll(o);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("twice"), std::string::npos);

  testutil::ScratchDir other;
  o.paths = {dir.path(), other.path()};
  auto two = PlaceAll(o);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[1].file, other.File(kBenchFileName));
}

// Someone else's file must hold its share, and the message says so.
TEST(StripePlaceTest, AnExistingFileMustHoldItsShare) {
  testutil::ScratchDir dir;
  const std::string file = dir.File("theirs.dat");
  {
    auto e = aio::Engine::Open(aio::IoOptions{});
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE((*e)->OpenFile(file, aio::FileOptions{4 << 20}).ok());
  }
  BenchOptions o;
  o.rw = {Rw::kRead};
  o.paths = {file, dir.path()};
  o.size = 8 << 20;
  const Placement theirs{file, dir.path(), false};
  const FileSystem fs = FileSystemOf(file);
  EXPECT_TRUE(CheckPlacement(o, theirs, fs, Share{4 << 20, 8 << 20}).ok());
  o.size = 16 << 20;
  const Status st = CheckPlacement(o, theirs, fs, Share{8 << 20, 16 << 20});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("its share (8.0 MiB) of --size 16M over 2"),
            std::string::npos)
      << st.message();
}

TEST(StripeDiskTest, TwoFilesOnOneDiskCountItOnce) {
  testutil::ScratchDir a, b;
  std::string missing;
  const DiskSet disks = DiskSet::ForPaths({a.path(), b.path()}, &missing);
  if (disks.empty())
    GTEST_SKIP() << "scratch is on no block device: " << missing;
  auto one = DiskStat::ForPath(a.path());
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(disks.name(), one->name());
  EXPECT_TRUE(disks.Read().ok());
}

}  // namespace
}  // namespace strata::bench
