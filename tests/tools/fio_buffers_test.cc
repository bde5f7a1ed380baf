// fio's buffers for --vs-fio (Note [Fair fio buffers]): how many huge pages
// a sweep needs, reserving them and giving them back, and every way of
// ending on malloc buffers with the reason. The kernel's files are replaced
// by files of the test's own.
#include "tools/nvme_bench/fio_buffers.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/testutil/testutil.h"

namespace strata::bench {
namespace {

constexpr uint64_t kPage = 2u << 20;

JobSpec Job(size_t bs, int qd, int threads) {
  JobSpec s;
  s.bs = bs;
  s.qd = qd;
  s.threads = threads;
  return s;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A /proc/meminfo and vm.nr_hugepages of the test's own.
struct FakeKernel {
  testutil::ScratchDir dir;
  HugePageFiles files{dir.File("meminfo"), dir.File("nr_hugepages")};

  FakeKernel(int free_pages, int reserved, int nr) {
    Write(files.meminfo,
          "MemTotal: 1000 kB\nHugePages_Total: " + std::to_string(nr) +
              "\nHugePages_Free: " + std::to_string(free_pages) +
              "\nHugePages_Rsvd: " + std::to_string(reserved) +
              "\nHugepagesize:       2048 kB\n");
    Write(files.nr_hugepages, std::to_string(nr) + "\n");
  }
};

TEST(FioBuffersTest, PagesCoverTheLargestJobWithSlack) {
  // fio 3.33 needed 18 pages for 1M x 32 and 2 for 128K x 4 (measured).
  EXPECT_EQ(FioHugePagesNeeded({Job(1 << 20, 32, 1)}, kPage), 19u);
  EXPECT_EQ(FioHugePagesNeeded({Job(128 << 10, 4, 1)}, kPage), 3u);
  EXPECT_EQ(FioHugePagesNeeded(
                {Job(128 << 10, 4, 1), Job(1 << 20, 32, 2), Job(4 << 20, 1, 1)},
                kPage),
            38u);
  EXPECT_EQ(FioHugePagesNeeded({}, kPage), 0u);
}

TEST(FioBuffersTest, ReservesTheShortfallAndGivesItBack) {
  FakeKernel kernel(/*free_pages=*/5, /*reserved=*/1, /*nr=*/7);
  {
    auto b = FioBuffers::Prepare(FioBufferKind::kHugePages,
                                 {Job(1 << 20, 32, 1)}, {}, kernel.files);
    EXPECT_EQ(b->kind(), "huge pages");
    EXPECT_EQ(b->options(), (std::vector<std::string>{
                                "--mem=mmaphuge", "--hugepage-size=2097152"}));
    // 19 needed, 5 - 1 usable: 15 more.
    EXPECT_EQ(Read(kernel.files.nr_hugepages), "22\n");
    EXPECT_TRUE(Contains(b->description(), "15 reserved for this run"))
        << b->description();
    EXPECT_TRUE(Contains(b->description(), "7 -> 22"));
    EXPECT_FALSE(b->unequal(/*strata_huge_pages=*/true));
    EXPECT_TRUE(b->unequal(/*strata_huge_pages=*/false));
  }
  EXPECT_EQ(Read(kernel.files.nr_hugepages), "7\n");
}

TEST(FioBuffersTest, EnoughFreePagesAreUsedWithoutChangingThePool) {
  FakeKernel kernel(/*free_pages=*/40, /*reserved=*/0, /*nr=*/40);
  auto b = FioBuffers::Prepare(FioBufferKind::kHugePages, {Job(1 << 20, 32, 1)},
                               {}, kernel.files);
  EXPECT_EQ(b->kind(), "huge pages");
  EXPECT_TRUE(Contains(b->description(), "none reserved")) << b->description();
  b.reset();
  EXPECT_EQ(Read(kernel.files.nr_hugepages), "40\n");
}

TEST(FioBuffersTest, MallocWhenHugePagesCannotBeHadSaysWhy) {
  FakeKernel kernel(0, 0, 0);
  HugePageFiles unwritable = kernel.files;
  unwritable.nr_hugepages = kernel.dir.File("no/such/dir/nr_hugepages");
  HugePageFiles no_pool = kernel.files;
  no_pool.meminfo = kernel.dir.File("empty");
  Write(no_pool.meminfo, "MemTotal: 1000 kB\n");
  const std::vector<JobSpec> job = {Job(1 << 20, 32, 1)};
  for (const auto& [files, why] :
       {std::pair{unwritable, std::string("cannot read")},
        std::pair{no_pool, std::string("no huge page pool")}}) {
    auto b = FioBuffers::Prepare(FioBufferKind::kHugePages, job, {}, files);
    EXPECT_EQ(b->kind(), "malloc");
    EXPECT_TRUE(b->options().empty());
    EXPECT_TRUE(Contains(b->description(), "huge pages could not be had"))
        << b->description();
    EXPECT_TRUE(Contains(b->description(), why)) << b->description();
    EXPECT_TRUE(b->unequal(/*strata_huge_pages=*/true));
  }
  EXPECT_EQ(Read(kernel.files.nr_hugepages), "0\n");
}

TEST(FioBuffersTest, MallocOnRequestAndFioOptsOwnChoiceTouchNothing) {
  FakeKernel kernel(0, 0, 3);
  auto malloc = FioBuffers::Prepare(FioBufferKind::kMalloc,
                                    {Job(1 << 20, 32, 1)}, {}, kernel.files);
  EXPECT_EQ(malloc->kind(), "malloc");
  EXPECT_TRUE(Contains(malloc->description(), "as asked"));
  EXPECT_FALSE(malloc->unequal(/*strata_huge_pages=*/false));
  auto given =
      FioBuffers::Prepare(FioBufferKind::kHugePages, {Job(1 << 20, 32, 1)},
                          {"--fixedbufs", "--mem=shmhuge"}, kernel.files);
  EXPECT_EQ(given->kind(), "--fio-opt");
  EXPECT_TRUE(given->options().empty());
  EXPECT_EQ(Read(kernel.files.nr_hugepages), "3\n");
  EXPECT_TRUE(FioOptsChooseBuffers({"--iomem=malloc"}));
  EXPECT_FALSE(FioOptsChooseBuffers({"--fixedbufs", "--mem_align=4096"}));
}

TEST(FioBuffersTest, KindNamesAreParsed) {
  EXPECT_EQ(*ParseFioBufferKind("huge"), FioBufferKind::kHugePages);
  EXPECT_EQ(*ParseFioBufferKind("malloc"), FioBufferKind::kMalloc);
  Result<FioBufferKind> bad = ParseFioBufferKind("thp");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(bad.status().message(), "huge, malloc"));
}

}  // namespace
}  // namespace strata::bench
