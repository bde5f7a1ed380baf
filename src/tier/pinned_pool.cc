// The pinned host tier. The contract is in pinned_pool.h; this file explains
// how the slab is obtained, placed, faulted in and locked.
#include "src/tier/pinned_pool.h"

#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/text.h"
#include "src/tier/device.h"
#include "src/tier/range_allocator.h"

namespace strata::tier {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kHugePage = uint64_t{2} << 20;
constexpr uint64_t kMaxClassedRequest = uint64_t{1} << 62;
constexpr char kTier[] = "pinned host tier";

uint64_t RoundUp(uint64_t bytes, uint64_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

enum class Backing { kDevice, kHugeTlb, kThp, kPlain };

struct Slab {
  void* base = nullptr;
  uint64_t mapped = 0;  // bytes mapped; >= the pool's capacity
  Backing backing = Backing::kPlain;
  HostAllocator* allocator = nullptr;  // for kDevice
};

const char* BackingName(const Slab& slab) {
  switch (slab.backing) {
    case Backing::kDevice:
      return slab.allocator->name();
    case Backing::kHugeTlb:
      return "mmap+hugetlb";
    case Backing::kThp:
      return "mmap+thp";
    case Backing::kPlain:
      return "mmap";
  }
  return "mmap";
}

void ReleaseSlab(const Slab& slab) {
  if (slab.backing == Backing::kDevice) {
    slab.allocator->Free(slab.base);
  } else {
    munmap(slab.base, slab.mapped);
  }
}

// libnuma fills some of its tables lazily and without locking, so every
// call into it from this file holds this mutex. Creating a pool is rare.
std::mutex numa_mu;

// The node to place the slab on, or -1 when libnuma cannot tell.
Result<int> ChooseNode(const PinnedPoolOptions& options) {
  std::lock_guard<std::mutex> lock(numa_mu);
  if (numa_available() < 0) return -1;
  const int max_node = numa_max_node();
  if (options.numa_node > max_node) {
    return Status::InvalidArgument(
        std::string(kTier) + ": NUMA node " +
        std::to_string(options.numa_node) + " does not exist (the highest is " +
        std::to_string(max_node) + "); pick another node");
  }
  if (options.numa_node >= 0) return options.numa_node;
  if (options.gpu_numa_node >= 0 && options.gpu_numa_node <= max_node) {
    return options.gpu_numa_node;
  }
  unsigned cpu = 0;
  unsigned node = 0;
  return getcpu(&cpu, &node) == 0 ? static_cast<int>(node) : -1;
}

// Binds the slab's pages, none of which is faulted in yet, to `node`.
void PlaceOnNode(const Slab& slab, int node) {
  if (node < 0) return;
  std::lock_guard<std::mutex> lock(numa_mu);
  numa_tonode_memory(slab.base, slab.mapped, node);
}

// The node that actually holds the slab's first page; `placed` when the
// kernel will not say.
int NodeOfSlab(const Slab& slab, int placed) {
  std::lock_guard<std::mutex> lock(numa_mu);
  if (numa_available() < 0) return -1;
  void* page = slab.base;
  int status = -1;
  if (numa_move_pages(0, 1, &page, nullptr, &status, 0) == 0 && status >= 0) {
    return status;
  }
  return placed;
}

// Note [Prefault]
// Every page is faulted in at creation, so the first transfer into a chunk
// does not pay a page fault per 4 KiB (or a huge-page clear) on the
// critical path. MADV_POPULATE_WRITE (Linux 5.14) does it in one call and,
// unlike touching the pages, reports a shortage as an error instead of
// SIGBUS: explicit huge pages can be reserved yet missing on the bound
// node. Older kernels reject the advice with EINVAL and get the pages
// touched one by one.
bool Prefault(const Slab& slab) {
  if (madvise(slab.base, slab.mapped, MADV_POPULATE_WRITE) == 0) return true;
  if (errno != EINVAL) return false;
  volatile char* p = static_cast<char*>(slab.base);
  for (uint64_t at = 0; at < slab.mapped; at += kPage) p[at] = 0;
  return true;
}

// Note [Device host memory]
// A device's host allocator (cudaHostAlloc) pins the pages before it
// returns, so numa_tonode_memory afterwards would not move them. Instead
// the calling thread prefers `node` for the duration of the call and then
// gets its previous policy back. NodeOfSlab() reports where the pages
// landed. The allocator faults the pages in itself.
std::optional<Slab> AllocFromDevice(HostAllocator* allocator, uint64_t bytes,
                                    int node) {
  std::unique_lock<std::mutex> lock(numa_mu);
  const unsigned long max_nodes = numa_num_possible_nodes();
  std::vector<unsigned long> old_mask(max_nodes / (8 * sizeof(long)) + 1);
  int old_mode = 0;
  const bool restore = node >= 0 && get_mempolicy(&old_mode, old_mask.data(),
                                                  max_nodes, nullptr, 0) == 0;
  if (restore) numa_set_preferred(node);
  void* data = allocator->Allocate(bytes);
  if (restore) set_mempolicy(old_mode, old_mask.data(), max_nodes);
  if (data == nullptr) return std::nullopt;
  return Slab{data, bytes, Backing::kDevice, allocator};
}

bool ThpAvailable() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  return std::getline(in, modes) && modes.find("[never]") == std::string::npos;
}

// Explicit huge pages, placed and faulted in, or nothing when the system
// has none reserved (the common case) or they run short on the node.
std::optional<Slab> MapHugeTlb(uint64_t bytes, int node) {
  const uint64_t size = RoundUp(bytes, kHugePage);
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
  if (data == MAP_FAILED) return std::nullopt;
  const Slab slab{data, size, Backing::kHugeTlb};
  PlaceOnNode(slab, node);
  if (!Prefault(slab)) {  // a shortage, not a SIGBUS: Note [Prefault]
    ReleaseSlab(slab);
    return std::nullopt;
  }
  return slab;
}

// Ordinary anonymous memory, 2 MiB-aligned for transparent huge pages when
// `thp`: over-map by the alignment and trim both ends.
Result<Slab> MapPages(uint64_t bytes, bool thp) {
  const uint64_t align = thp ? kHugePage : kPage;
  const uint64_t size = RoundUp(bytes, align);
  const uint64_t over = size + align - kPage;
  void* raw = mmap(nullptr, over, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    return aio::ErrnoStatus(errno, std::string(kTier) + ": cannot map " +
                                       HumanBytes(size) + " of host memory");
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = RoundUp(base, align);
  if (start > base) munmap(raw, start - base);
  if (base + over > start + size) {
    munmap(reinterpret_cast<void*>(start + size), base + over - start - size);
  }
  const Slab slab{reinterpret_cast<void*>(start), size,
                  thp ? Backing::kThp : Backing::kPlain};
  if (thp) madvise(slab.base, slab.mapped, MADV_HUGEPAGE);
  return slab;
}

// The slab, from the best source that works (see pinned_pool.h), placed on
// `node` and faulted in.
Result<Slab> ObtainSlab(const PinnedPoolOptions& options, uint64_t bytes,
                        int node) {
  if (options.host_allocator != nullptr && options.lock != LockMode::kOff) {
    // Note [Device host memory]
    if (auto slab = AllocFromDevice(options.host_allocator, bytes, node)) {
      return *slab;
    }
  }
  if (options.huge_pages) {
    if (auto slab = MapHugeTlb(bytes, node)) return *slab;
  }
  Result<Slab> slab = MapPages(bytes, options.huge_pages && ThpAvailable());
  if (!slab.ok()) return slab;
  PlaceOnNode(*slab, node);
  if (!Prefault(*slab)) {  // Note [Prefault]
    const int err = errno;
    ReleaseSlab(*slab);
    return aio::ErrnoStatus(err, std::string(kTier) + ": cannot fault in " +
                                     HumanBytes(slab->mapped) +
                                     " of host memory");
  }
  return slab;
}

std::string LimitText(rlim_t limit) {
  return limit == RLIM_INFINITY ? "unlimited" : HumanBytes(uint64_t{limit});
}

// What went wrong with mlock, with the limit that caused it.
std::string MemlockProblem(int err, uint64_t bytes) {
  rlimit lim = {};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  return std::string(kTier) + ": cannot lock " + HumanBytes(bytes) +
         " of host memory (mlock: " + ErrnoText(err) + "); RLIMIT_MEMLOCK is " +
         LimitText(lim.rlim_cur) + " (hard " + LimitText(lim.rlim_max) + ")";
}

constexpr char kMemlockFix[] =
    ". Fix: raise it (`ulimit -l unlimited`, memlock in "
    "/etc/security/limits.conf, or LimitMEMLOCK=infinity for a systemd "
    "unit), run with CAP_IPC_LOCK, or do without locking (lock=off)";

// Whether the slab ended up locked, or kRequired's error.
Result<bool> LockSlab(const Slab& slab, LockMode mode) {
  if (slab.backing == Backing::kDevice) return true;  // pinned by its driver
  if (mode == LockMode::kOff) return false;
  if (mlock(slab.base, slab.mapped) == 0) return true;
  const std::string problem = MemlockProblem(errno, slab.mapped);
  munlock(slab.base, slab.mapped);  // a failed mlock may lock a part
  if (mode == LockMode::kRequired) {
    return Status::ResourceExhausted(problem + kMemlockFix);
  }
  static std::once_flag warned;
  std::call_once(warned, [&] {
    std::fprintf(stderr,
                 "strata: %s; running unlocked, so its pages may be swapped "
                 "out and transfers are slower%s\n",
                 problem.c_str(), kMemlockFix);
  });
  return false;
}

}  // namespace

class PinnedPool::Impl {
 public:
  Impl(const Slab& slab, uint64_t capacity)
      : slab_(slab), capacity_(capacity), ranges_(capacity, kPage) {}
  ~Impl() {
    // An aio request still using pool memory is the caller's bug: the
    // kernel would write into freed memory.
    if (engine_ != nullptr) {
      const Status unregistered = engine_->UnregisterBuffer(base());
      STRATA_CHECK(unregistered.ok());
    }
    ReleaseSlab(slab_);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  char* base() const { return static_cast<char*>(slab_.base); }
  // Called with mu_ held. `size_class` is 0 when the request is larger than
  // the whole budget.
  Status Exhausted(uint64_t bytes, uint64_t size_class) const;

  const Slab slab_;
  const uint64_t capacity_;
  PinnedPoolInfo info_;
  aio::Engine* engine_ = nullptr;  // set once registered

  mutable std::mutex mu_;
  RangeAllocator ranges_;  // guarded by mu_
  PinnedPoolStats stats_;  // guarded by mu_
};

Status PinnedPool::Impl::Exhausted(uint64_t bytes, uint64_t size_class) const {
  const std::string cls = size_class == 0
                              ? "more than the whole budget"
                              : "size class " + HumanBytes(size_class);
  return Status::ResourceExhausted(
      std::string(kTier) + ": cannot allocate " + HumanBytes(bytes) + " (" +
      cls + "): " + HumanBytes(ranges_.free_bytes()) + " free of budget " +
      HumanBytes(capacity_) + ", largest free range " +
      HumanBytes(ranges_.largest_free()) +
      "; raise the host budget (--host-budget) or lower the chunk size "
      "or the prefetch window so fewer chunks are pinned at once");
}

PinnedPool::PinnedPool(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PinnedPool::~PinnedPool() = default;

Result<std::unique_ptr<PinnedPool>> PinnedPool::Create(
    const PinnedPoolOptions& options, aio::Engine* engine) {
  if (options.budget == 0) {
    return Status::InvalidArgument(
        std::string(kTier) +
        ": the budget is 0 bytes; give the host tier a budget "
        "(--host-budget)");
  }
  STRATA_ASSIGN_OR_RETURN(int node, ChooseNode(options));
  const uint64_t capacity = RoundUp(options.budget, kPage);
  STRATA_ASSIGN_OR_RETURN(Slab slab, ObtainSlab(options, capacity, node));
  // From here on `impl` owns the slab and releases it on every error path.
  auto impl = std::make_unique<Impl>(slab, capacity);
  STRATA_ASSIGN_OR_RETURN(bool locked, LockSlab(slab, options.lock));
  PinnedPoolInfo& info = impl->info_;
  info.backing = BackingName(slab);
  info.locked = locked;
  info.numa_node = NodeOfSlab(slab, node);
  info.budget = capacity;
  if (engine != nullptr) {
    const Status registered = engine->RegisterBuffer(slab.base, capacity);
    if (!registered.ok()) {
      return Status(
          registered.code(),
          std::string(kTier) +
              ": cannot register its slab with aio: " + registered.message());
    }
    impl->engine_ = engine;
    info.registered = true;
  }
  return std::unique_ptr<PinnedPool>(new PinnedPool(std::move(impl)));
}

// Note [Size classes]
// A class is the request rounded up to a quarter of the power of two below
// it, so a class wastes less than a quarter of the request and there are
// four classes per power of two (20K, 24K, 28K, 32K, 40K, ...). Below
// 16 KiB a quarter is less than a page, and allocations are whole pages
// (they are handed to O_DIRECT I/O), so the step there is one page:
// 4K, 8K, 12K, 16K. Few distinct classes mean a freed chunk fits the next
// chunk of a similar size, which keeps the slab from shattering.
uint64_t PinnedPool::SizeClass(uint64_t bytes) {
  STRATA_CHECK(bytes <= kMaxClassedRequest);
  if (bytes <= kPage) return kPage;
  const uint64_t below = std::bit_floor(bytes - 1);  // bytes in (below, 2x]
  return RoundUp(bytes, std::max(below / 4, kPage));
}

Result<void*> PinnedPool::Allocate(uint64_t bytes) {
  Impl& pool = *impl_;
  std::lock_guard<std::mutex> lock(pool.mu_);
  // Note [Size classes]
  const uint64_t size_class = bytes <= pool.capacity_ ? SizeClass(bytes) : 0;
  std::optional<uint64_t> offset;
  if (size_class != 0) offset = pool.ranges_.Allocate(size_class);
  if (!offset) return pool.Exhausted(bytes, size_class);
  PinnedPoolStats& stats = pool.stats_;
  stats.current += size_class;
  stats.peak = std::max(stats.peak, stats.current);
  stats.allocated += size_class;
  ++stats.allocations;
  return static_cast<void*>(pool.base() + *offset);
}

void PinnedPool::Free(void* ptr) {
  Impl& pool = *impl_;
  STRATA_CHECK(Contains(ptr, 1));
  const uint64_t offset = static_cast<char*>(ptr) - pool.base();
  std::lock_guard<std::mutex> lock(pool.mu_);
  const uint64_t size =
      pool.ranges_.SizeOf(offset);  // aborts if not handed out
  pool.ranges_.Free(offset);
  PinnedPoolStats& stats = pool.stats_;
  stats.current -= size;
  stats.freed += size;
  ++stats.frees;
}

bool PinnedPool::Contains(const void* ptr, uint64_t bytes) const {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t base = reinterpret_cast<uintptr_t>(impl_->base());
  const uint64_t capacity = impl_->capacity_;
  return p >= base && bytes <= capacity && p - base <= capacity - bytes;
}

const PinnedPoolInfo& PinnedPool::info() const { return impl_->info_; }

PinnedPoolStats PinnedPool::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  return impl_->stats_;
}

uint64_t PinnedPool::free_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  return impl_->ranges_.free_bytes();
}

}  // namespace strata::tier
