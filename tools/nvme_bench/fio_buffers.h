// The I/O buffers fio gets for strata-nvme-bench --vs-fio.
//
// Note [Fair fio buffers]
// strata's I/O buffers are huge pages, so a 1 MiB request is one physically
// contiguous segment. fio's default buffers come from malloc on 4 KiB
// pages: 256 segments, more than many devices take in one request
// (virtio-blk's max_segments is 254), and per-page work on every request
// besides; fio then looks 4 to 7 times slower than the drive (docs/PERF.md).
// A ratio against that measures the buffers, not the engine. So by default
// fio gets huge pages too: --mem=mmaphuge, which maps its buffers with
// MAP_HUGETLB (no hugetlbfs mount needed), from huge pages reserved for
// the run (HugePageReservation: its own pages added to the pool, whatever
// is free, so that runs side by side do not take each other's; given back
// at the end, on an error and on the signals a process can catch). When
// they cannot be had (not root, /proc/sys read-only, memory too
// fragmented), fio runs on malloc buffers and the output says so, and that
// the ratio then overstates strata. --fio-buffers malloc asks for the
// unequal comparison on purpose; a --mem or --iomem in --fio-opt replaces
// this choice. Whether strata's own buffers really are huge pages (they
// are transparent huge pages, best effort) is read from /proc/self/smaps,
// not assumed.
//
// How many pages: fio maps, per job, bs x iodepth bytes plus a page for
// O_DIRECT alignment, rounded up to the huge page; measured on fio 3.33 it
// needed 18 pages of 2 MiB for bs 1M qd 32 and 2 for 128K qd 4. The
// reservation takes bs x (qd + 1) + 4 MiB per job, rounded up to whole
// pages, for the largest job of the sweep (fio runs one job at a time).
//
// Thread safety: none; one FioBuffers per process.
#ifndef STRATA_TOOLS_NVME_BENCH_FIO_BUFFERS_H_
#define STRATA_TOOLS_NVME_BENCH_FIO_BUFFERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/status.h"
#include "tools/nvme_bench/huge_pages.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {

enum class FioBufferKind { kHugePages, kMalloc };

// "huge" or "malloc".
Result<FioBufferKind> ParseFioBufferKind(const std::string& name);

// Huge pages of `page_bytes` that fio needs for the largest job of `specs`.
uint64_t FioHugePagesNeeded(const std::vector<JobSpec>& specs,
                            uint64_t page_bytes);

// True when `fio_opts` choose fio's buffers themselves (--mem, --iomem).
bool FioOptsChooseBuffers(const std::vector<std::string>& fio_opts);

class FioBuffers {
 public:
  // Arranges `wanted` buffers for fio's runs of `specs`; never fails: when
  // huge pages cannot be had, the result is malloc buffers with the reason.
  static std::unique_ptr<FioBuffers> Prepare(
      FioBufferKind wanted, const std::vector<JobSpec>& specs,
      const std::vector<std::string>& fio_opts,
      const HugePageFiles& files = {});

  // Options for fio's command line (empty for malloc or --fio-opt's own).
  const std::vector<std::string>& options() const { return options_; }
  // "huge pages", "malloc" or "--fio-opt", for the JSON records.
  const std::string& kind() const { return kind_; }
  // One line for the report: which buffers fio has, and why.
  const std::string& description() const { return description_; }
  // A line to print after the table when fio's buffers are not what
  // strata's are, so that the ratio flatters one side, with the fix; empty
  // when they match or --fio-opt chose. `strata_asked`: strata ran without
  // --no-huge-pages; `strata_huge`: its buffers really are huge pages.
  std::string Mismatch(bool strata_asked, bool strata_huge) const;

 private:
  FioBuffers() = default;

  // Fixed after Prepare().
  std::vector<std::string> options_;
  std::string kind_;
  std::string description_;
  bool fell_back_ = false;  // huge pages were wanted but could not be had
  std::unique_ptr<HugePageReservation> reservation_;
};

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_FIO_BUFFERS_H_
