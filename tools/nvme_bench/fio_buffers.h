// The I/O buffers fio gets for strata-nvme-bench --vs-fio.
//
// Note [Fair fio buffers]
// strata's I/O buffers are huge pages, so a 1 MiB request is one physically
// contiguous segment. fio's default buffers come from malloc on 4 KiB
// pages: 256 segments, more than many devices take in one request
// (virtio-blk's max_segments is 254), so the block layer splits every
// request, and fio looks up to 2x slower than the drive (docs/PERF.md). A
// ratio against that measures the buffers, not the engine. So by default
// fio gets huge pages too: --mem=mmaphuge, which maps its buffers with
// MAP_HUGETLB (no hugetlbfs mount needed), from huge pages reserved for the
// run. When too few are free, the run raises vm.nr_hugepages by the
// shortfall and puts the old value back when it ends, on an error, and on
// SIGINT, SIGTERM or SIGHUP. When it cannot (not root, /proc/sys read-only,
// memory too fragmented), fio runs on malloc buffers and the output says so,
// and that the ratio then overstates strata. --fio-buffers malloc asks for
// the unequal comparison on purpose; a --mem or --iomem in --fio-opt
// replaces this choice.
//
// How many pages: fio maps, per job, bs x iodepth bytes plus a page for
// O_DIRECT alignment, rounded up to the huge page; measured on fio 3.33 it
// needed 18 pages of 2 MiB for bs 1M qd 32 and 2 for 128K qd 4. The
// reservation takes bs x (qd + 1) rounded up plus two pages per job, for
// the largest job of the sweep (fio runs one job at a time).
//
// Thread safety: none; one FioBuffers per process (it owns the signal
// handlers while it holds a reservation).
#ifndef STRATA_TOOLS_NVME_BENCH_FIO_BUFFERS_H_
#define STRATA_TOOLS_NVME_BENCH_FIO_BUFFERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/status.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {

enum class FioBufferKind { kHugePages, kMalloc };

// "huge" or "malloc".
Result<FioBufferKind> ParseFioBufferKind(const std::string& name);

// Where the kernel's huge page pool is read and resized; tests point these
// at files of their own.
struct HugePageFiles {
  std::string meminfo = "/proc/meminfo";
  std::string nr_hugepages = "/proc/sys/vm/nr_hugepages";
};

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
  // Gives back the huge pages it reserved.
  ~FioBuffers();
  FioBuffers(const FioBuffers&) = delete;
  FioBuffers& operator=(const FioBuffers&) = delete;

  // Options for fio's command line (empty for malloc or --fio-opt's own).
  const std::vector<std::string>& options() const { return options_; }
  // "huge pages", "malloc" or "--fio-opt", for the JSON records.
  const std::string& kind() const { return kind_; }
  // One line for the report: which buffers fio has, and why.
  const std::string& description() const { return description_; }
  // True when fio's buffers are not what strata's are (huge pages, unless
  // strata ran with --no-huge-pages): the ratio then flatters one side.
  bool unequal(bool strata_huge_pages) const;

 private:
  FioBuffers() = default;
  // Reserves `pages` of `page_bytes` if fewer are free; the reason in
  // *why when it cannot.
  bool Reserve(uint64_t pages, uint64_t page_bytes, const HugePageFiles& files,
               std::string* why);

  std::vector<std::string> options_;
  std::string kind_;
  std::string description_;
  std::string nr_path_;    // set while vm.nr_hugepages is raised
  uint64_t old_nr_ = 0;    // its value before
  uint64_t reserved_ = 0;  // pages added
};

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_FIO_BUFFERS_H_
