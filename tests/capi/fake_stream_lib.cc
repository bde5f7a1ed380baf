// libstrata_fake_stream: testutil::FakeStream behind a C interface, so the
// Python package's tests can hand strata a late-completing stream on the
// host-emulated device (python/tests/test_fences.py). Test-only.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tests/testutil/fake_stream.h"

extern "C" {

// A new stream; its address is the strata::HostStream* the C ABI takes.
__attribute__((visibility("default"))) void* fake_stream_create() {
  return static_cast<strata::HostStream*>(new strata::testutil::FakeStream);
}

__attribute__((visibility("default"))) void fake_stream_destroy(void* s) {
  delete static_cast<strata::testutil::FakeStream*>(
      static_cast<strata::HostStream*>(s));
}

// Queues a "kernel" copying `bytes` from `src` to `dst` when it runs.
__attribute__((visibility("default"))) void fake_stream_queue_copy(
    void* s, void* dst, const void* src, size_t bytes) {
  auto* stream = static_cast<strata::testutil::FakeStream*>(
      static_cast<strata::HostStream*>(s));
  stream->Queue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
}

// Runs every kernel queued so far.
__attribute__((visibility("default"))) void fake_stream_run(void* s) {
  static_cast<strata::testutil::FakeStream*>(
      static_cast<strata::HostStream*>(s))
      ->Run();
}

}  // extern "C"
