#include "tools/nvme_bench/huge_pages.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace strata::bench {
namespace {

constexpr int kSignals[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT,
                            SIGPIPE, SIGABRT, SIGSEGV, SIGBUS};

// What the signal handler needs, set while the signals are blocked:
// vm.nr_hugepages' path, the lock's and the pages to take off it. g_added
// is 0 when there is nothing to give back.
char g_path[512];
char g_lock[512];
volatile sig_atomic_t g_added = 0;
struct sigaction g_previous[std::size(kSignals)];
bool g_installed[std::size(kSignals)];

// An flock() on `path` for its scope, with async-signal-safe calls only;
// held() is false when the file cannot be opened.
class PoolLock {
 public:
  explicit PoolLock(const char* path)
      : fd_(open(path, O_RDONLY | O_CREAT | O_CLOEXEC, 0600)) {
    if (fd_ >= 0) flock(fd_, LOCK_EX);
  }
  ~PoolLock() {
    if (fd_ >= 0) close(fd_);
  }
  PoolLock(const PoolLock&) = delete;
  PoolLock& operator=(const PoolLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  const int fd_;
};

// Lowers vm.nr_hugepages by `pages` from its value now, under the lock,
// with nothing but async-signal-safe calls; false when it cannot read or
// write the file.
bool GiveBackNow(const char* path, const char* lock, uint64_t pages) {
  const PoolLock locked(lock);
  char text[32];
  int fd = open(path, O_RDONLY);
  if (fd < 0) return false;
  const ssize_t n = read(fd, text, sizeof(text) - 1);
  close(fd);
  if (n <= 0) return false;
  uint64_t now = 0;
  for (ssize_t i = 0; i < n && text[i] >= '0' && text[i] <= '9'; ++i) {
    now = now * 10 + (text[i] - '0');
  }
  uint64_t value = now > pages ? now - pages : 0;
  char digits[24];
  int len = 0;
  do {
    digits[len++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value > 0);
  for (int i = 0; i < len; ++i) text[i] = digits[len - 1 - i];
  text[len] = '\n';
  fd = open(path, O_WRONLY | O_TRUNC);
  if (fd < 0) return false;
  const bool ok = write(fd, text, len + 1) == len + 1;
  close(fd);
  return ok;
}

void RestoreHandlers() {
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    if (g_installed[i]) sigaction(kSignals[i], &g_previous[i], nullptr);
    g_installed[i] = false;
  }
}

void GiveBackAndReraise(int sig) {
  if (g_added > 0) GiveBackNow(g_path, g_lock, g_added);
  g_added = 0;
  RestoreHandlers();
  raise(sig);
}

// Signals the process ignores keep being ignored.
void InstallHandlers() {
  struct sigaction action {};
  action.sa_handler = GiveBackAndReraise;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    sigaction(kSignals[i], nullptr, &g_previous[i]);
    g_installed[i] = g_previous[i].sa_handler != SIG_IGN;
    if (g_installed[i]) sigaction(kSignals[i], &action, nullptr);
  }
}

// Blocks the signals above for its scope.
class BlockSignals {
 public:
  BlockSignals() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : kSignals) sigaddset(&set, sig);
    sigprocmask(SIG_BLOCK, &set, &old_);
  }
  ~BlockSignals() { sigprocmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

// A small kernel file, in one read of at most 64 KiB (a character device
// may never end); false when it cannot be read or is empty.
bool ReadFile(const std::string& path, std::string* out) {
  out->assign(64 << 10, '\0');
  const int fd = open(path.c_str(), O_RDONLY);
  const ssize_t n = fd < 0 ? -1 : read(fd, out->data(), out->size());
  if (fd >= 0) close(fd);
  out->resize(n > 0 ? static_cast<size_t>(n) : 0);
  return n > 0;
}

// A "Name:   value" field of /proc/meminfo; -1 when absent.
int64_t MeminfoField(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + ":", 0) == 0) {
      return std::strtoll(line.c_str() + name.size() + 1, nullptr, 10);
    }
  }
  return -1;
}

// Sets vm.nr_hugepages to `value` and reads back what the kernel kept.
Result<uint64_t> SetHugePages(const std::string& path, uint64_t value) {
  const int fd = open(path.c_str(), O_WRONLY | O_TRUNC);
  const std::string text = std::to_string(value) + "\n";
  if (fd < 0 || write(fd, text.data(), text.size()) < 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    return Status::PermissionDenied(
        fmt::format("cannot set vm.nr_hugepages to {} ({}: {}; "
                    "needs root and a writable /proc/sys)",
                    value, path, why));
  }
  close(fd);
  std::string now;
  ReadFile(path, &now);
  return std::strtoull(now.c_str(), nullptr, 10);
}

}  // namespace

Result<HugePagePool> ReadHugePagePool(const HugePageFiles& files) {
  std::string meminfo;
  ReadFile(files.meminfo, &meminfo);
  const int64_t kib = MeminfoField(meminfo, "Hugepagesize");
  if (kib <= 0) {
    return Status::Unavailable(
        "this kernel has no huge page pool (no Hugepagesize in " +
        files.meminfo + ")");
  }
  const int64_t free_pages =
      MeminfoField(meminfo, "HugePages_Free") -
      std::max<int64_t>(0, MeminfoField(meminfo, "HugePages_Rsvd"));
  return HugePagePool{static_cast<uint64_t>(kib) * 1024,
                      static_cast<uint64_t>(std::max<int64_t>(0, free_pages))};
}

Result<std::unique_ptr<HugePageReservation>> HugePageReservation::Reserve(
    uint64_t pages, const HugePageFiles& files) {
  STRATA_ASSIGN_OR_RETURN(HugePagePool pool, ReadHugePagePool(files));
  std::unique_ptr<HugePageReservation> r(new HugePageReservation);
  r->files_ = files;
  r->pool_ = pool;
  for (const std::string* path : {&files.nr_hugepages, &files.lock}) {
    if (path->size() >= sizeof(g_path)) {
      return Status::InvalidArgument("path too long: " + *path);
    }
  }
  // Signals first: a handler that gives pages back takes the lock too.
  BlockSignals blocked;
  const PoolLock locked(files.lock.c_str());
  std::string text;
  if (!locked.held() || !ReadFile(files.nr_hugepages, &text)) {
    return Status::PermissionDenied(
        "cannot read " + (locked.held() ? files.nr_hugepages : files.lock));
  }
  r->before_ = std::strtoull(text.c_str(), nullptr, 10);
  const uint64_t want = r->before_ + pages;
  STRATA_ASSIGN_OR_RETURN(uint64_t got, SetHugePages(files.nr_hugepages, want));
  if (got < want) {
    // Back to where it was: got was read just now, so this is giving back
    // what the kernel kept of ours.
    Result<uint64_t> back = SetHugePages(files.nr_hugepages, r->before_);
    if (back.ok() && pool.free_pages >= pages) return r;
    return Status::Unavailable(
        fmt::format("the kernel gave {} of the {} huge pages asked "
                    "for (memory too fragmented?){}",
                    got - std::min(got, r->before_), pages,
                    back.ok() ? "" : "; and " + back.status().message()));
  }
  r->added_ = pages;
  std::snprintf(g_path, sizeof(g_path), "%s", files.nr_hugepages.c_str());
  std::snprintf(g_lock, sizeof(g_lock), "%s", files.lock.c_str());
  g_added = static_cast<sig_atomic_t>(r->added_);
  InstallHandlers();
  return r;
}

HugePageReservation::~HugePageReservation() {
  if (added_ == 0) return;
  BlockSignals blocked;
  // A signal whose handler returns (strata-nvme-bench's Ctrl-C) has given
  // the pages back already, and cleared g_added.
  const bool ok = g_added == 0 || GiveBackNow(files_.nr_hugepages.c_str(),
                                              files_.lock.c_str(), added_);
  g_added = 0;
  RestoreHandlers();
  if (!ok) {
    std::fprintf(stderr,
                 "strata-nvme-bench: warning: could not give back %llu huge "
                 "pages; run: %s\n",
                 static_cast<unsigned long long>(added_),
                 restore_command().c_str());
  }
}

uint64_t TransparentHugeBytes(const void* data, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = begin + bytes;
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  uint64_t overlap = 0, total = 0;
  while (std::getline(smaps, line)) {
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2) {
      overlap =
          std::min<uint64_t>(hi, end) > std::max<uint64_t>(lo, begin)
              ? std::min<uint64_t>(hi, end) - std::max<uint64_t>(lo, begin)
              : 0;
    } else if (overlap > 0 && line.rfind("AnonHugePages:", 0) == 0) {
      total += std::min<uint64_t>(
          overlap, std::strtoull(line.c_str() + 14, nullptr, 10) * 1024);
    }
  }
  return std::min<uint64_t>(total, bytes);
}

std::string HugePageReservation::restore_command() const {
  return fmt::format("echo $(( $(cat {0}) - {1} )) > {0}", files_.nr_hugepages,
                     added_);
}

}  // namespace strata::bench
