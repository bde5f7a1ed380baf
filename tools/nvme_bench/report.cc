#include "tools/nvme_bench/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "common/text.h"

namespace strata::bench {
namespace {

// Within 2% of the best counts as "as fast"; below that, run-to-run noise
// on real drives decides.
constexpr double kNearBest = 0.98;

}  // namespace

size_t MedianIndex(const std::vector<double>& gbps) {
  std::vector<size_t> order(gbps.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return gbps[a] < gbps[b]; });
  return order[(order.size() - 1) / 2];
}

std::string TableHeader(bool with_fio) {
  std::string h = fmt::format(
      "{:<10}{:>6}{:>5}{:>4}  {:>8}{:>8}{:>10}  {:>9}{:>9}{:>9}  {:>6}{:>6}",
      "rw", "bs", "qd", "thr", "GB/s", "GiB/s", "IOPS", "p50 us", "p99 us",
      "p99.9 us", "usr%", "sys%");
  if (with_fio) h += fmt::format("  {:>8}{:>7}", "fio GB/s", "ratio");
  return h;
}

std::string TableRow(const Row& row) {
  const JobResult& r = row.strata;
  std::string line = fmt::format(
      "{:<10}{:>6}{:>5}{:>4}  {:>8.3f}{:>8.3f}{:>10.0f}  {:>9.0f}{:>9.0f}"
      "{:>9.0f}  {:>6.1f}{:>6.1f}",
      RwName(r.spec.rw), SizeText(r.spec.bs), r.spec.qd, r.spec.threads,
      r.gb_per_s(), r.gib_per_s(), r.iops(), r.lat_p50_us, r.lat_p99_us,
      r.lat_p999_us, r.usr_pct, r.sys_pct);
  if (row.fio) {
    line += fmt::format("  {:>8.3f}{:>7.3f}", row.fio->gb_per_s(),
                        row.ratio_vs_fio());
  }
  return line;
}

nlohmann::json RowJson(const Row& row) {
  const JobResult& r = row.strata;
  nlohmann::json j = {
      {"rw", RwName(r.spec.rw)},
      {"bs", r.spec.bs},
      {"qd", r.spec.qd},
      {"threads", r.spec.threads},
      {"direct", r.direct},
      {"backend", r.backend},
      {"bytes", r.bytes},
      {"seconds", r.seconds},
      {"gb_per_s", r.gb_per_s()},
      {"gib_per_s", r.gib_per_s()},
      {"iops", r.iops()},
      {"lat_us",
       {{"p50", r.lat_p50_us}, {"p99", r.lat_p99_us}, {"p999", r.lat_p999_us}}},
      {"cpu", {{"usr", r.usr_pct}, {"sys", r.sys_pct}}},
  };
  if (r.qd_requested != 0) j["qd_requested"] = r.qd_requested;
  if (row.fio) {
    j["fio_gb_per_s"] = row.fio->gb_per_s();
    j["ratio_vs_fio"] = row.ratio_vs_fio();
    j["fio_buffers"] = row.fio_buffers;
  }
  if (row.strata_gbps.size() > 1) {
    j["runs_gb_per_s"] = row.strata_gbps;
    if (row.fio) j["fio_runs_gb_per_s"] = row.fio_gbps;
  }
  return j;
}

std::string Recommend(const std::vector<Row>& rows) {
  std::map<Rw, std::vector<const JobResult*>> by_rw;
  for (const Row& row : rows) by_rw[row.strata.spec.rw].push_back(&row.strata);
  std::string out;
  for (const auto& [rw, runs] : by_rw) {
    double best = 0;
    for (const JobResult* r : runs) best = std::max(best, r->gb_per_s());
    const JobResult* pick = nullptr;
    for (const JobResult* r : runs) {
      if (r->gb_per_s() < best * kNearBest) continue;
      const auto key = [](const JobResult* x) {
        return std::make_pair(
            static_cast<uint64_t>(x->spec.qd) * x->spec.threads, x->spec.bs);
      };
      if (pick == nullptr || key(r) < key(pick)) pick = r;
    }
    const JobSpec& s = pick->spec;
    out += fmt::format(
        "recommended for {}: bs={} qd={} threads={} -> {:.3f} GB/s (best "
        "{:.3f})\n  aio config: {{\"backend\": \"{}\", \"rings\": {}, "
        "\"queue_depth\": {}, \"block_size\": {}}}\n",
        RwName(rw), SizeText(s.bs), s.qd, s.threads, pick->gb_per_s(), best,
        pick->backend, s.threads, s.qd, s.bs);
  }
  return out;
}

}  // namespace strata::bench
