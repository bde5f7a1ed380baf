#include "tests/testutil/testutil.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <vector>

namespace strata::testutil {
namespace {

std::string ScratchRoot() {
  if (const char* env = std::getenv("STRATA_TEST_TMPDIR"); env && *env) {
    return env;
  }
  return STRATA_TEST_SCRATCH_ROOT;
}

}  // namespace

ScratchDir::ScratchDir() {
  const std::string root = ScratchRoot();
  std::filesystem::create_directories(root);
  std::string tmpl = root + "/strata-test-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "mkdtemp(%s): %s\n", tmpl.c_str(),
                 std::strerror(errno));
    std::abort();
  }
  path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Mount::Mount(const std::string& type, const std::string& options,
             bool read_only) {
  const unsigned long flags = read_only ? MS_RDONLY : 0;
  if (mount(type.c_str(), dir_.path().c_str(), type.c_str(), flags,
            options.c_str()) != 0) {
    error_ = "mount -t " + type + " refused: " + std::strerror(errno) +
             " (needs root or CAP_SYS_ADMIN)";
    return;
  }
  ok_ = true;
}

Mount::~Mount() {
  if (ok_) umount2(dir_.path().c_str(), MNT_DETACH);
}

LoopDevice::LoopDevice(uint64_t bytes, uint64_t seed)
    : backing_(dir_.File("loop.img")) {
  std::vector<char> data(bytes);
  FillRandom(data.data(), bytes, seed);
  std::ofstream(backing_, std::ios::binary).write(data.data(), bytes);
  const std::string cmd = "losetup -f --show " + backing_ + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 256> buf;
  for (size_t n; p != nullptr && (n = fread(buf.data(), 1, buf.size(), p));) {
    out.append(buf.data(), n);
  }
  const int status = p != nullptr ? pclose(p) : -1;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  if (status == 0 && out.rfind("/dev/", 0) == 0) {
    path_ = out;
  } else {
    error_ =
        "no loop device (losetup -f --show needs root and loop "
        "devices): " +
        out;
  }
}

LoopDevice::~LoopDevice() {
  if (ok() && std::system(("losetup -d " + path_).c_str()) != 0) {
    std::fprintf(stderr, "losetup -d %s failed: detach it by hand\n",
                 path_.c_str());
  }
}

void FillRandom(void* data, size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* p = static_cast<unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < bytes; ++i) p[i] = static_cast<unsigned char>(rng());
}

std::string CaptureStderr(const std::function<void()>& fn) {
  std::fflush(stderr);
  char path[] = "/tmp/strata-stderr-XXXXXX";
  const int fd = mkstemp(path);
  unlink(path);
  const int saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  fn();
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string out;
  lseek(fd, 0, SEEK_SET);
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fd);
  return out;
}

uint32_t ShortIoInjector::SubmitLength(bool, uint64_t, uint32_t len) {
  if (len <= max_bytes_) return len;
  cuts.fetch_add(1);
  return max_bytes_;
}

int ErrnoInjector::CompletionResult(bool write, uint64_t offset, uint32_t len,
                                    int result) {
  if (writes_only_ && !write) return result;
  if (offset >= offset_ + len_ || offset_ >= offset + len) return result;
  int left = times_.load();
  while (left != 0) {
    if (left < 0 || times_.compare_exchange_weak(left, left - 1)) {
      injected.fetch_add(1);
      return -err_;
    }
  }
  return result;
}

void BitFlipInjector::AfterRead(uint64_t offset, char* data, uint32_t bytes) {
  if (offset_ < offset || offset_ >= offset + bytes) return;
  if (flipped.exchange(true)) return;
  data[offset_ - offset] ^= 0x10;
}

}  // namespace strata::testutil
