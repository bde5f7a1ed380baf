// fio's buffers for --vs-fio (Note [Fair fio buffers]): how many huge pages
// a sweep needs, huge pages reserved for fio and given back, every way of
// ending on malloc buffers with the reason, and the note that says when the
// ratio flatters one side. The kernel's files are replaced by files of the
// test's own.
#include "tools/nvme_bench/fio_buffers.h"

#include <gtest/gtest.h>

#include "tests/testutil/testutil.h"
#include "tests/tools/fake_kernel.h"

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

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(FioBuffersTest, PagesCoverTheLargestJobWithSlack) {
  // fio 3.33 needed 18 pages for 1M x 32 and 2 for 128K x 4 (measured).
  EXPECT_EQ(FioHugePagesNeeded({Job(1 << 20, 32, 1)}, kPage), 19u);
  EXPECT_EQ(FioHugePagesNeeded({Job(128 << 10, 4, 1)}, kPage), 3u);
  EXPECT_EQ(FioHugePagesNeeded(
                {Job(128 << 10, 4, 1), Job(1 << 20, 32, 2), Job(4 << 20, 1, 1)},
                kPage),
            38u);
  // The slack is bytes, not pages: one 1 GiB page holds a 1M x 32 job.
  EXPECT_EQ(FioHugePagesNeeded({Job(1 << 20, 32, 1)}, 1u << 30), 1u);
  EXPECT_EQ(FioHugePagesNeeded({}, kPage), 0u);
}

TEST(FioBuffersTest, HugePagesAreReservedForFioAndGivenBack) {
  FakeKernel kernel(/*free_pages=*/4, /*reserved=*/0, /*nr=*/7);
  {
    auto b = FioBuffers::Prepare(FioBufferKind::kHugePages,
                                 {Job(1 << 20, 32, 1)}, {}, kernel.files);
    EXPECT_EQ(b->kind(), "huge pages");
    EXPECT_EQ(b->options(), (std::vector<std::string>{
                                "--mem=mmaphuge", "--hugepage-size=2097152"}));
    EXPECT_EQ(kernel.nr(), "26\n");  // its own 19, though 4 were free
    EXPECT_TRUE(Contains(b->description(), "19 reserved\n  for this run"))
        << b->description();
    EXPECT_TRUE(Contains(b->description(), "7 -> 26"));
    EXPECT_TRUE(Contains(b->description(), "after a kill -9: echo"));
    EXPECT_EQ(b->Mismatch(/*strata_asked=*/true, /*strata_huge=*/true), "");
  }
  EXPECT_EQ(kernel.nr(), "7\n");
}

TEST(FioBuffersTest, MallocWhenHugePagesCannotBeHadSaysWhyAndWhatToDo) {
  FakeKernel kernel(0, 0, 0);
  HugePageFiles unwritable = kernel.files;
  unwritable.nr_hugepages = "/dev/full";
  auto b = FioBuffers::Prepare(FioBufferKind::kHugePages, {Job(1 << 20, 32, 1)},
                               {}, unwritable);
  EXPECT_EQ(b->kind(), "malloc");
  EXPECT_TRUE(b->options().empty());
  EXPECT_TRUE(Contains(b->description(), "huge pages could not be had"))
      << b->description();
  EXPECT_TRUE(Contains(b->description(), "cannot set vm.nr_hugepages"));
  const std::string note = b->Mismatch(true, true);
  EXPECT_TRUE(Contains(note, "the ratio overstates strata")) << note;
  EXPECT_TRUE(Contains(note, "run as root")) << note;
}

TEST(FioBuffersTest, MismatchNamesWhichSideTheRatioFlattersAndTheFix) {
  FakeKernel kernel(40, 0, 40);
  auto malloc = FioBuffers::Prepare(FioBufferKind::kMalloc,
                                    {Job(1 << 20, 32, 1)}, {}, kernel.files);
  EXPECT_EQ(malloc->kind(), "malloc");
  EXPECT_TRUE(
      Contains(malloc->description(), "fio's default (--fio-buffers malloc)"));
  EXPECT_TRUE(Contains(malloc->Mismatch(true, true),
                       "overstates strata; --fio-buffers huge"));
  EXPECT_EQ(malloc->Mismatch(false, false), "");
  auto huge = FioBuffers::Prepare(FioBufferKind::kHugePages,
                                  {Job(1 << 20, 32, 1)}, {}, kernel.files);
  EXPECT_TRUE(Contains(huge->Mismatch(false, false),
                       "understates strata; --fio-buffers malloc"));
  EXPECT_TRUE(Contains(huge->Mismatch(true, false),
                       "transparent huge pages could not be had"));
}

TEST(FioBuffersTest, FioOptsOwnChoiceTouchesNothing) {
  FakeKernel kernel(0, 0, 3);
  auto given =
      FioBuffers::Prepare(FioBufferKind::kHugePages, {Job(1 << 20, 32, 1)},
                          {"--fixedbufs", "--mem=shmhuge"}, kernel.files);
  EXPECT_EQ(given->kind(), "--fio-opt");
  EXPECT_TRUE(given->options().empty());
  EXPECT_EQ(given->Mismatch(true, true), "");
  EXPECT_EQ(kernel.nr(), "3\n");
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
