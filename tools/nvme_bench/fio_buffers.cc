#include "tools/nvme_bench/fio_buffers.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/text.h"

namespace strata::bench {
namespace {

constexpr uint64_t kSlackBytes = 4u << 20;  // per job, over bs x (qd + 1)

std::string HugeDescription(const HugePageReservation& r, uint64_t pages) {
  const std::string page = HumanBytes(r.pool().page_bytes);
  if (r.added() == 0) {
    return fmt::format(
        "fio: buffers on {} huge pages (--mem=mmaphuge), as strata's; {} "
        "of\n  the {} free huge pages, none reserved (the kernel gave no "
        "more)",
        page, pages, r.pool().free_pages);
  }
  return fmt::format(
      "fio: buffers on {} huge pages (--mem=mmaphuge), as strata's; {} "
      "reserved\n  for this run (vm.nr_hugepages {} -> {}), given back at its "
      "end\n  (after a kill -9: {})",
      page, r.added(), r.before(), r.before() + r.added(), r.restore_command());
}

}  // namespace

Result<FioBufferKind> ParseFioBufferKind(const std::string& name) {
  if (name == "huge") return FioBufferKind::kHugePages;
  if (name == "malloc") return FioBufferKind::kMalloc;
  return Status::InvalidArgument("--fio-buffers: '" + name +
                                 "' is not one of huge, malloc");
}

uint64_t FioHugePagesNeeded(const std::vector<JobSpec>& specs,
                            uint64_t page_bytes) {
  uint64_t most = 0;
  for (const JobSpec& s : specs) {
    const uint64_t per_job =
        (s.bs * (s.qd + 1ull) + kSlackBytes + page_bytes - 1) / page_bytes;
    most = std::max(most, per_job * s.threads);
  }
  return most;
}

bool FioOptsChooseBuffers(const std::vector<std::string>& fio_opts) {
  return std::any_of(fio_opts.begin(), fio_opts.end(), [](const auto& o) {
    return o == "--mem" || o == "--iomem" || o.rfind("--mem=", 0) == 0 ||
           o.rfind("--iomem=", 0) == 0;
  });
}

std::unique_ptr<FioBuffers> FioBuffers::Prepare(
    FioBufferKind wanted, const std::vector<JobSpec>& specs,
    const std::vector<std::string>& fio_opts, const HugePageFiles& files) {
  std::unique_ptr<FioBuffers> b(new FioBuffers);
  if (FioOptsChooseBuffers(fio_opts)) {
    b->kind_ = "--fio-opt";
    b->description_ = "fio: buffers as --fio-opt chose them";
    return b;
  }
  b->kind_ = "malloc";
  b->description_ =
      "fio: buffers from malloc on 4 KiB pages, fio's default "
      "(--fio-buffers malloc)";
  if (wanted == FioBufferKind::kMalloc) return b;
  Result<HugePagePool> pool = ReadHugePagePool(files);
  const uint64_t pages =
      pool.ok() ? FioHugePagesNeeded(specs, pool->page_bytes) : 0;
  auto reservation =
      pool.ok() ? HugePageReservation::Reserve(pages, files)
                : Result<std::unique_ptr<HugePageReservation>>(pool.status());
  if (!reservation.ok()) {
    b->fell_back_ = true;
    b->description_ =
        "fio: buffers from malloc on 4 KiB pages: huge pages could not be "
        "had (" +
        reservation.status().message() + ")";
    return b;
  }
  b->reservation_ = std::move(*reservation);
  b->kind_ = "huge pages";
  b->options_ = {
      "--mem=mmaphuge",
      "--hugepage-size=" + std::to_string(b->reservation_->pool().page_bytes)};
  b->description_ = HugeDescription(*b->reservation_, pages);
  return b;
}

std::string FioBuffers::Mismatch(bool strata_asked, bool strata_huge) const {
  if (kind_ == "--fio-opt" || (kind_ == "huge pages") == strata_huge) {
    return "";
  }
  const char* fix =
      fell_back_ ? "run as root with memory free for huge pages, or give both "
                   "4 KiB pages with --no-huge-pages"
      : !strata_asked ? "--fio-buffers malloc gives both the same"
      : strata_huge   ? "--fio-buffers huge gives both the same"
                      : "strata's transparent huge pages could not be had "
                        "(THP off or memory fragmented): --no-huge-pages "
                        "gives both 4 KiB pages";
  return fmt::format(
      "note: fio's buffers ({}) are not strata's ({}), so the ratio {} "
      "strata; {} (docs/PERF.md)",
      kind_, strata_huge ? "huge pages" : "4 KiB pages",
      strata_huge ? "overstates" : "understates", fix);
}

}  // namespace strata::bench
