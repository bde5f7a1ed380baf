// strata-nvme-bench: see --help, and docs/PERF.md for measured figures.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/text.h"
#include "strata/aio.h"
#include "tools/nvme_bench/cli.h"
#include "tools/nvme_bench/device_stat.h"
#include "tools/nvme_bench/fio.h"
#include "tools/nvme_bench/fio_buffers.h"
#include "tools/nvme_bench/interrupt.h"
#include "tools/nvme_bench/place.h"
#include "tools/nvme_bench/progress.h"
#include "tools/nvme_bench/raw_device.h"
#include "tools/nvme_bench/report.h"
#include "tools/nvme_bench/run_log.h"
#include "tools/nvme_bench/verify.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {
namespace {

constexpr size_t kPrefillChunk = 1u << 20;
constexpr int kPrefillDepth = 8;

void FillRandom(char* buf, size_t bytes, uint64_t seed) {
  auto* words = reinterpret_cast<uint64_t*>(buf);
  for (size_t i = 0; i < bytes / 8; ++i) words[i] = Mix64(seed + i);
}

// Writes the whole file once with fresh incompressible data per chunk, so
// reads hit allocated, written blocks (not holes or unwritten extents).
Status Prefill(aio::Engine* engine, aio::File* file, char* pool, uint64_t size,
               uint64_t seed, const std::atomic<bool>* cancel,
               Progress* progress) {
  std::vector<aio::Handle> inflight(kPrefillDepth);
  uint64_t i = 0;
  for (uint64_t off = 0; off < size && !cancel->load();
       off += kPrefillChunk, ++i) {
    aio::Handle& slot = inflight[i % kPrefillDepth];
    if (slot.valid()) {
      STRATA_RETURN_IF_ERROR(slot.Wait());
    }
    char* buf = pool + (i % kPrefillDepth) * kPrefillChunk;
    const size_t len = std::min<uint64_t>(kPrefillChunk, size - off);
    FillRandom(buf, len, Mix64(seed) ^ off);
    STRATA_ASSIGN_OR_RETURN(slot, engine->Write(file, buf, len, off));
    progress->Update(fmt::format("prefill: {:.0f}%", 100.0 * off / size));
  }
  STRATA_RETURN_IF_ERROR(engine->WaitAll());
  progress->Clear();
  if (cancel->load()) return Status::Cancelled("interrupted");
  return file->Sync();
}

// Whether strata's buffers really are huge pages (transparent huge pages
// are best effort): at least 90% of their bytes.
bool StrataHugePages(const BenchOptions& o, const aio::PinnedBuffer& pool) {
  return o.huge_pages &&
         TransparentHugeBytes(pool.data(), pool.size()) * 10 >= pool.size() * 9;
}

// A line for the header when the thread backend's pool (aio/
// thread_backend.cc) holds fewer requests than a configuration asks for:
// the table then reports the depth in flight, not --qd.
std::string DepthCapNote(const BenchOptions& o, const aio::IoInfo& info) {
  if (info.backend != aio::Backend::kThreads || o.verify) return "";
  aio::IoOptions eo;
  eo.backend = aio::Backend::kThreads;
  eo.rings = *std::max_element(o.threads.begin(), o.threads.end());
  eo.queue_depth = *std::max_element(o.qd.begin(), o.qd.end());
  auto probe = aio::Engine::Open(eo);
  if (!probe.ok()) return "";
  const int pool = (*probe)->info().threads;
  if (pool >= eo.rings * eo.queue_depth) return "";
  return fmt::format(
      "  qd capped: the thread backend runs at most {} requests at once (one "
      "per pool thread); the qd column says what was in flight\n",
      pool);
}

std::string Describe(const BenchOptions& o, const aio::IoInfo& info,
                     const aio::File& file, const Placement& place,
                     const FileSystem& fs, const aio::PinnedBuffer& pool) {
  std::string io = file.direct()
                       ? fmt::format("O_DIRECT (align mem {} / offset {})",
                                     file.mem_align(), file.offset_align())
                       : "buffered (the file system refused O_DIRECT)";
  if (o.sync) io += ", O_DSYNC";
  std::string backend(aio::BackendName(info.backend));
  if (info.backend == aio::Backend::kIoUring) {
    backend += fmt::format(
        " ({}{}{}, submit batch {})", info.ring_setup,
        info.fixed_files ? ", fixed files" : "",
        info.fixed_buffers ? ", fixed buffers" : "",
        info.submit_batch > 0 ? std::to_string(info.submit_batch) : "all");
  } else {
    backend += fmt::format(
        " (pread/pwrite pool of threads x qd threads, at most 64: {})",
        info.fallback_reason);
  }
  return fmt::format(
      "strata-nvme-bench: {} ({}) on {}\n  {}\n  backend {}\n  {} buffers{}\n{}"
      "  GB/s = 1e9 B/s; latency = submit to completion; CPU% = usr + sys, "
      "of one core\n  (strata: the whole process; fio: its job threads); dev "
      "= what the disk served\n",
      place.file, SizeText(file.size()), FileSystemText(fs), io, backend,
      pool.locked() ? "pinned" : "unpinned",
      StrataHugePages(o, pool) ? " on huge pages"
      : o.huge_pages ? " on 4 KiB pages (transparent huge pages were asked "
                       "for and not had)"
                     : " on 4 KiB pages",
      DepthCapNote(o, info));
}

size_t PoolBytes(const BenchOptions& o) {
  size_t need = kPrefillChunk * kPrefillDepth;
  const size_t bs = *std::max_element(o.bs.begin(), o.bs.end());
  const size_t qd = *std::max_element(o.qd.begin(), o.qd.end());
  const size_t th = *std::max_element(o.threads.begin(), o.threads.end());
  if (o.verify) {
    need = std::max<size_t>(need, o.verify_max * o.qd[0] * o.threads[0]);
  } else {
    need = std::max(need, bs * qd * th);
  }
  return need;
}

std::vector<JobSpec> Specs(const BenchOptions& o) {
  std::vector<JobSpec> specs;
  for (Rw rw : o.rw) {
    for (size_t bs : o.bs) {
      for (int qd : o.qd) {
        for (int th : o.threads) {
          specs.push_back(JobSpec{.rw = rw,
                                  .bs = bs,
                                  .qd = qd,
                                  .threads = th,
                                  .size = o.size,
                                  .seconds = o.seconds,
                                  .seed = o.seed,
                                  .rwmixread = o.rwmixread,
                                  .ramp = o.ramp,
                                  .fsync = OnlyWrites(rw) ? o.fsync : 0});
        }
      }
    }
  }
  return specs;
}

// Runs `run` and fills its result's device figures from `disk`'s counters
// around it; `run` may call the function it is given to read them again
// (at the end of a ramp).
Result<JobResult> WithDevice(
    const std::optional<DiskStat>& disk,
    const std::function<Result<JobResult>(const std::function<void()>&)>& run) {
  std::optional<DiskCounters> before;
  const auto mark = [&] {
    if (disk) {
      if (auto c = disk->Read(); c.ok()) before = *c;
    }
  };
  mark();
  STRATA_ASSIGN_OR_RETURN(JobResult r, run(mark));
  if (before) {
    if (auto after = disk->Read(); after.ok()) {
      r.device = Delta(*before, *after);
    }
  }
  return r;
}

// Runs one configuration --repeat times, alternating strata and fio.
Result<Row> RunRow(const BenchOptions& o, const JobSpec& spec,
                   const Target& target, aio::PinnedBuffer& pool,
                   const FioBuffers* fio_buffers,
                   const std::optional<DiskStat>& disk,
                   const std::string& label, Progress* progress, RunLog* log) {
  Row row;
  if (disk) row.disk = disk->name();
  std::vector<std::string> fio_opts;
  if (fio_buffers != nullptr) {
    row.fio_buffers = fio_buffers->kind();
    fio_opts = fio_buffers->options();
  }
  if (o.sync) fio_opts.push_back("--sync=1");
  fio_opts.insert(fio_opts.end(), o.fio_opts.begin(), o.fio_opts.end());
  std::vector<JobResult> strata_runs, fio_runs;
  auto strata_run = [&]() -> Status {
    ProgressSample prev;
    log->Start(spec, static_cast<int>(strata_runs.size()) + 1);
    auto r = WithDevice(disk, [&](const std::function<void()>& mark) {
      Target counted = target;
      counted.on_ramp_end = mark;
      return RunJob(spec, counted, pool.data(), pool.size(),
                    [&](const JobProgress& p) {
                      log->Add(p);
                      const ProgressSample now{p.moved, p.elapsed};
                      progress->Update(JobProgressText(label, spec, prev, now));
                      prev = now;
                    });
    });
    if (!r.ok()) return r.status();
    STRATA_RETURN_IF_ERROR(log->status());
    row.strata_gbps.push_back(r->gb_per_s());
    strata_runs.push_back(std::move(*r));
    return Status::Ok();
  };
  auto fio_run = [&]() -> Status {
    progress->Update(label + ": fio");
    STRATA_ASSIGN_OR_RETURN(auto r, WithDevice(disk, [&](const auto&) {
                              return RunFio(FioCommand(o.fio, target.path, spec,
                                                       target.direct, fio_opts),
                                            spec, target.cancel);
                            }));
    // fio's ramp cannot be told apart from outside: the disk's counters
    // would count it.
    if (spec.ramp > 0) r.device.reset();
    row.fio_gbps.push_back(r.gb_per_s());
    fio_runs.push_back(std::move(r));
    return Status::Ok();
  };
  Status st;
  for (int rep = 0; rep < o.repeat && st.ok(); ++rep) {
    const bool fio_first = o.vs_fio && rep % 2 == 1;
    st = fio_first ? fio_run() : strata_run();
    if (st.ok() && o.vs_fio) st = fio_first ? strata_run() : fio_run();
  }
  progress->Clear();
  if (!st.ok()) return st;
  row.strata = strata_runs[MedianIndex(row.strata_gbps)];
  if (o.vs_fio) row.fio = fio_runs[MedianIndex(row.fio_gbps)];
  return row;
}

// The --json file: opened before the first run, so that a path that
// cannot be written is found then, and removed again on the way out when
// this run created it and never wrote it.
class JsonOut {
 public:
  explicit JsonOut(std::string path) : path_(std::move(path)) {}
  ~JsonOut() {
    if (created_ && !written_) unlink(path_.c_str());
  }
  JsonOut(const JsonOut&) = delete;
  JsonOut& operator=(const JsonOut&) = delete;

  Status Open() {
    if (path_.empty()) return Status::Ok();
    int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    created_ = fd >= 0;
    if (fd < 0 && errno == EEXIST) {
      fd = open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    }
    if (fd < 0) {
      const int err = errno;
      return Status(aio::ErrnoStatus(err, "").code(),
                    "cannot write --json file '" + path_ +
                        "': " + ErrnoText(err) +
                        "; pass a --json path in a directory you can write");
    }
    close(fd);
    return Status::Ok();
  }

  Status Write(const nlohmann::json& records) {
    if (path_.empty()) return Status::Ok();
    std::ofstream out(path_);
    out << records.dump(2) << "\n";
    written_ = true;
    if (!out) {
      return Status::IoError("cannot write --json file '" + path_ + "'");
    }
    return Status::Ok();
  }

 private:
  std::string path_;
  bool created_ = false;
  bool written_ = false;
};

// Every configuration in turn; on Ctrl-C, the rows that finished.
Status Sweep(const BenchOptions& o, const std::vector<JobSpec>& specs,
             const Target& target, aio::PinnedBuffer& pool,
             const std::optional<DiskStat>& disk, JsonOut* json,
             Progress* progress, RunLog* log) {
  std::unique_ptr<FioBuffers> fio_buffers;
  if (o.vs_fio) {
    fio_buffers = FioBuffers::Prepare(o.fio_buffers, specs, o.fio_opts);
    std::printf("  %s\n", fio_buffers->description().c_str());
  }
  std::printf("%s\n", TableHeader().c_str());
  std::fflush(stdout);
  std::vector<Row> rows;
  nlohmann::json records = nlohmann::json::array();
  for (size_t i = 0; i < specs.size() && !target.cancel->load(); ++i) {
    const JobSpec& s = specs[i];
    const std::string label =
        fmt::format("[{}/{}] {} bs={} qd={} threads={}", i + 1, specs.size(),
                    RwName(s.rw), SizeText(s.bs), s.qd, s.threads);
    Result<Row> row = RunRow(o, s, target, pool, fio_buffers.get(), disk, label,
                             progress, log);
    if (!row.ok() && row.status().code() == StatusCode::kCancelled) break;
    if (!row.ok()) return row.status();
    std::printf("%s\n", TableRow(*row).c_str());
    std::fflush(stdout);
    records.push_back(RowJson(*row));
    rows.push_back(std::move(*row));
  }
  STRATA_RETURN_IF_ERROR(json->Write(records));
  if (rows.size() < specs.size()) {
    return Status::Cancelled(
        fmt::format("interrupted: {} of {} configurations finished",
                    rows.size(), specs.size()));
  }
  std::printf("%s", TableNotes(rows).c_str());
  const std::string mismatch =
      fio_buffers
          ? fio_buffers->Mismatch(o.huge_pages, StrataHugePages(o, pool))
          : "";
  if (!mismatch.empty()) std::printf("%s\n", mismatch.c_str());
  if (o.recommend) std::printf("\n%s", Recommend(rows).c_str());
  return Status::Ok();
}

Result<bool> Verify(const BenchOptions& o, const Target& target,
                    aio::PinnedBuffer& pool, Progress* progress) {
  VerifyOptions vo;
  vo.ops = o.verify_ops;
  vo.max_bytes = o.verify_max;
  vo.block_size = o.bs[0];
  vo.qd = o.qd[0];
  vo.threads = o.threads[0];
  vo.seed = o.seed;
  auto r = RunVerify(target, o.size, vo, pool.data(), pool.size(),
                     [&](VerifyPhase phase, uint64_t done, uint64_t total) {
                       progress->Update(VerifyProgressText(phase, done, total));
                     });
  progress->Clear();
  if (!r.ok() && r.status().code() == StatusCode::kCancelled) {
    return Status::Cancelled("interrupted: --verify did not finish");
  }
  if (!r.ok()) return r.status();
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  std::printf(
      "%s",
      fmt::format("verify: {} random ops plus full write and "
                  "read-back passes; {} writes ({:.2f} GiB), {} "
                  "reads ({:.2f} GiB) in {:.1f} s; {} mismatched "
                  "words\n",
                  o.verify_ops, r->writes, r->bytes_written / kGiB, r->reads,
                  r->bytes_read / kGiB, r->seconds, r->mismatched_words)
          .c_str());
  if (r->mismatched_words != 0) {
    std::printf("verify: FAILED, first mismatch at %s\n",
                r->first_mismatch.c_str());
  }
  return r->mismatched_words == 0;
}

// The disk whose counters cover `file`, or none, which the header says.
std::optional<DiskStat> Disk(const std::string& file) {
  Result<DiskStat> disk = DiskStat::ForPath(file);
  if (disk.ok()) return *disk;
  std::printf("  no device-side figures: %s\n",
              disk.status().message().c_str());
  return std::nullopt;
}

// Removes the benchmark's own file on every way out of Run(), unless --keep.
class RemoveOnExit {
 public:
  RemoveOnExit(const Placement& place, bool keep)
      : path_(place.ours && !keep ? place.file : "") {}
  ~RemoveOnExit() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove(path_, ec);
  }

 private:
  std::string path_;
};

// What a run has settled before it opens the file.
struct Plan {
  Placement place;
  FileSystem fs;
  std::vector<JobSpec> specs;
  DeviceClaim claim;  // a raw device the run writes, for the whole run
  aio::Backend backend = aio::Backend::kAuto;
  const std::atomic<bool>* cancel = nullptr;
  RunLog* log = nullptr;
};

Status RunOnFile(const BenchOptions& o, const Plan& plan,
                 aio::PinnedBuffer& pool, JsonOut* json, bool* verified) {
  // Someone else's file is neither grown nor written without --overwrite,
  // nor a device without --destroy-data-on (CheckPlacement has refused a
  // run that would). A device is opened with --size, which it must hold.
  const bool may_write = MayWrite(o, plan.place);
  const bool device = plan.place.device;
  Target target{.path = plan.place.file,
                .direct = !o.buffered,
                .backend = plan.backend,
                .submit_batch = o.submit_batch,
                .dsync = o.sync,
                .block_device = device,
                .read_only = device && !may_write};
  STRATA_ASSIGN_OR_RETURN(auto session,
                          OpenSession(target, 1, kPrefillDepth, kPrefillChunk,
                                      may_write || device ? o.size : 0));
  aio::File* file = session.file;
  STRATA_RETURN_IF_ERROR(CheckTimedBuffered(file->direct(), o.seconds));
  std::printf("%s", Describe(o, session.engine->info(), *file, plan.place,
                             plan.fs, pool)
                        .c_str());
  std::fflush(stdout);
  target.direct = file->direct();
  target.cancel = plan.cancel;
  Progress progress(!o.quiet);
  if (o.verify) {
    session.engine.reset();
    STRATA_ASSIGN_OR_RETURN(bool ok, Verify(o, target, pool, &progress));
    *verified = ok;
    return Status::Ok();
  }
  if (may_write) {
    Status st =
        Prefill(session.engine.get(), file, static_cast<char*>(pool.data()),
                o.size, o.seed, plan.cancel, &progress);
    if (st.code() == StatusCode::kCancelled) {
      return Status::Cancelled(fmt::format(
          "interrupted: while prefilling, 0 of {} configurations finished",
          plan.specs.size()));
    }
    STRATA_RETURN_IF_ERROR(st);
  }
  session.engine.reset();
  return Sweep(o, plan.specs, target, pool, Disk(target.path), json, &progress,
               plan.log);
}

// What can be found before the file is made: the path, the room (or a raw
// device's rules, and its claim), the --json file, fio and its options.
Result<Plan> Preflight(const BenchOptions& o, JsonOut* json) {
  Plan plan;
  STRATA_ASSIGN_OR_RETURN(plan.backend, aio::ParseBackend(o.backend));
  STRATA_ASSIGN_OR_RETURN(plan.place, Place(o));
  std::error_code ec;
  plan.fs = FileSystemOf(std::filesystem::exists(plan.place.file, ec)
                             ? plan.place.file
                             : plan.place.dir);
  STRATA_RETURN_IF_ERROR(CheckPlacement(o, plan.place, plan.fs));
  if (plan.place.device && MayWrite(o, plan.place)) {
    STRATA_ASSIGN_OR_RETURN(plan.claim, DeviceClaim::Take(plan.place.file));
  }
  STRATA_RETURN_IF_ERROR(json->Open());
  plan.specs = Specs(o);
  if (o.vs_fio && !o.verify) {
    STRATA_RETURN_IF_ERROR(CheckFio(FioCommand(
        o.fio, plan.place.file, plan.specs[0], !o.buffered, o.fio_opts)));
  }
  return plan;
}

// Returns the process exit status.
Result<int> Run(const BenchOptions& o, const std::atomic<bool>* cancel) {
  JsonOut json(o.verify ? "" : o.json);
  STRATA_ASSIGN_OR_RETURN(Plan plan, Preflight(o, &json));
  plan.cancel = cancel;
  RunLog log(o.verify ? "" : o.log);
  STRATA_RETURN_IF_ERROR(log.Open());
  plan.log = &log;
  aio::PinOptions pin;
  pin.lock = o.pin;
  pin.huge_pages = o.huge_pages;
  STRATA_ASSIGN_OR_RETURN(auto pool,
                          aio::PinnedBuffer::Allocate(PoolBytes(o), pin));
  FillRandom(static_cast<char*>(pool.data()), pool.size(), o.seed);
  RemoveOnExit cleanup(plan.place, o.keep);
  bool verified = true;
  STRATA_RETURN_IF_ERROR(RunOnFile(o, plan, pool, &json, &verified));
  return verified ? 0 : 1;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  const std::atomic<bool>* cancel = strata::bench::InstallInterruptHandler();
  bool exit_now = false;
  auto options = strata::bench::ParseCommandLine(argc, argv, &exit_now);
  if (!options.ok()) {
    std::fprintf(stderr, "strata-nvme-bench: %s\n",
                 options.status().message().c_str());
    return 2;
  }
  if (exit_now) return 0;
  auto rc = strata::bench::Run(*options, cancel);
  if (!rc.ok() && rc.status().code() == strata::StatusCode::kCancelled) {
    // After the rows printed so far, on the same stream.
    std::printf("%s\n", rc.status().message().c_str());
    const int sig = strata::bench::InterruptSignal();
    return 128 + (sig != 0 ? sig : SIGINT);
  }
  if (!rc.ok()) {
    std::fprintf(stderr, "strata-nvme-bench: error: %s\n",
                 rc.status().ToString().c_str());
    return 1;
  }
  return *rc;
}
