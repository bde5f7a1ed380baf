#include "tools/nvme_bench/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "common/text.h"

namespace strata::bench {
namespace {

// Runs of one configuration count as level with another's when their
// ranges, each widened by 2%, overlap: below that, run-to-run noise on real
// drives decides.
constexpr double kNoise = 0.02;

// The device's requests may differ from the application's by this much
// before the table says so (requests still in flight at either reading).
constexpr double kDeviceTolerance = 0.05;

// The job's columns, then a run's.
constexpr char kJob[] = "{:<9}{:>5}{:>5}{:>4}";
constexpr char kRun[] = "  {:<7}{:>7}{:>9}{:>8}{:>8}{:>9}{:>6}{:>11}{:>8}";
constexpr int kJobWidth = 23;

double DeviceIops(const JobResult& r) {
  return r.seconds > 0 ? r.device->requests / r.seconds : 0;
}

// The columns after the job's: what one run did, and what its disk saw.
std::string RunColumns(const std::string& who, const JobResult& r) {
  std::string dev_iops = "-", dev_kib = "-";
  if (r.device) {
    dev_iops =
        fmt::format("{:.0f}{}", DeviceIops(r), DeviceDiffers(r) ? "*" : " ");
    dev_kib = fmt::format("{:.1f}", r.device->mean_request_bytes() / 1024);
  }
  return fmt::format(
      kRun, who, fmt::format("{:.3f}", r.gb_per_s()),
      fmt::format("{:.0f}", r.iops()), fmt::format("{:.0f}", r.lat.p50),
      fmt::format("{:.0f}", r.lat.p99), fmt::format("{:.0f}", r.lat.p999),
      fmt::format("{:.1f}", r.usr_pct + r.sys_pct), dev_iops, dev_kib);
}

double PerSecond(double count, double seconds) {
  return seconds > 0 ? count / seconds : 0;
}

// A mixed run's line for one direction, under the run's: CPU and the
// device's figures are the run's, not split.
std::string DirectionColumns(const std::string& who, const DirectionResult& d,
                             double seconds) {
  // A direction with no request has no latency (--rwmixread 0 or 100).
  const auto lat = [&](double us) {
    return d.ios > 0 ? fmt::format("{:.0f}", us) : std::string("-");
  };
  return fmt::format(
      kRun, who, fmt::format("{:.3f}", PerSecond(d.bytes / 1e9, seconds)),
      fmt::format("{:.0f}", PerSecond(d.ios, seconds)), lat(d.lat.p50),
      lat(d.lat.p99), lat(d.lat.p999), "-", "-", "-");
}

// A run's line and, for a mixed job, a line per direction under it.
std::string RunLines(const std::string& who, const JobResult& r) {
  std::string out = RunColumns(who, r);
  if (!IsMixed(r.spec.rw)) return out;
  const std::string indent(kJobWidth, ' ');
  out += "\n" + indent + DirectionColumns("  read", r.read, r.seconds);
  out += "\n" + indent + DirectionColumns("  write", r.write, r.seconds);
  return out;
}

// The slowest and fastest of `runs`; the median run's GB/s when there are
// none.
std::pair<double, double> Range(const std::vector<double>& runs,
                                const JobResult& median) {
  if (runs.empty()) return {median.gb_per_s(), median.gb_per_s()};
  const auto [lo, hi] = std::minmax_element(runs.begin(), runs.end());
  return {*lo, *hi};
}

nlohmann::json LatencyJson(const LatencyUs& lat) {
  return {{"min", lat.min}, {"mean", lat.mean}, {"p50", lat.p50},
          {"p99", lat.p99}, {"p999", lat.p999}, {"p9999", lat.p9999},
          {"max", lat.max}};
}

nlohmann::json DirectionJson(const DirectionResult& d, double seconds) {
  return {{"bytes", d.bytes},
          {"iops", PerSecond(d.ios, seconds)},
          {"gb_per_s", PerSecond(d.bytes / 1e9, seconds)},
          {"lat_us", d.ios > 0 ? LatencyJson(d.lat) : nlohmann::json()}};
}

nlohmann::json ResultJson(const JobResult& r, const std::string& disk) {
  nlohmann::json j = {
      {"bytes", r.bytes},
      {"seconds", r.seconds},
      {"gb_per_s", r.gb_per_s()},
      {"gib_per_s", r.gib_per_s()},
      {"iops", r.iops()},
      {"syncs", r.syncs},
      {"lat_us", LatencyJson(r.lat)},
      {"cpu", {{"usr", r.usr_pct}, {"sys", r.sys_pct}}},
  };
  if (IsMixed(r.spec.rw)) {
    j["read"] = DirectionJson(r.read, r.seconds);
    j["write"] = DirectionJson(r.write, r.seconds);
    j["read_share"] = r.read_share();
  }
  if (r.device) {
    j["device"] = {{"disk", disk},
                   {"requests", r.device->requests},
                   {"merges", r.device->merges},
                   {"bytes", r.device->bytes},
                   {"iops", DeviceIops(r)},
                   {"mean_request_bytes", r.device->mean_request_bytes()}};
  }
  return j;
}

// A striped job's line under its rows: each file's share of the bytes.
std::string FilesLine(const JobResult& r) {
  if (r.files.size() < 2) return "";
  std::string out = "\n" + std::string(kJobWidth, ' ') + "  files:";
  for (size_t i = 0; i < r.files.size(); ++i) {
    const double share = r.bytes > 0 ? 100.0 * r.files[i].bytes / r.bytes : 0;
    out += fmt::format(" {} {:.1f}%", i + 1, share);
  }
  return out + " of the bytes";
}

nlohmann::json FilesJson(const Row& row) {
  nlohmann::json files = nlohmann::json::array();
  for (size_t i = 0; i < row.strata.files.size(); ++i) {
    const FileResult& f = row.strata.files[i];
    files.push_back({{"path", i < row.paths.size() ? row.paths[i] : ""},
                     {"bytes", f.bytes},
                     {"ios", f.ios}});
  }
  return files;
}

}  // namespace

size_t MedianIndex(const std::vector<double>& gbps) {
  std::vector<size_t> order(gbps.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return gbps[a] < gbps[b]; });
  return order[(order.size() - 1) / 2];
}

bool DeviceDiffers(const JobResult& r) {
  if (!r.device || r.ios == 0) return false;
  const double seen = static_cast<double>(r.device->requests);
  return std::fabs(seen - r.ios) > kDeviceTolerance * r.ios;
}

std::string TableHeader() {
  return fmt::format(kJob, "rw", "bs", "qd", "thr") +
         fmt::format(kRun, "run", "GB/s", "IOPS", "p50 us", "p99 us",
                     "p99.9 us", "CPU%", "dev IOPS", "dev KiB");
}

std::string TableRow(const Row& row) {
  const JobSpec& s = row.strata.spec;
  std::string out =
      fmt::format(kJob, RwName(s.rw), SizeText(s.bs), s.qd, s.threads) +
      RunLines("strata", row.strata) + FilesLine(row.strata);
  if (!row.fio) return out;
  const std::string indent(kJobWidth, ' ');
  out += "\n" + indent + RunLines("fio", *row.fio);
  const auto [slo, shi] = Range(row.strata_gbps, row.strata);
  const auto [flo, fhi] = Range(row.fio_gbps, *row.fio);
  out += fmt::format(
      "\n{}  strata/fio {:.3f}; GB/s of {} runs each: strata {:.3f}-{:.3f}, "
      "fio {:.3f}-{:.3f}",
      indent, row.strata_over_fio(), row.strata_gbps.size(), slo, shi, flo,
      fhi);
  return out;
}

std::string TableNotes(const std::vector<Row>& rows) {
  std::string disk;
  for (const Row& row : rows) {
    if (DeviceDiffers(row.strata) || (row.fio && DeviceDiffers(*row.fio))) {
      disk = row.disk;
      break;
    }
  }
  if (disk.empty()) return "";
  // A striped job's disks, "vda+vdb", read as /sys/block/{vda,vdb}/stat.
  std::string stat = disk;
  std::replace(stat.begin(), stat.end(), '+', ',');
  if (stat != disk) stat = "{" + stat + "}";
  return fmt::format(
      "* the device served a different number of requests than the run "
      "submitted: the block\n  layer merged them into fewer, larger ones (or "
      "split them). IOPS counts submissions;\n  dev IOPS and dev KiB are what "
      "{} served (/sys/block/{}/stat, the whole disk).\n",
      disk, stat);
}

nlohmann::json RowJson(const Row& row) {
  const JobResult& r = row.strata;
  nlohmann::json j = ResultJson(r, row.disk);
  j["rw"] = RwName(r.spec.rw);
  if (IsMixed(r.spec.rw)) j["rwmixread"] = r.spec.rwmixread;
  if (r.spec.ramp > 0) j["ramp_seconds"] = r.spec.ramp;
  j["bs"] = r.spec.bs;
  j["qd"] = r.spec.qd;
  if (r.spec.qd_requested != 0) j["qd_requested"] = r.spec.qd_requested;
  j["threads"] = r.spec.threads;
  j["direct"] = r.direct;
  j["sync"] = r.dsync;
  j["fsync"] = r.spec.fsync;
  j["backend"] = r.backend;
  j["submit_batch"] = r.submit_batch;
  j["runs_gb_per_s"] = row.strata_gbps;
  j["files"] = FilesJson(row);
  if (row.fio) {
    nlohmann::json f = ResultJson(*row.fio, row.disk);
    f["runs_gb_per_s"] = row.fio_gbps;
    f["buffers"] = row.fio_buffers;
    j["fio"] = std::move(f);
    j["strata_over_fio"] = row.strata_over_fio();
  }
  return j;
}

std::string SubmitBatchNote(int submit_batch) {
  if (submit_batch == 1) return "";
  const std::string how = submit_batch > 0
                              ? fmt::format("up to {}", submit_batch)
                              : std::string("every ready");
  return fmt::format(
      "  strata submits {} request(s) an enter (--submit-batch), fio one "
      "(its default):\n  the ratio compares different jobs; dev KiB shows "
      "what merged\n",
      how);
}

std::string Recommend(const std::vector<Row>& rows) {
  std::map<Rw, std::vector<const Row*>> by_rw;
  for (const Row& row : rows) by_rw[row.strata.spec.rw].push_back(&row);
  std::string out;
  for (const auto& [rw, runs] : by_rw) {
    const Row* best = runs[0];
    for (const Row* r : runs) {
      if (r->strata.gb_per_s() > best->strata.gb_per_s()) best = r;
    }
    const auto [best_lo, best_hi] = Range(best->strata_gbps, best->strata);
    const Row* pick = nullptr;
    for (const Row* r : runs) {
      // Level with the best unless the best's slowest run beats r's fastest.
      if (Range(r->strata_gbps, r->strata).second * (1 + kNoise) <
          best_lo * (1 - kNoise)) {
        continue;
      }
      const auto key = [](const Row* x) {
        const JobSpec& s = x->strata.spec;
        return std::make_pair(static_cast<uint64_t>(s.qd) * s.threads, s.bs);
      };
      if (pick == nullptr || key(r) < key(pick)) pick = r;
    }
    const JobSpec& s = pick->strata.spec;
    const auto [lo, hi] = Range(pick->strata_gbps, pick->strata);
    out += fmt::format(
        "recommended for {}: bs={} qd={} threads={} -> {:.3f} GB/s (runs "
        "{:.3f}-{:.3f}; best {:.3f}, runs {:.3f}-{:.3f})\n  aio config: "
        "{{\"backend\": \"{}\", \"rings\": {}, \"queue_depth\": {}, "
        "\"block_size\": {}, \"submit_batch\": {}}}\n",
        RwName(rw), SizeText(s.bs), s.qd, s.threads, pick->strata.gb_per_s(),
        lo, hi, best->strata.gb_per_s(), best_lo, best_hi, pick->strata.backend,
        s.threads, s.qd, s.bs, pick->strata.submit_batch);
  }
  return out;
}

}  // namespace strata::bench
