// Huge pages for strata-nvme-bench: a reservation in the kernel's pool that
// is given back on every way out a process can act on, and how much of a
// buffer transparent huge pages really back.
//
// Reserve() makes `pages` huge pages available by raising vm.nr_hugepages
// by `pages`, even when that many are free: free pages may be another
// run's, counted but not yet mapped (two runs that each found 18 free once
// left one fio without buffers). Giving back lowers vm.nr_hugepages by what
// this reservation added, from the value it has then, so two processes that
// reserve at once each give back their own share; both hold an flock() on
// HugePageFiles::lock around their read and write of the pool, so that
// neither overwrites the other's change. Only when the kernel keeps fewer
// pages than asked (memory too fragmented) and `pages` are free does a
// reservation use the free ones, adding none. It happens on destruction and,
// through signal handlers, on SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE,
// SIGABRT, SIGSEGV and SIGBUS, after which the signal takes its course (the
// handler installed before, if any, runs; the destructor then gives back
// nothing more); a signal the process ignores stays ignored. SIGKILL and the
// OOM killer cannot be caught: the reservation's restore_command() is what
// gives the pages back by hand.
//
// Usage:
//   Result<HugePagePool> pool = ReadHugePagePool();
//   auto r = HugePageReservation::Reserve(pages);  // r->added() new pages
//   ... map MAP_HUGETLB memory, or let fio do it ...
//   r->reset();                                    // or leave the scope
//
// Thread safety: one reservation at a time in a process (the handlers are
// the process's); Reserve() and the destructor block the signals above
// while they change the pool and the handlers.
//
// Failure: Reserve() returns kUnavailable when the kernel has no huge page
// pool or gives fewer pages than asked (memory too fragmented), and
// kPermissionDenied when vm.nr_hugepages cannot be read or written (not
// root, /proc/sys read-only), each with the reason; the pool is then as it
// was.
#ifndef STRATA_TOOLS_NVME_BENCH_HUGE_PAGES_H_
#define STRATA_TOOLS_NVME_BENCH_HUGE_PAGES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "strata/status.h"

namespace strata::bench {

// Where the pool is read and resized; tests point these at files of their
// own.
struct HugePageFiles {
  std::string meminfo = "/proc/meminfo";
  std::string nr_hugepages = "/proc/sys/vm/nr_hugepages";
  // flock()ed while the pool changes; created if missing (not in /proc).
  std::string lock = "/proc/sys/vm/nr_hugepages";
};

struct HugePagePool {
  uint64_t page_bytes = 0;  // Hugepagesize
  uint64_t free_pages = 0;  // HugePages_Free less HugePages_Rsvd
};

// kUnavailable when the kernel has no huge page pool.
Result<HugePagePool> ReadHugePagePool(const HugePageFiles& files = {});

class HugePageReservation {
 public:
  static Result<std::unique_ptr<HugePageReservation>> Reserve(
      uint64_t pages, const HugePageFiles& files = {});
  ~HugePageReservation();  // gives back what it added
  HugePageReservation(const HugePageReservation&) = delete;
  HugePageReservation& operator=(const HugePageReservation&) = delete;

  uint64_t added() const { return added_; }    // 0: the pages were free
  uint64_t before() const { return before_; }  // vm.nr_hugepages before
  const HugePagePool& pool() const { return pool_; }
  // The shell command that gives the pages back by hand.
  std::string restore_command() const;

 private:
  HugePageReservation() = default;

  // Fixed after Reserve().
  HugePageFiles files_;
  HugePagePool pool_;
  uint64_t added_ = 0;
  uint64_t before_ = 0;
};

// Bytes of [data, data + bytes) that transparent huge pages back now
// (AnonHugePages of the process's mappings over that range); 0 when it
// cannot be read.
uint64_t TransparentHugeBytes(const void* data, size_t bytes);

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_HUGE_PAGES_H_
