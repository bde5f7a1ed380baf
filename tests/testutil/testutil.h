// Shared helpers for strata tests: scratch directories, file systems mounted
// for a test, fault injectors and random data.
#ifndef STRATA_TESTS_TESTUTIL_TESTUTIL_H_
#define STRATA_TESTS_TESTUTIL_TESTUTIL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "strata/aio.h"

namespace strata::testutil {

// A fresh directory, removed with its contents on destruction. Lives under
// $STRATA_TEST_TMPDIR, else under the build tree (a real disk, so O_DIRECT
// works), else /tmp.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A file system mounted on a scratch directory for the test's lifetime.
// Mounting needs CAP_SYS_ADMIN; check ok() and skip visibly when it fails.
class Mount {
 public:
  // `type` is "tmpfs" or "ramfs"; `options` as for mount -o ("size=1m").
  Mount(const std::string& type, const std::string& options,
        bool read_only = false);
  ~Mount();
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  const std::string& path() const { return dir_.path(); }

 private:
  ScratchDir dir_;
  bool ok_ = false;
  std::string error_;
};

// A loop device (losetup -f --show) over a file of `bytes` random bytes
// (FillRandom with `seed`) in its own scratch directory, detached on
// destruction. Needs root and loop devices, which CI machines may lack:
// check ok() and skip visibly when it fails.
class LoopDevice {
 public:
  LoopDevice(uint64_t bytes, uint64_t seed);
  ~LoopDevice();
  LoopDevice(const LoopDevice&) = delete;
  LoopDevice& operator=(const LoopDevice&) = delete;
  bool ok() const { return !path_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& path() const { return path_; }  // "/dev/loop3"
  const std::string& backing() const { return backing_; }

 private:
  ScratchDir dir_;
  std::string backing_;
  std::string path_;
  std::string error_;
};

// Deterministic pseudo-random bytes.
void FillRandom(void* data, size_t bytes, uint64_t seed);

// Runs `fn` with stderr captured; returns what it printed.
std::string CaptureStderr(const std::function<void()>& fn);

// Cuts every transfer to at most `max_bytes` (at least one alignment unit
// remains, so O_DIRECT stays valid) and counts the cuts.
class ShortIoInjector : public aio::FaultInjector {
 public:
  ShortIoInjector(uint32_t max_bytes) : max_bytes_(max_bytes) {}
  uint32_t SubmitLength(bool write, uint64_t offset, uint32_t len) override;
  std::atomic<uint64_t> cuts{0};

 private:
  uint32_t max_bytes_;
};

// Fails transfers that touch [offset, offset+len) with -err, `times` times
// (or forever when times < 0).
class ErrnoInjector : public aio::FaultInjector {
 public:
  ErrnoInjector(int err, uint64_t offset, uint64_t len, int times = -1,
                bool writes_only = false)
      : err_(err),
        offset_(offset),
        len_(len),
        times_(times),
        writes_only_(writes_only) {}
  int CompletionResult(bool write, uint64_t offset, uint32_t len,
                       int result) override;
  std::atomic<uint64_t> injected{0};

 private:
  int err_;
  uint64_t offset_, len_;
  std::atomic<int> times_;
  bool writes_only_;
};

// Flips one bit in the first read that delivers byte `offset`.
class BitFlipInjector : public aio::FaultInjector {
 public:
  explicit BitFlipInjector(uint64_t offset) : offset_(offset) {}
  void AfterRead(uint64_t offset, char* data, uint32_t bytes) override;
  std::atomic<bool> flipped{false};

 private:
  uint64_t offset_;
};

}  // namespace strata::testutil

#endif  // STRATA_TESTS_TESTUTIL_TESTUTIL_H_
