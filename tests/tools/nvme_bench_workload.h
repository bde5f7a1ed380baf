// The fixture of strata-nvme-bench's job tests: a 16 MiB file in a scratch
// directory and unpinned buffers for the job's requests.
#ifndef STRATA_TESTS_TOOLS_NVME_BENCH_WORKLOAD_H_
#define STRATA_TESTS_TOOLS_NVME_BENCH_WORKLOAD_H_

#include <gtest/gtest.h>

#include <string>

#include "strata/aio.h"
#include "tests/testutil/testutil.h"

namespace strata::bench {

class WorkloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = aio::Engine::Open(aio::IoOptions{});
    ASSERT_TRUE(e.ok());
    auto f = (*e)->OpenFile(path_, aio::FileOptions{kSize});
    ASSERT_TRUE(f.ok());
    direct_ = (*f)->direct();
    auto b = aio::PinnedBuffer::Allocate(kPool, aio::PinOptions{false});
    ASSERT_TRUE(b.ok());
    pool_ = std::move(*b);
  }
  static constexpr uint64_t kSize = 16 << 20;
  static constexpr size_t kPool = 8 << 20;
  testutil::ScratchDir dir_;
  std::string path_ = dir_.File("bench.dat");
  bool direct_ = true;
  aio::PinnedBuffer pool_;
};

}  // namespace strata::bench

#endif  // STRATA_TESTS_TOOLS_NVME_BENCH_WORKLOAD_H_
