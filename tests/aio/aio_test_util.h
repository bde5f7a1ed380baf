// The fixture shared by the strata_aio tests that run on both backends
// (aio_engine_test.cc, aio_edge_test.cc): an engine on the test's backend,
// files in a scratch directory, unlocked pinned buffers, and readable
// test names.
#ifndef STRATA_TESTS_AIO_AIO_TEST_UTIL_H_
#define STRATA_TESTS_AIO_AIO_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <memory>
#include <ostream>
#include <string>

#include "strata/aio.h"
#include "tests/testutil/testutil.h"

namespace strata::aio {

// Readable test names: ".../IoUring  # GetParam() = io_uring".
inline void PrintTo(Backend b, std::ostream* os) { *os << BackendName(b); }

namespace aio_test {

class BackendTest : public ::testing::TestWithParam<Backend> {
 protected:
  // Opens an engine on the test's backend; when io_uring is requested but
  // cannot be set up here, returns null with the reason in skipped_.
  std::unique_ptr<Engine> Open(IoOptions o = {}) {
    o.backend = GetParam();
    auto e = Engine::Open(o);
    if (!e.ok() && e.status().code() == StatusCode::kUnavailable) {
      skipped_ = e.status().message();
      return nullptr;
    }
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(*e) : nullptr;
  }

  File* OpenFile(Engine& e, uint64_t size, const std::string& name = "f",
                 bool read_only = false) {
    FileOptions fo;
    fo.size = size;
    fo.read_only = read_only;
    auto f = e.OpenFile(dir_.File(name), fo);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    return f.ok() ? *f : nullptr;
  }

  PinnedBuffer Buffer(size_t bytes) {
    PinOptions po;
    po.lock = false;  // the memlock limit is tested on its own
    auto b = PinnedBuffer::Allocate(bytes, po);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return std::move(*b);
  }

  testutil::ScratchDir dir_;
  std::string skipped_;
};

// The name suffix of INSTANTIATE_TEST_SUITE_P: "IoUring" or "Threads".
inline std::string BackendSuffix(
    const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kIoUring ? "IoUring" : "Threads";
}

}  // namespace aio_test
}  // namespace strata::aio

// In a BackendTest: `engine` = Open(...), or skip visibly (io_uring cannot
// be set up here) or return (Open failed and said why).
#define OPEN_OR_SKIP(engine, ...)                    \
  auto engine = Open(__VA_ARGS__);                   \
  if (!engine) {                                     \
    if (!skipped_.empty()) GTEST_SKIP() << skipped_; \
    return;                                          \
  }

#endif  // STRATA_TESTS_AIO_AIO_TEST_UTIL_H_
