// strata-nvme-bench: see --help, and docs/PERF.md for measured figures.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
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
#include "tools/nvme_bench/fio_log.h"
#include "tools/nvme_bench/interrupt.h"
#include "tools/nvme_bench/json_out.h"
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

// What a run has settled before it opens the files.
struct Plan {
  std::vector<Placement> places;  // as o.paths
  std::vector<FileSystem> fs;     // under each
  uint64_t file_bytes = 0;        // each file's share of --size
  std::vector<JobSpec> specs;
  std::vector<DeviceClaim> claims;  // raw devices the run writes, held
                                    // for the whole run
  aio::Backend backend = aio::Backend::kAuto;
  const std::atomic<bool>* cancel = nullptr;
  RunLog* log = nullptr;

  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const Placement& p : places) out.push_back(p.file);
    return out;
  }
};

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
      "per pool thread); a job asking more runs (and fio beside it) at the "
      "qd the table shows\n",
      pool);
}

// What is measured: the file and the file system and device under it, or
// for a striped job a line per file.
std::string Where(const std::vector<aio::File*>& files, const Plan& plan) {
  if (files.size() == 1) {
    const uint64_t size = files[0]->size();
    const std::string part = size > plan.file_bytes
                                 ? fmt::format(", the jobs cover its first {}",
                                               SizeText(plan.file_bytes))
                                 : "";
    return fmt::format("{} ({}{}) on {}", plan.places[0].file, SizeText(size),
                       part, FileSystemText(plan.fs[0]));
  }
  std::string out = fmt::format(
      "{} files, striped one block at a time (their share of --size each)",
      files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    out += fmt::format("\n  file {}: {} ({}) on {}", i + 1, plan.places[i].file,
                       SizeText(files[i]->size()), FileSystemText(plan.fs[i]));
  }
  return out;
}

std::string Describe(const BenchOptions& o, const aio::IoInfo& info,
                     const std::vector<aio::File*>& files, const Plan& plan,
                     const aio::PinnedBuffer& pool) {
  const aio::File& file = *files[0];
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
      "strata-nvme-bench: {}\n  {}\n  backend {}\n  {} buffers{}\n{}"
      "  GB/s = 1e9 B/s; latency = submit to completion; CPU% = usr + sys, "
      "of one core\n  (strata: the whole process; fio: its job threads); dev "
      "= what the disk served\n",
      Where(files, plan), io, backend, pool.locked() ? "pinned" : "unpinned",
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
    const DiskSet& disks,
    const std::function<Result<JobResult>(const std::function<void()>&)>& run) {
  std::optional<DiskCounters> before;
  const auto mark = [&] {
    if (!disks.empty()) {
      if (auto c = disks.Read(); c.ok()) before = *c;
    }
  };
  mark();
  STRATA_ASSIGN_OR_RETURN(JobResult r, run(mark));
  if (before) {
    if (auto after = disks.Read(); after.ok()) {
      r.device = Delta(*before, *after);
    }
  }
  return r;
}

// Runs fio on `target` as the `run`-th run of `spec`, and logs its
// reports when `log` is enabled (Note [fio's interval figures]).
Result<JobResult> FioRun(const std::string& fio,
                         const std::vector<std::string>& fio_opts,
                         const JobSpec& spec, const Target& target,
                         const DiskSet& disks, int run, RunLog* log) {
  std::vector<nlohmann::json> reports;
  STRATA_ASSIGN_OR_RETURN(JobResult r, WithDevice(disks, [&](const auto&) {
                            return RunFio(FioCommand(fio, target.paths, spec,
                                                     target.direct, fio_opts),
                                          spec, target.cancel, &reports);
                          }));
  // fio's ramp cannot be told apart from outside: the disk's counters
  // would count it.
  if (spec.ramp > 0) r.device.reset();
  log->Start(spec, run, "fio");
  for (const JobProgress& p : FioProgress(reports, spec)) log->Add(p);
  STRATA_RETURN_IF_ERROR(log->status());
  return r;
}

// Runs one configuration --repeat times, alternating strata and fio.
Result<Row> RunRow(const BenchOptions& o, const JobSpec& spec,
                   const Target& target, aio::PinnedBuffer& pool,
                   const FioBuffers* fio_buffers, const DiskSet& disks,
                   const std::string& label, Progress* progress, RunLog* log) {
  Row row;
  row.disk = disks.name();
  row.paths = target.paths;
  std::vector<std::string> fio_opts;
  if (fio_buffers != nullptr) {
    row.fio_buffers = fio_buffers->kind();
    fio_opts = fio_buffers->options();
  }
  if (o.sync) fio_opts.push_back("--sync=1");
  if (log->enabled()) {
    const std::vector<std::string> log_opts = FioLogOptions();
    fio_opts.insert(fio_opts.end(), log_opts.begin(), log_opts.end());
  }
  fio_opts.insert(fio_opts.end(), o.fio_opts.begin(), o.fio_opts.end());
  std::vector<JobResult> strata_runs, fio_runs;
  auto strata_run = [&]() -> Status {
    ProgressSample prev;
    log->Start(spec, static_cast<int>(strata_runs.size()) + 1);
    auto r = WithDevice(disks, [&](const std::function<void()>& mark) {
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
    STRATA_ASSIGN_OR_RETURN(auto r,
                            FioRun(o.fio, fio_opts, spec, target, disks,
                                   static_cast<int>(fio_runs.size()) + 1, log));
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

// Every configuration in turn; on Ctrl-C, the rows that finished.
Status Sweep(const BenchOptions& o, const std::vector<JobSpec>& specs,
             const Target& target, aio::PinnedBuffer& pool,
             const DiskSet& disks, JsonOut* json, Progress* progress,
             RunLog* log) {
  std::unique_ptr<FioBuffers> fio_buffers;
  if (o.vs_fio) {
    fio_buffers = FioBuffers::Prepare(o.fio_buffers, specs, o.fio_opts);
    std::printf("  %s\n", fio_buffers->description().c_str());
    std::printf("%s", SubmitBatchNote(o.submit_batch).c_str());
  }
  std::printf("%s\n", TableHeader().c_str());
  std::fflush(stdout);
  std::vector<Row> rows;
  nlohmann::json records = nlohmann::json::array();
  for (size_t i = 0; i < specs.size() && !target.cancel->load(); ++i) {
    STRATA_ASSIGN_OR_RETURN(const JobSpec s,
                            DepthThatRuns(specs[i], target.backend));
    const std::string label =
        fmt::format("[{}/{}] {} bs={} qd={} threads={}", i + 1, specs.size(),
                    RwName(s.rw), SizeText(s.bs), s.qd, s.threads);
    Result<Row> row = RunRow(o, s, target, pool, fio_buffers.get(), disks,
                             label, progress, log);
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

// The disks whose counters cover `files`, or none when a file is on no
// block device (the figures would be part of the job's), which the header
// says.
DiskSet Disks(const std::vector<std::string>& files) {
  std::string missing;
  DiskSet disks = DiskSet::ForPaths(files, &missing);
  if (missing.empty()) return disks;
  std::printf("  no device-side figures: %s\n", missing.c_str());
  return DiskSet{};
}

// Removes the benchmark's own files on every way out of Run(), unless
// --keep.
class RemoveOnExit {
 public:
  RemoveOnExit(const std::vector<Placement>& places, bool keep) {
    for (const Placement& p : places) {
      if (p.ours && !keep) paths_.push_back(p.file);
    }
  }
  ~RemoveOnExit() {
    std::error_code ec;
    for (const std::string& path : paths_) std::filesystem::remove(path, ec);
  }

 private:
  std::vector<std::string> paths_;
};

// The prefill's engine with every file open: created and preallocated to
// its share where the run may write it. Someone else's file is neither
// grown nor written without --overwrite, nor a device without
// --destroy-data-on (CheckPlacement has refused a run that would); a
// device must hold its share.
Result<Session> OpenFiles(const BenchOptions& o, const Plan& plan) {
  STRATA_ASSIGN_OR_RETURN(Session session,
                          OpenSession(Target{.paths = {},
                                             .backend = plan.backend,
                                             .submit_batch = o.submit_batch},
                                      1, kPrefillDepth, kPrefillChunk, 0));
  for (const Placement& place : plan.places) {
    const bool may_write = MayWrite(o, place);
    aio::FileOptions fo;
    fo.create = may_write && !place.device;
    // Ours is new: a file another run made meanwhile is refused, not shared.
    fo.exclusive = place.ours;
    fo.size = may_write || place.device ? plan.file_bytes : 0;
    fo.direct = !o.buffered;
    fo.dsync = o.sync;
    fo.block_device = place.device;
    fo.read_only = place.device && !may_write;
    STRATA_ASSIGN_OR_RETURN(aio::File * file,
                            session.engine->OpenFile(place.file, fo));
    STRATA_RETURN_IF_ERROR(CheckTimedBuffered(file->direct(), o.seconds));
    session.files.push_back(file);
  }
  return session;
}

// Fills the files the run may write; the rest keep their data.
Status PrefillAll(const BenchOptions& o, const Plan& plan,
                  const Session& session, aio::PinnedBuffer& pool,
                  Progress* progress) {
  for (size_t i = 0; i < plan.places.size(); ++i) {
    if (!MayWrite(o, plan.places[i])) continue;
    Status st = Prefill(session.engine.get(), session.files[i],
                        static_cast<char*>(pool.data()), plan.file_bytes,
                        o.seed + i, plan.cancel, progress);
    if (st.code() == StatusCode::kCancelled) {
      return Status::Cancelled(fmt::format(
          "interrupted: while prefilling, 0 of {} configurations finished",
          plan.specs.size()));
    }
    STRATA_RETURN_IF_ERROR(st);
  }
  return Status::Ok();
}

Status RunOnFiles(const BenchOptions& o, const Plan& plan,
                  aio::PinnedBuffer& pool, JsonOut* json, bool* verified) {
  STRATA_ASSIGN_OR_RETURN(Session session, OpenFiles(o, plan));
  std::printf(
      "%s",
      Describe(o, session.engine->info(), session.files, plan, pool).c_str());
  std::fflush(stdout);
  // PlaceAll has refused a job of devices and files mixed.
  const bool device = plan.places[0].device;
  const Target target{.paths = plan.files(),
                      .direct = AllDirect(session.files),
                      .backend = plan.backend,
                      .cancel = plan.cancel,
                      .submit_batch = o.submit_batch,
                      .dsync = o.sync,
                      .block_device = device,
                      .read_only = device && !RunWrites(o)};
  Progress progress(!o.quiet);
  if (o.verify) {
    session.engine.reset();
    STRATA_ASSIGN_OR_RETURN(bool ok, Verify(o, target, pool, &progress));
    *verified = ok;
    return Status::Ok();
  }
  const Status prefilled = PrefillAll(o, plan, session, pool, &progress);
  if (prefilled.code() == StatusCode::kCancelled) {
    // As a stop during a run does: no configuration finished.
    STRATA_RETURN_IF_ERROR(json->Write(nlohmann::json::array()));
  }
  STRATA_RETURN_IF_ERROR(prefilled);
  session.engine.reset();
  return Sweep(o, plan.specs, target, pool, Disks(target.paths), json,
               &progress, plan.log);
}

// Each file's file system, and whether the file may be used: what the run
// writes on each file system must fit there. A raw device the run writes
// is claimed for the whole run.
Status PlaceFiles(const BenchOptions& o, Plan* plan) {
  STRATA_ASSIGN_OR_RETURN(plan->places, PlaceAll(o));
  plan->file_bytes = FileShare(o.size, static_cast<int>(o.paths.size()));
  for (const Placement& place : plan->places) {
    std::error_code ec;
    plan->fs.push_back(FileSystemOf(
        std::filesystem::exists(place.file, ec) ? place.file : place.dir));
  }
  for (size_t i = 0; i < plan->places.size(); ++i) {
    const FileSystem& fs = plan->fs[i];
    const auto same = std::count_if(
        plan->fs.begin(), plan->fs.end(), [&](const FileSystem& other) {
          return other.major == fs.major && other.minor == fs.minor;
        });
    STRATA_RETURN_IF_ERROR(
        CheckPlacement(o, plan->places[i], fs,
                       Share{plan->file_bytes, plan->file_bytes * same}));
  }
  STRATA_RETURN_IF_ERROR(CheckDestroyFlags(o, plan->places));
  for (const Placement& place : plan->places) {
    if (!place.device || !MayWrite(o, place)) continue;
    STRATA_ASSIGN_OR_RETURN(DeviceClaim claim, DeviceClaim::Take(place.file));
    plan->claims.push_back(std::move(claim));
  }
  return Status::Ok();
}

// What can be found before the files are made: the paths, the room (or a
// raw device's rules, and its claim), the --json file, fio and its options.
Result<Plan> Preflight(const BenchOptions& o, JsonOut* json) {
  Plan plan;
  STRATA_ASSIGN_OR_RETURN(plan.backend, aio::ParseBackend(o.backend));
  STRATA_RETURN_IF_ERROR(PlaceFiles(o, &plan));
  STRATA_RETURN_IF_ERROR(json->Open());
  plan.specs = Specs(o);
  if (o.vs_fio && !o.verify) {
    STRATA_RETURN_IF_ERROR(CheckFio(FioCommand(
        o.fio, plan.files(), plan.specs[0], !o.buffered, o.fio_opts)));
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
  RemoveOnExit cleanup(plan.places, o.keep);
  bool verified = true;
  STRATA_RETURN_IF_ERROR(RunOnFiles(o, plan, pool, &json, &verified));
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
