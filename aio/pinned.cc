// Pinned (locked) host buffers, allocated once and placed on a NUMA node.
#include <numa.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "aio/internal.h"

namespace strata::aio {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = size_t{2} << 20;

std::string LimitText(rlim_t limit) {
  return limit == RLIM_INFINITY ? "unlimited" : HumanBytes(uint64_t{limit});
}

Status LockError(int err, size_t bytes) {
  struct rlimit lim = {};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  std::string msg = "cannot lock " + HumanBytes(bytes) +
                    " of pinned memory: mlock failed with " + ErrnoText(err) +
                    "; the locked-memory limit (RLIMIT_MEMLOCK) is " +
                    LimitText(lim.rlim_cur) + " (hard " +
                    LimitText(lim.rlim_max) +
                    "). Fix: raise it (`ulimit -l unlimited`, memlock in "
                    "/etc/security/limits.conf, or LimitMEMLOCK=infinity for "
                    "a systemd unit), run with CAP_IPC_LOCK, or do not pin "
                    "(PinOptions::lock = false, strata-nvme-bench --no-pin)";
  return Status::ResourceExhausted(std::move(msg));
}

// libnuma fills some of its tables lazily and without locking; every call
// into it goes through this mutex. Allocation is not a hot path.
std::mutex numa_mu;

// The NUMA node to place memory on, or -1 when libnuma cannot tell.
int ChooseNode(int requested) {
  if (numa_available() < 0) return -1;
  if (requested >= 0) return requested;
  unsigned cpu = 0;
  unsigned node = 0;
  return getcpu(&cpu, &node) == 0 ? static_cast<int>(node) : -1;
}

}  // namespace

Result<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes,
                                            const PinOptions& options) {
  if (bytes == 0) {
    return Status::InvalidArgument("pinned buffer of 0 bytes requested");
  }
  std::unique_lock<std::mutex> numa_lock(numa_mu);
  const int node = ChooseNode(options.numa_node);
  if (options.numa_node >= 0 && node >= 0 && node > numa_max_node()) {
    return Status::InvalidArgument(
        "NUMA node " + std::to_string(options.numa_node) +
        " does not exist (highest is " + std::to_string(numa_max_node()) + ")");
  }
  const size_t size = (bytes + kPage - 1) / kPage * kPage;
  const size_t align = options.huge_pages ? kHugePage : kPage;
  // Over-map by the alignment and trim, so huge pages can back the range.
  const size_t mapped = size + align - kPage;
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    return internal::ErrnoStatus(
        errno, "cannot map " + HumanBytes(size) + " for a buffer");
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (base + align - 1) / align * align;
  if (start > base) munmap(raw, start - base);
  const size_t tail = base + mapped - (start + size);
  if (tail > 0) munmap(reinterpret_cast<void*>(start + size), tail);
  void* data = reinterpret_cast<void*>(start);

  if (options.huge_pages) madvise(data, size, MADV_HUGEPAGE);
  if (node >= 0) numa_tonode_memory(data, size, node);
  numa_lock.unlock();
  PinnedBuffer buf;
  buf.data_ = data;
  buf.size_ = size;
  buf.numa_node_ = node;
  if (options.lock) {
    if (mlock(data, size) != 0) return LockError(errno, size);
    buf.locked_ = true;
  } else {
    // Fault every page in now, on the chosen node, rather than on first I/O.
    std::memset(data, 0, size);
  }
  return buf;
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      locked_(std::exchange(other.locked_, false)),
      numa_node_(std::exchange(other.numa_node_, -1)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    PinnedBuffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    locked_ = std::exchange(other.locked_, false);
    numa_node_ = std::exchange(other.numa_node_, -1);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) munmap(data_, size_);
}

}  // namespace strata::aio
