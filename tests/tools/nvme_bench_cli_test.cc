// strata-nvme-bench as a user runs it: the real binary, small files.
#include "tests/tools/nvme_bench_cli.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "tests/testutil/testutil.h"

namespace strata::bench {
namespace {

TEST(NvmeBenchCliTest, SweepsEveryCombinationAndWritesJson) {
  testutil::ScratchDir dir;
  const std::string json = dir.File("out.json");
  const Outcome o = Bench("--path " + dir.path() +
                          " --rw read,write,randread,randwrite --bs 64K,128K"
                          " --qd 1,4 --threads 1,2 --size 8M --json " +
                          json);
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_TRUE(Contains(o.output, "GB/s")) << o.output;
  EXPECT_TRUE(Contains(o.output, "p99.9 us"));
  EXPECT_TRUE(Contains(o.output, "dev IOPS"));
  const nlohmann::json records = ReadJson(json);
  ASSERT_TRUE(records.is_array());
  EXPECT_EQ(records.size(), 4u * 2 * 2 * 2);
  for (const auto& r : records) {
    EXPECT_EQ(r["bytes"].get<uint64_t>(), 8u << 20);
    EXPECT_GT(r["gb_per_s"].get<double>(), 0);
    EXPECT_GT(r["iops"].get<double>(), 0);
    EXPECT_GT(r["lat_us"]["p50"].get<double>(), 0);
    EXPECT_GT(r["lat_us"]["max"].get<double>(), 0);
    EXPECT_TRUE(r["cpu"].contains("usr"));
    EXPECT_EQ(r["submit_batch"].get<int>(), 1);
    EXPECT_FALSE(r.contains("fio"));
    EXPECT_FALSE(r.contains("strata_over_fio"));
    // The disk under the scratch directory served at least these bytes.
    if (r.contains("device")) {
      EXPECT_GE(r["device"]["bytes"].get<uint64_t>(), 8u << 20);
      EXPECT_GT(r["device"]["requests"].get<uint64_t>(), 0u);
    }
  }
  // The file the benchmark created is gone.
  EXPECT_FALSE(std::filesystem::exists(dir.File("strata-nvme-bench.dat")));
}

TEST(NvmeBenchCliTest, ComparesWithFioInTheSameRun) {
  if (!HaveFio()) GTEST_SKIP() << "fio is not installed";
  testutil::ScratchDir dir;
  const std::string json = dir.File("out.json");
  const Outcome o = Bench("--path " + dir.path() +
                          " --rw read,randwrite --bs 128K --qd 8 --size 16M"
                          " --vs-fio --repeat 2 --recommend --json " +
                          json);
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_TRUE(Contains(o.output, "strata/fio")) << o.output;
  EXPECT_TRUE(Contains(o.output, "recommended for read")) << o.output;
  EXPECT_TRUE(Contains(o.output, "aio config"));
  const nlohmann::json records = ReadJson(json);
  ASSERT_EQ(records.size(), 2u);
  for (const auto& r : records) {
    EXPECT_GT(r["fio"]["gb_per_s"].get<double>(), 0);
    EXPECT_GT(r["fio"]["lat_us"]["p50"].get<double>(), 0);
    EXPECT_GT(r["strata_over_fio"].get<double>(), 0);
    EXPECT_EQ(r["runs_gb_per_s"].size(), 2u);
    EXPECT_EQ(r["fio"]["runs_gb_per_s"].size(), 2u);
  }
}

// Whether `text` has a line whose run column (after the job's 22) is
// `run`, with figures after it.
bool HasRunLine(const std::string& text, const std::string& run) {
  return std::regex_search(
      text, std::regex("\n {23}  " + run + " +[0-9]+\\.[0-9]{3} +[0-9]+ "));
}

// Runs `args` with a --json file in `dir`; its records (discarded when the
// run wrote none).
nlohmann::json BenchJson(const testutil::ScratchDir& dir,
                         const std::string& args, Outcome* o) {
  const std::string json = dir.File("out.json");
  *o = Bench("--path " + dir.path() + " " + args + " --json " + json);
  return ReadJson(json);
}

// A mixed job: the totals' line, then one per direction, and the JSON's
// directions add up to the totals with about 70% reads.
void ExpectMixed(const nlohmann::json& r) {
  EXPECT_EQ(
      r["read"]["bytes"].get<uint64_t>() + r["write"]["bytes"].get<uint64_t>(),
      r["bytes"].get<uint64_t>());
  EXPECT_NEAR(r["read_share"].get<double>(), 0.70, 0.05);
  EXPECT_GT(r["write"]["lat_us"]["p50"].get<double>(), 0);
}

TEST(NvmeBenchCliTest, MixedJobsReportEachDirection) {
  testutil::ScratchDir dir;
  Outcome o;
  const nlohmann::json records =
      BenchJson(dir, "--rw randrw --rwmixread 70 --bs 4K --qd 8 --size 8M", &o);
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_TRUE(Contains(o.output, "\nrandrw ")) << o.output;
  EXPECT_TRUE(HasRunLine(o.output, "  read")) << o.output;
  EXPECT_TRUE(HasRunLine(o.output, "  write")) << o.output;
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["rw"], "randrw");
  EXPECT_EQ(records[0]["rwmixread"], 70);
  EXPECT_EQ(records[0]["bytes"].get<uint64_t>(), 8u << 20);
  ExpectMixed(records[0]);
}

// fio runs the same mix and ramp; its directions are parsed apart.
TEST(NvmeBenchCliTest, MixedJobsAndRampAgainstFio) {
  if (!HaveFio()) GTEST_SKIP() << "fio is not installed";
  testutil::ScratchDir dir;
  Outcome o;
  const nlohmann::json records =
      BenchJson(dir,
                "--rw randrw --rwmixread 70 --bs 4K --qd 8 --size 8M --time "
                "0.4 --ramp 0.2 --vs-fio --repeat 1",
                &o);
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_TRUE(HasRunLine(o.output, "fio   ")) << o.output;
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["ramp_seconds"], 0.2);
  ExpectMixed(records[0]);
  ExpectMixed(records[0]["fio"]);
  // fio's ramp is inside its run: the disk's counters would count it.
  EXPECT_FALSE(records[0]["fio"].contains("device"));
}

// A ramp is left out of the figures, so it needs a time-based job.
TEST(NvmeBenchCliTest, RampRunsOnlyWithTime) {
  testutil::ScratchDir dir;
  const std::string args = "--rw randread --bs 64K --size 1M";
  Outcome o;
  const nlohmann::json records =
      BenchJson(dir, args + " --time 0.2 --ramp 0.2", &o);
  ASSERT_EQ(o.status, 0) << o.output;
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["ramp_seconds"], 0.2);
  EXPECT_GT(records[0]["bytes"].get<uint64_t>(), 0u);
  const Outcome untimed =
      Bench("--path " + dir.path() + " " + args + " --ramp 1");
  EXPECT_EQ(untimed.status, 2);
  EXPECT_TRUE(Contains(untimed.output,
                       "--ramp needs --time: a job of one pass has no steady "
                       "state to ramp into; add --time S or drop --ramp"))
      << untimed.output;
}

std::string HugePagePool() {
  std::ifstream in("/proc/sys/vm/nr_hugepages");
  std::string nr;
  in >> nr;
  return nr;
}

// Note [Fair fio buffers]: by default fio gets huge pages as strata does,
// and the pool is as it was afterwards; where that cannot be arranged, or
// with --fio-buffers malloc, the output says the ratio overstates strata.
TEST(NvmeBenchCliTest, FioGetsHugePagesByDefaultAndSaysWhichBuffers) {
  if (!HaveFio()) GTEST_SKIP() << "fio is not installed";
  testutil::ScratchDir dir;
  const std::string pool = HugePagePool();
  const std::string json = dir.File("out.json");
  const std::string args = "--path " + dir.path() +
                           " --rw read --bs 1M --qd 8 --size 16M --vs-fio "
                           "--repeat 1 --json " +
                           json;
  const Outcome o = Bench(args);
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_EQ(HugePagePool(), pool);
  const std::string kind = ReadJson(json)[0]["fio"]["buffers"];
  if (kind == "huge pages") {
    EXPECT_TRUE(Contains(o.output, "fio: buffers on 2.0 MiB huge pages"))
        << o.output;
    EXPECT_FALSE(Contains(o.output, "overstates")) << o.output;
  } else {
    EXPECT_EQ(kind, "malloc");
    EXPECT_TRUE(Contains(o.output, "huge pages could not be had")) << o.output;
    EXPECT_TRUE(Contains(o.output, "the ratio overstates strata")) << o.output;
  }
  const Outcome m = Bench(args + " --fio-buffers malloc");
  ASSERT_EQ(m.status, 0) << m.output;
  EXPECT_EQ(ReadJson(json)[0]["fio"]["buffers"], "malloc");
  EXPECT_TRUE(Contains(m.output, "fio's default (--fio-buffers malloc)"))
      << m.output;
  EXPECT_TRUE(Contains(m.output, "the ratio overstates strata")) << m.output;
  const Outcome same = Bench(args + " --no-huge-pages");
  ASSERT_EQ(same.status, 0) << same.output;
  EXPECT_EQ(ReadJson(json)[0]["fio"]["buffers"], "malloc");
  EXPECT_FALSE(Contains(same.output, "overstates")) << same.output;
}

TEST(NvmeBenchCliTest, VerifyFindsNoMismatches) {
  testutil::ScratchDir dir;
  const Outcome o =
      Bench("--path " + dir.path() +
            " --verify --verify-ops 500 --verify-max 512K --bs 64K --qd 8"
            " --size 16M");
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_TRUE(Contains(o.output, " 0 mismatched words")) << o.output;
}

// The thread backend keeps at most 64 requests in flight: qd 128 runs,
// and is reported as, 64 (the job keeps no more queued behind the pool),
// and the header says why.
TEST(NvmeBenchCliTest, RunsOnTheThreadBackend) {
  testutil::ScratchDir dir;
  const std::string json = dir.File("out.json");
  const Outcome o = Bench("--path " + dir.path() +
                              " --rw write,read --bs 64K --qd 4,128 --size 8M "
                              "--json " +
                              json,
                          "STRATA_AIO_BACKEND=threads");
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_TRUE(Contains(o.output, "backend threads")) << o.output;
  EXPECT_TRUE(Contains(o.output,
                       "qd capped: the thread backend runs at most 64 "
                       "requests at once"))
      << o.output;
  const nlohmann::json records = ReadJson(json);
  ASSERT_EQ(records.size(), 4u);
  for (const auto& r : records) EXPECT_EQ(r["backend"], "threads");
  EXPECT_EQ(records[0]["qd"], 4);
  EXPECT_FALSE(records[0].contains("qd_requested"));
  EXPECT_EQ(records[1]["qd"], 64);
  EXPECT_EQ(records[1]["qd_requested"], 128);
}

TEST(NvmeBenchCliTest, BadInputGetsAClearError) {
  testutil::ScratchDir dir;
  const Outcome missing = Bench("--path " + dir.path() + "/nope/deeper/f");
  EXPECT_EQ(missing.status, 1);
  EXPECT_TRUE(Contains(missing.output, "does not exist")) << missing.output;
  EXPECT_TRUE(Contains(missing.output, "mkdir -p"));

  const Outcome bad_bs = Bench("--path " + dir.path() + " --bs 6000");
  EXPECT_EQ(bad_bs.status, 2);
  EXPECT_TRUE(Contains(bad_bs.output, "--bs")) << bad_bs.output;

  // Someone else's file is never written without --overwrite.
  const std::string theirs = dir.File("theirs.bin");
  std::ofstream(theirs) << std::string(1 << 20, 'x');
  for (const char* rw : {"write", "randrw"}) {  // a mixed job writes too
    const Outcome refused =
        Bench("--path " + theirs + " --rw " + rw + " --bs 64K --size 1M");
    EXPECT_EQ(refused.status, 1) << rw;
    EXPECT_TRUE(Contains(refused.output, "--overwrite")) << refused.output;
  }
  std::ifstream in(theirs);
  std::string content((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(content, std::string(1 << 20, 'x'));
  EXPECT_TRUE(std::filesystem::exists(theirs));

  const Outcome proc = Bench("--path /proc --rw read --size 1M");
  EXPECT_EQ(proc.status, 1);
  EXPECT_TRUE(Contains(proc.output,
                       "/proc is on proc, a file system that "
                       "holds no data"))
      << proc.output;
}

// An oversized --size is refused before anything is made, with the true
// free space, counting what the file holds already.
TEST(NvmeBenchCliTest, FullFileSystemIsReported) {
  testutil::Mount small("tmpfs", "size=4m");
  if (!small.ok()) GTEST_SKIP() << small.error();
  const Outcome o = Bench("--path " + small.path() + " --size 64M");
  EXPECT_EQ(o.status, 1);
  EXPECT_TRUE(Contains(o.output, "--size 64M does not fit: " + small.path() +
                                     " has 4.0 MiB free (tmpfs); pass a "
                                     "smaller --size or another --path"))
      << o.output;
  EXPECT_FALSE(Contains(o.output, "strata-nvme-bench: " + small.path()))
      << o.output;  // no header: the file was never opened
  EXPECT_FALSE(
      std::filesystem::exists(small.path() + "/strata-nvme-bench.dat"));

  const std::string file = small.path() + "/f.dat";
  const std::string args = " --rw read --bs 64K --create --overwrite --keep";
  ASSERT_EQ(Bench("--path " + file + args + " --size 3M").status, 0);
  const Outcome more = Bench("--path " + file + args + " --size 8M");
  EXPECT_EQ(more.status, 1);
  EXPECT_TRUE(Contains(more.output,
                       "has 1.0 MiB free (tmpfs) besides the "
                       "3.0 MiB that '" +
                           file + "' holds"))
      << more.output;
  // 3M fits again in the blocks the file holds, though 1 MiB is free.
  const Outcome again = Bench("--path " + file + args + " --size 3M");
  EXPECT_EQ(again.status, 0) << again.output;
}

// A mistyped directory is not silently made a file in its parent.
TEST(NvmeBenchCliTest, APathThatDoesNotExistIsAnErrorUnlessCreate) {
  testutil::ScratchDir dir;
  const std::string typo = dir.File("nonexistent_dir_xyz");
  const std::string args = " --rw read --bs 64K --size 1M";
  const Outcome o = Bench("--path " + typo + args);
  EXPECT_EQ(o.status, 1);
  EXPECT_TRUE(Contains(o.output, "'" + typo + "' does not exist")) << o.output;
  EXPECT_TRUE(Contains(o.output, "mkdir -p " + typo)) << o.output;
  EXPECT_TRUE(Contains(o.output, "add --create")) << o.output;
  EXPECT_FALSE(Contains(o.output, "GB/s")) << o.output;
  EXPECT_FALSE(std::filesystem::exists(typo));

  // --create: a new file at that path, removed afterwards unless --keep.
  const Outcome made = Bench("--path " + typo + " --create" + args);
  ASSERT_EQ(made.status, 0) << made.output;
  EXPECT_TRUE(Contains(made.output, "strata-nvme-bench: " + typo + " (1M)"))
      << made.output;
  EXPECT_FALSE(std::filesystem::exists(typo));
  const Outcome kept = Bench("--path " + typo + " --create --keep" + args);
  ASSERT_EQ(kept.status, 0) << kept.output;
  EXPECT_EQ(std::filesystem::file_size(typo), 1u << 20);
}

// The benchmark's file in a directory belongs to one run: one that is
// there already (another run's, or a killed one's) is neither shared nor
// overwritten.
TEST(NvmeBenchCliTest, AnotherRunsFileInTheDirectoryIsLeftAlone) {
  testutil::ScratchDir dir;
  const std::string file = dir.File("strata-nvme-bench.dat");
  std::ofstream(file) << "another run's";
  const Outcome o =
      Bench("--path " + dir.path() + " --rw write --bs 64K --size 1M");
  EXPECT_EQ(o.status, 1) << o.output;
  EXPECT_TRUE(Contains(o.output, "another strata-nvme-bench may be running"))
      << o.output;
  EXPECT_TRUE(Contains(o.output, "rm '" + file + "'")) << o.output;
  EXPECT_EQ(ReadText(file), "another run's");
}

// The first line says which file system and device the figures are of.
TEST(NvmeBenchCliTest, HeaderNamesTheFileSystemAndDevice) {
  testutil::ScratchDir dir;
  const Outcome o =
      Bench("--path " + dir.path() + " --rw read --bs 64K --size 1M");
  ASSERT_EQ(o.status, 0) << o.output;
  const std::string first = FirstLine(o.output);
  const std::string file = dir.File("strata-nvme-bench.dat");
  EXPECT_EQ(first.rfind("strata-nvme-bench: " + file + " (1M) on ", 0), 0u)
      << first;
  EXPECT_TRUE(std::regex_search(first, std::regex(R"(, \S+ \(\d+:\d+\)$)")) ||
              Contains(first, "(not a block device: "))
      << first;
  // An existing file larger than --size: the header says what is measured.
  const std::string big = dir.File("big");
  std::ofstream(big).close();
  std::filesystem::resize_file(big, 4 << 20);
  const Outcome part = Bench("--path " + big + " --rw read --bs 64K --size 1M");
  ASSERT_EQ(part.status, 0) << part.output;
  EXPECT_TRUE(Contains(FirstLine(part.output),
                       big + " (4M, the jobs cover its first 1M) on "))
      << part.output;
}

// tmpfs takes O_DIRECT since Linux 6.6: the run says its figures are
// memory speed.
TEST(NvmeBenchCliTest, HeaderSaysTmpfsIsNoBlockDevice) {
  testutil::Mount ram("tmpfs", "size=16m");
  if (!ram.ok()) GTEST_SKIP() << ram.error();
  const Outcome o =
      Bench("--path " + ram.path() + " --rw read --bs 64K --size 1M");
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_TRUE(Contains(FirstLine(o.output),
                       " on tmpfs (not a block device: figures are memory "
                       "speed and mean nothing for a drive)"))
      << o.output;
}

// What would fail after the sweep fails before the first run, and leaves
// no --json file behind.
TEST(NvmeBenchCliTest, JsonAndFioMistakesAreFoundBeforeTheFirstRun) {
  testutil::ScratchDir dir;
  const std::string args = "--path " + dir.path() +
                           " --rw read --bs 64K "
                           "--size 1M";
  const std::string nowhere = dir.File("no/such/dir/out.json");
  const Outcome json = Bench(args + " --json " + nowhere);
  EXPECT_EQ(json.status, 1);
  EXPECT_TRUE(Contains(json.output, "cannot write --json file '" + nowhere))
      << json.output;
  EXPECT_FALSE(Contains(json.output, "GB/s")) << json.output;

  const std::string out = dir.File("out.json");
  const Outcome fio =
      Bench(args + " --vs-fio --fio /nonexistent/fio --json " + out);
  EXPECT_EQ(fio.status, 1);
  EXPECT_TRUE(Contains(fio.output, "fio not found")) << fio.output;
  EXPECT_TRUE(Contains(fio.output,
                       "install it (apt-get install fio) or pass "
                       "--fio PATH"))
      << fio.output;
  EXPECT_FALSE(Contains(fio.output, "GB/s")) << fio.output;
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(dir.File("strata-nvme-bench.dat")));
}

TEST(NvmeBenchCliTest, ABadFioOptIsFoundBeforeTheFirstRun) {
  if (!HaveFio()) GTEST_SKIP() << "fio is not installed";
  testutil::ScratchDir dir;
  const Outcome o = Bench("--path " + dir.path() +
                          " --rw read --bs 64K --size 1M --vs-fio "
                          "--fio-opt=--no-such-option");
  EXPECT_EQ(o.status, 1);
  EXPECT_TRUE(Contains(o.output, "unrecognized option '--no-such-option'"))
      << o.output;
  EXPECT_FALSE(Contains(o.output, "GB/s")) << o.output;
}

// A read-only run on someone else's file that is too small for --size.
TEST(NvmeBenchCliTest, ASmallFileForAReadOnlyRunIsSaidToBeSmall) {
  testutil::ScratchDir dir;
  const std::string theirs = dir.File("theirs.bin");
  std::ofstream(theirs) << std::string(1 << 20, 'x');
  const Outcome o = Bench("--path " + theirs + " --rw read --bs 64K --size 2M");
  EXPECT_EQ(o.status, 1);
  EXPECT_TRUE(Contains(o.output, "is 1.0 MiB, smaller than --size 2M"))
      << o.output;
  EXPECT_TRUE(Contains(o.output, "a smaller --size (at most 1M)"));
  EXPECT_TRUE(Contains(o.output, "--overwrite"));
  EXPECT_FALSE(Contains(o.output, "would write")) << o.output;
  EXPECT_EQ(ReadText(theirs), std::string(1 << 20, 'x'));
}

// --sync opens with O_DSYNC and --fsync 5 syncs each thread's 64 writes 12
// times; a read job in the same sweep does not sync.
TEST(NvmeBenchCliTest, SyncAndFsyncShowInTheHeaderAndJson) {
  testutil::ScratchDir dir;
  const std::string json = dir.File("out.json");
  const std::string job =
      "--path " + dir.path() +
      " --rw write,read --bs 64K --qd 4 --threads 2 --size 8M --json " + json;
  const Outcome o = Bench(job + " --sync --fsync 5");
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_TRUE(
      Contains(o.output.substr(0, o.output.find("backend")), ", O_DSYNC"))
      << o.output;
  const nlohmann::json records = ReadJson(json);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["rw"], "write");
  EXPECT_EQ(records[0]["sync"], true);
  EXPECT_EQ(records[0]["fsync"], 5);
  EXPECT_EQ(records[0]["syncs"], 2 * (64 / 5));
  EXPECT_EQ(records[1]["sync"], true);
  EXPECT_EQ(records[1]["fsync"], 0);
  EXPECT_EQ(records[1]["syncs"], 0);
  const Outcome plain = Bench(job);
  ASSERT_EQ(plain.status, 0) << plain.output;
  EXPECT_FALSE(Contains(plain.output, "O_DSYNC")) << plain.output;
  EXPECT_EQ(ReadJson(json)[0]["sync"], false);
  EXPECT_EQ(ReadJson(json)[0]["syncs"], 0);
}

TEST(NvmeBenchCliTest, HelpDocumentsEveryOption) {
  const Outcome o = Bench("--help");
  ASSERT_EQ(o.status, 0);
  for (const char* opt : {"--path",       "--rw",
                          "--bs",         "--qd",
                          "--threads",    "--size",
                          "--time",       "--backend",
                          "--buffered",   "--sync",
                          "--fsync",      "--log",
                          "--no-pin",     "--no-huge-pages",
                          "--vs-fio",     "--fio",
                          "--fio-opt",    "--fio-buffers",
                          "--repeat",     "--json",
                          "--recommend",  "--verify",
                          "--verify-ops", "--verify-max",
                          "--keep",       "--overwrite",
                          "--create",     "--destroy-data-on",
                          "--seed",       "--quiet"}) {
    EXPECT_TRUE(Contains(o.output, opt)) << opt;
  }
}

}  // namespace
}  // namespace strata::bench
