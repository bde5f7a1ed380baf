// strata-nvme-bench striped over two directories, as a user runs it: each
// file's share in the table and the JSON, fio on the same files, and both
// files removed afterwards.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/testutil/testutil.h"
#include "tests/tools/nvme_bench_cli.h"

namespace strata::bench {
namespace {

TEST(NvmeBenchStripeCliTest, TwoFilesServeHalfTheBytesEach) {
  testutil::ScratchDir a, b, out;
  const std::string json = out.File("out.json");
  const bool fio = HaveFio();
  const Outcome o = Bench(
      "--path " + a.path() + ":" + b.path() +
      " --rw write,randread --bs 64K --qd 4 --threads 2 --size 8M --json " +
      json + (fio ? " --vs-fio --repeat 1" : ""));
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_TRUE(Contains(o.output, "2 files, striped one block at a time"))
      << o.output;
  EXPECT_TRUE(Contains(o.output, "file 1: " + a.File("strata-nvme-bench.dat")))
      << o.output;
  EXPECT_TRUE(Contains(o.output, "file 2: " + b.File("strata-nvme-bench.dat")))
      << o.output;
  EXPECT_TRUE(Contains(o.output, "files: 1 50.0% 2 50.0% of the bytes"))
      << o.output;
  const nlohmann::json records = ReadJson(json);
  ASSERT_EQ(records.size(), 2u) << o.output;
  for (const auto& r : records) {
    ASSERT_EQ(r["files"].size(), 2u);
    EXPECT_EQ(r["files"][0]["path"], a.File("strata-nvme-bench.dat"));
    EXPECT_EQ(r["files"][0]["bytes"], 4 << 20);
    EXPECT_EQ(r["files"][1]["bytes"], 4 << 20);
    EXPECT_EQ(r["bytes"], 8 << 20);
    if (fio) {
      EXPECT_EQ(r["fio"]["bytes"], 8 << 20) << "fio covers the same blocks";
    }
  }
  if (!fio) std::printf("fio not installed: the fio half was not run\n");
  EXPECT_FALSE(std::filesystem::exists(a.File("strata-nvme-bench.dat")));
  EXPECT_FALSE(std::filesystem::exists(b.File("strata-nvme-bench.dat")));
}

TEST(NvmeBenchStripeCliTest, RoomIsCheckedForEveryFile) {
  testutil::Mount small("tmpfs", "size=1m");
  if (!small.ok()) GTEST_SKIP() << "cannot mount tmpfs: " << small.error();
  testutil::ScratchDir a;
  const Outcome o = Bench("--path " + a.path() + " --path " + small.path() +
                          " --rw read --bs 64K --size 8M");
  EXPECT_EQ(o.status, 1) << o.output;
  EXPECT_TRUE(Contains(o.output, "--size 8M striped over 2 files does not fit"))
      << o.output;
  EXPECT_FALSE(std::filesystem::exists(a.File("strata-nvme-bench.dat")));
}

}  // namespace
}  // namespace strata::bench
