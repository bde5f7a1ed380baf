#include "tools/nvme_bench/workload.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "tools/nvme_bench/fsync_gate.h"

namespace strata::bench {
namespace {

// One ring's share of the job: a contiguous slice of the file.
struct Worker {
  int ring = 0;
  uint64_t first_block = 0;
  uint64_t blocks = 0;
  std::atomic<uint64_t> next{0};
  // A sequential mixed job's next block per direction: as fio does, reads
  // and writes each walk the slice from its start.
  std::atomic<uint64_t> next_of[2] = {0, 0};
  std::atomic<uint64_t> moved{0};  // bytes, the ramp's included (progress)
  // Counted after the ramp, per direction: [0] reads, [1] writes.
  std::atomic<uint64_t> bytes[2] = {0, 0};
  std::atomic<uint64_t> ios[2] = {0, 0};
  std::atomic<uint64_t> lat_ns{0};  // summed, for --log's interval means
  LatencyHistogram lat[2];
  std::vector<std::atomic<uint64_t>> file_ios;  // counted, per file
  std::unique_ptr<FsyncGate> fsync;             // --fsync only
  std::atomic<int> syncs_left{0};  // of the sync point in flight, per file
};

class Job;

struct Slot {
  Job* job;
  Worker* worker;
  char* buf;
  uint64_t start_ns = 0;
  bool write = false;  // the request in flight's direction
  size_t file = 0;     // and its file
};

// The process's CPU time at a moment of the run.
struct CpuMark {
  double usr = 0;
  double sys = 0;
  uint64_t ns = 0;
};

CpuMark MarkCpu() {
  CpuMark m;
  CpuTimes(&m.usr, &m.sys);
  m.ns = NowNs();
  return m;
}

// Keeps qd requests in flight per worker, resubmitting from completions.
class Job {
 public:
  Job(const JobSpec& spec, aio::Engine* engine,
      const std::vector<aio::File*>& files, const Target& target)
      : spec_(spec),
        engine_(engine),
        files_(files),
        cancel_(target.cancel),
        on_ramp_end_(target.on_ramp_end) {}

  // `*seconds` is the measured part (after the ramp), `*cpu` its start.
  Status Run(char* buffers, const ProgressFn& progress, double* seconds,
             CpuMark* cpu);
  const std::vector<std::unique_ptr<Worker>>& workers() const {
    return workers_;
  }

 private:
  // Splits the job's blocks into one slice per thread and `buffers` into
  // qd slots per thread.
  Status Carve(char* buffers);
  // Sleeps until the last slot retires, calling `progress` on the way and
  // marking the CPU time at the end of the ramp.
  void WaitForEnd(uint64_t start_ns, const ProgressFn& progress, CpuMark* cpu);
  JobProgress Sample(uint64_t start_ns, uint64_t now, bool done) const;
  bool Issue(Slot* slot);
  void OnComplete(Slot* slot, const Status& status);
  uint64_t BlockOf(const Worker& w, uint64_t i) const;
  void Fail(const Status& status);
  bool Cancelled() const { return cancel_ != nullptr && cancel_->load(); }
  // A slot (or the start-up guard) has no more work; the last one to retire
  // stamps the end of the run.
  void Retire();
  // --fsync: the syncs (one per file) that a thread's gate made due,
  // submitted from a completion callback, and their end, which hands the
  // slots the gate parked back to Issue() (Note [Fsync gate]).
  void SubmitSync(Worker& w);
  void Synced(Worker& w, const Status& status);

  const JobSpec spec_;
  aio::Engine* engine_;
  const std::vector<aio::File*> files_;
  const std::atomic<bool>* cancel_;
  const std::function<void()> on_ramp_end_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<Slot> slots_;
  uint64_t measure_ns_ = 0;  // the end of the ramp
  uint64_t deadline_ns_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> active_{0};
  std::atomic<uint64_t> end_ns_{0};
  std::mutex error_mu_;
  Status error_;
};

uint64_t Job::BlockOf(const Worker& w, uint64_t i) const {
  if (!IsRandom(spec_.rw)) return w.first_block + i % w.blocks;
  const uint64_t pass = i / w.blocks;
  const Permutation perm(w.blocks, Mix64(spec_.seed + w.ring * 7919 + pass));
  return w.first_block + perm(i % w.blocks);
}

bool Job::Issue(Slot* slot) {
  if (stop_.load(std::memory_order_relaxed) || Cancelled()) return false;
  Worker& w = *slot->worker;
  const uint64_t now = NowNs();
  if (spec_.seconds > 0 && now >= deadline_ns_) return false;
  if (w.fsync) {
    const FsyncGate::Admission a = w.fsync->Admit(slot);
    if (a != FsyncGate::Admission::kGo) {
      return a == FsyncGate::Admission::kParked;
    }
  }
  const uint64_t i = w.next.fetch_add(1, std::memory_order_relaxed);
  if (spec_.seconds <= 0 && i >= w.blocks) return false;
  slot->write = WritesRequest(spec_, w.ring, i);
  const uint64_t at =
      spec_.rw == Rw::kReadWrite
          ? w.next_of[slot->write].fetch_add(1, std::memory_order_relaxed)
          : i;
  // Note [Striping]
  const uint64_t block = BlockOf(w, at);
  slot->file = block % files_.size();
  aio::Request req;
  req.file = files_[slot->file];
  req.buf = slot->buf;
  req.len = spec_.bs;
  req.offset = block / files_.size() * spec_.bs;
  req.write = slot->write;
  req.ring = w.ring;
  req.on_complete = [slot](const Status& st) {
    slot->job->OnComplete(slot, st);
  };
  slot->start_ns = now;
  Result<aio::Handle> h = engine_->Submit(std::move(req));
  if (!h.ok()) {
    Fail(h.status());
    if (!w.fsync || !w.fsync->Completed(slot)) return false;
    SubmitSync(w);  // the gate holds the slot until the sync ends
  }
  return true;
}

void Job::SubmitSync(Worker& w) {
  // A sync point syncs every file; the last sync to end hands the slots
  // back.
  w.syncs_left.store(static_cast<int>(files_.size()));
  for (aio::File* file : files_) {
    Result<aio::Handle> h = engine_->Sync(
        file, [this, &w](const Status& st) { Synced(w, st); }, w.ring);
    if (!h.ok()) Synced(w, h.status());
  }
}

void Job::Synced(Worker& w, const Status& status) {
  if (!status.ok()) Fail(status);
  if (w.syncs_left.fetch_sub(1) != 1) return;
  for (void* parked : w.fsync->Synced()) {
    if (!Issue(static_cast<Slot*>(parked))) Retire();
  }
}

void Job::Fail(const Status& status) {
  std::lock_guard<std::mutex> lock(error_mu_);
  if (error_.ok()) error_ = status;
  stop_.store(true, std::memory_order_relaxed);
}

void Job::OnComplete(Slot* slot, const Status& status) {
  const uint64_t now = NowNs();
  Worker& w = *slot->worker;
  if (status.ok()) {
    w.moved.fetch_add(spec_.bs, std::memory_order_relaxed);
    if (now >= measure_ns_) {
      const int dir = slot->write ? 1 : 0;
      w.lat[dir].Record(now - slot->start_ns);
      w.lat_ns.fetch_add(now - slot->start_ns, std::memory_order_relaxed);
      w.bytes[dir].fetch_add(spec_.bs, std::memory_order_relaxed);
      w.ios[dir].fetch_add(1, std::memory_order_relaxed);
      w.file_ios[slot->file].fetch_add(1, std::memory_order_relaxed);
    }
  } else {
    Fail(status);
  }
  if (w.fsync && w.fsync->Completed(slot)) {
    SubmitSync(w);  // the gate holds the slot until the sync ends
    return;
  }
  if (!Issue(slot)) Retire();
}

void Job::Retire() {
  // Read the clock here, after Issue() read it to decide to stop: the run
  // never ends before its deadline.
  const uint64_t now = NowNs();
  if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    end_ns_.store(now, std::memory_order_release);
  }
}

Status Job::Carve(char* buffers) {
  const int files = static_cast<int>(files_.size());
  const uint64_t per_worker = BlocksPerThread(spec_, files);
  if (per_worker == 0) {
    return Status::InvalidArgument(
        "--size is too small: each of the " + std::to_string(spec_.threads) +
        " threads needs at least one block of " + std::to_string(spec_.bs) +
        " bytes" + (files > 1 ? " in each file" : ""));
  }
  for (int t = 0; t < spec_.threads; ++t) {
    auto w = std::make_unique<Worker>();
    w->ring = t;
    w->first_block = per_worker * t;
    w->blocks = per_worker;
    w->file_ios = std::vector<std::atomic<uint64_t>>(files);
    if (spec_.fsync > 0 && OnlyWrites(spec_.rw)) {
      const uint64_t limit = spec_.seconds > 0 ? UINT64_MAX : w->blocks;
      w->fsync = std::make_unique<FsyncGate>(spec_.fsync, limit);
    }
    workers_.push_back(std::move(w));
  }
  slots_.reserve(static_cast<size_t>(spec_.threads) * spec_.qd);
  for (int t = 0; t < spec_.threads; ++t) {
    for (int q = 0; q < spec_.qd; ++q) {
      slots_.push_back(Slot{this, workers_[t].get(), buffers});
      buffers += spec_.bs;
    }
  }
  return Status::Ok();
}

JobProgress Job::Sample(uint64_t start_ns, uint64_t now, bool done) const {
  JobProgress p;
  for (const auto& w : workers_) {
    for (int dir : {0, 1}) {
      p.bytes += w->bytes[dir].load(std::memory_order_relaxed);
      p.ios += w->ios[dir].load(std::memory_order_relaxed);
    }
    p.lat_ns += w->lat_ns.load(std::memory_order_relaxed);
    p.moved += w->moved.load(std::memory_order_relaxed);
  }
  p.seconds = now > measure_ns_ ? (now - measure_ns_) / 1e9 : 0;
  p.elapsed = (now - start_ns) / 1e9;
  p.done = done;
  return p;
}

void Job::WaitForEnd(uint64_t start_ns, const ProgressFn& progress,
                     CpuMark* cpu) {
  constexpr uint64_t kTickNs = 20'000'000;
  uint64_t last_report = start_ns;
  bool ramping = measure_ns_ > start_ns;
  uint64_t end = 0;
  for (;;) {
    uint64_t now = NowNs();
    // Wake at the ramp's end, not up to a tick after it.
    const uint64_t nap = ramping && measure_ns_ > now
                             ? std::min(kTickNs, measure_ns_ - now)
                             : kTickNs;
    std::this_thread::sleep_for(std::chrono::nanoseconds(nap));
    // The clock before the check: a report taken after the end, with a
    // later time than the last one's, would send the log's times back.
    now = NowNs();
    if ((end = end_ns_.load(std::memory_order_acquire)) != 0) break;
    if (ramping && now >= measure_ns_) {
      *cpu = MarkCpu();
      if (on_ramp_end_) on_ramp_end_();
      ramping = false;
      last_report = now;  // the first counted interval is a whole period
    }
    if (progress && now - last_report > kProgressPeriodNs) {
      last_report = now;
      progress(Sample(start_ns, now, false));
    }
  }
  // Every request is back: the last report closes the run.
  if (progress) progress(Sample(start_ns, end, true));
}

Status Job::Run(char* buffers, const ProgressFn& progress, double* seconds,
                CpuMark* cpu) {
  STRATA_RETURN_IF_ERROR(Carve(buffers));
  *cpu = MarkCpu();
  const uint64_t start = cpu->ns;
  measure_ns_ = start + static_cast<uint64_t>(spec_.ramp * 1e9);
  deadline_ns_ = measure_ns_ + static_cast<uint64_t>(spec_.seconds * 1e9);
  // One extra count guards against the run ending while slots are issued.
  active_.store(static_cast<int>(slots_.size()) + 1);
  for (Slot& s : slots_) {
    if (!Issue(&s)) Retire();
  }
  Retire();
  WaitForEnd(start, progress, cpu);
  const uint64_t end = end_ns_.load();
  *seconds = end > measure_ns_ ? (end - measure_ns_) / 1e9 : 0;
  std::lock_guard<std::mutex> lock(error_mu_);
  if (error_.ok() && Cancelled()) return Status::Cancelled("interrupted");
  return error_;
}

// The job's own engine and files, with the buffers registered; a read job
// starts from a cold cache.
Result<Session> OpenJob(const JobSpec& spec, const Target& target,
                        void* buffers, size_t bytes) {
  STRATA_ASSIGN_OR_RETURN(
      Session session, OpenSession(target, spec.threads, spec.qd, spec.bs, 0));
  STRATA_RETURN_IF_ERROR(session.engine->RegisterBuffer(buffers, bytes));
  for (aio::File* file : session.files) {
    STRATA_RETURN_IF_ERROR(CheckTimedBuffered(file->direct(), spec.seconds));
    if (IsRead(spec.rw)) STRATA_RETURN_IF_ERROR(file->DropCache());
  }
  return session;
}

// The run's wall time and the process's CPU time over it.
struct Timed {
  double seconds = 0;
  double usr = 0;  // over cpu_seconds, which starts after the ramp
  double sys = 0;
  double cpu_seconds = 0;
};

// Runs `job` until every request is back, then unregisters the buffers.
Result<Timed> TimeJob(Job& job, const JobSpec& spec, const Session& session,
                      void* buffers, const ProgressFn& progress) {
  CpuMark start;
  double seconds = 0;
  Status st = job.Run(static_cast<char*>(buffers), progress, &seconds, &start);
  // Buffered writes only count once they are on the device.
  if (st.ok() && IsWrite(spec.rw) && !AllDirect(session.files)) {
    const auto t0 = std::chrono::steady_clock::now();
    for (aio::File* file : session.files) {
      if (st.ok()) st = file->Sync();
    }
    seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
  }
  const CpuMark end = MarkCpu();
  Status wait = session.engine->WaitAll();
  if (st.ok()) st = wait;
  (void)session.engine->UnregisterBuffer(buffers);
  STRATA_RETURN_IF_ERROR(st);
  return Timed{seconds, end.usr - start.usr, end.sys - start.sys,
               (end.ns - start.ns) / 1e9};
}

LatencyUs LatencyOf(const LatencyHistogram& lat) {
  return LatencyUs{.min = lat.min() / 1e3,
                   .mean = lat.mean() / 1e3,
                   .p50 = lat.Percentile(0.50) / 1e3,
                   .p99 = lat.Percentile(0.99) / 1e3,
                   .p999 = lat.Percentile(0.999) / 1e3,
                   .p9999 = lat.Percentile(0.9999) / 1e3,
                   .max = lat.max() / 1e3};
}

// The workers' counts, per direction and in all.
void Tally(const Job& job, JobResult* r) {
  LatencyHistogram all, dir[2];
  DirectionResult* out[2] = {&r->read, &r->write};
  for (const auto& w : job.workers()) {
    for (int d = 0; d < 2; ++d) {
      out[d]->bytes += w->bytes[d].load();
      out[d]->ios += w->ios[d].load();
      dir[d].Merge(w->lat[d]);
      all.Merge(w->lat[d]);
    }
    if (w->fsync) r->syncs += w->fsync->syncs();
    r->files.resize(w->file_ios.size());
    for (size_t f = 0; f < w->file_ios.size(); ++f) {
      r->files[f].ios += w->file_ios[f].load();
      r->files[f].bytes += w->file_ios[f].load() * r->spec.bs;
    }
  }
  for (int d = 0; d < 2; ++d) out[d]->lat = LatencyOf(dir[d]);
  r->bytes = r->read.bytes + r->write.bytes;
  r->ios = r->read.ios + r->write.ios;
  r->lat = LatencyOf(all);
}

JobResult ResultOf(const JobSpec& spec, const Session& session, const Job& job,
                   const Timed& t) {
  JobResult r;
  r.spec = spec;
  const aio::IoInfo& info = session.engine->info();
  r.direct = AllDirect(session.files);
  r.backend = std::string(aio::BackendName(info.backend));
  r.submit_batch = info.submit_batch;
  r.seconds = t.seconds;
  Tally(job, &r);
  r.usr_pct = t.cpu_seconds > 0 ? t.usr / t.cpu_seconds * 100 : 0;
  r.sys_pct = t.cpu_seconds > 0 ? t.sys / t.cpu_seconds * 100 : 0;
  return r;
}

}  // namespace

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string_view RwName(Rw rw) {
  switch (rw) {
    case Rw::kRead:
      return "read";
    case Rw::kWrite:
      return "write";
    case Rw::kRandRead:
      return "randread";
    case Rw::kRandWrite:
      return "randwrite";
    case Rw::kReadWrite:
      return "rw";
    case Rw::kRandReadWrite:
      return "randrw";
  }
  return "?";
}

Result<Rw> ParseRw(std::string_view name) {
  for (Rw rw : {Rw::kRead, Rw::kWrite, Rw::kRandRead, Rw::kRandWrite,
                Rw::kReadWrite, Rw::kRandReadWrite}) {
    if (name == RwName(rw)) return rw;
  }
  return Status::InvalidArgument(
      "unknown --rw '" + std::string(name) +
      "'; use read, write, randread, randwrite, rw or randrw");
}

uint64_t BlocksPerThread(const JobSpec& spec, int files) {
  const uint64_t per_file = FileShare(spec.size, files) / spec.bs;
  return per_file / spec.threads * files;
}

bool AllDirect(const std::vector<aio::File*>& files) {
  return std::all_of(files.begin(), files.end(),
                     [](const aio::File* f) { return f->direct(); });
}

bool WritesRequest(const JobSpec& spec, int ring, uint64_t i) {
  if (!IsMixed(spec.rw)) return IsWrite(spec.rw);
  // A stream of its own per ring, apart from the offsets' permutation.
  const uint64_t draw = Mix64(Mix64(spec.seed ^ 0x72776d6978ull) + ring) ^ i;
  return Mix64(draw) % 100 >= static_cast<uint64_t>(spec.rwmixread);
}

Permutation::Permutation(uint64_t n, uint64_t seed) : n_(n) {
  const int bits = n <= 1 ? 2 : 64 - std::countl_zero(n - 1);
  half_bits_ = (bits + 1) / 2;
  for (int r = 0; r < 4; ++r) keys_[r] = Mix64(seed * 4 + r);
}

uint64_t Permutation::Encrypt(uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_;
  uint64_t right = x & mask;
  for (uint64_t key : keys_) {
    const uint64_t next = left ^ (Mix64(right ^ key) & mask);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t Permutation::operator()(uint64_t i) const {
  uint64_t y = Encrypt(i);
  while (y >= n_) y = Encrypt(y);
  return y;
}

void CpuTimes(double* user, double* sys) {
  rusage ru = {};
  getrusage(RUSAGE_SELF, &ru);
  *user = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6;
  *sys = ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

Status CheckTimedBuffered(bool direct, double seconds) {
  if (direct || seconds <= 0) return Status::Ok();
  // A time-based job loops over the file. Through the page cache every pass
  // after the first reads from memory, and writes rewrite dirty pages that
  // reach the device once.
  return Status::InvalidArgument(
      "--time without O_DIRECT would measure the page cache (reads after the "
      "first pass come from memory; rewritten pages reach the device once): "
      "use --size (one pass, its writes flushed in the time) or a file "
      "system that supports O_DIRECT");
}

Status CheckRamp(double ramp, double seconds) {
  if (ramp < 0) return Status::InvalidArgument("--ramp must be >= 0 seconds");
  if (ramp > 0 && seconds <= 0) {
    return Status::InvalidArgument(
        "--ramp needs --time: a job of one pass has no steady state to ramp "
        "into; add --time S or drop --ramp");
  }
  return Status::Ok();
}

Result<Session> OpenSession(const Target& target, int rings, int qd,
                            size_t block_size, uint64_t file_bytes) {
  aio::IoOptions eo;
  eo.backend = target.backend;
  eo.fault_injector = target.fault_injector;
  eo.rings = rings;
  eo.queue_depth = qd;
  eo.block_size = block_size;
  eo.submit_batch = target.submit_batch;
  STRATA_ASSIGN_OR_RETURN(auto engine, aio::Engine::Open(eo));
  aio::FileOptions fo;
  fo.create = file_bytes != 0 && !target.block_device;
  fo.size = file_bytes;
  fo.direct = target.direct;
  fo.dsync = target.dsync;
  fo.block_device = target.block_device;
  fo.read_only = target.read_only;
  Session session{std::move(engine), {}};
  for (const std::string& path : target.paths) {
    STRATA_ASSIGN_OR_RETURN(aio::File * file,
                            session.engine->OpenFile(path, fo));
    session.files.push_back(file);
  }
  return session;
}

Result<JobSpec> DepthThatRuns(JobSpec spec, aio::Backend backend) {
  if (backend == aio::Backend::kIoUring) return spec;
  aio::IoOptions eo;  // kAuto may choose the threads (STRATA_AIO_BACKEND)
  eo.backend = backend;
  eo.rings = spec.threads;
  eo.queue_depth = spec.qd;
  STRATA_ASSIGN_OR_RETURN(auto probe, aio::Engine::Open(eo));
  const aio::IoInfo& info = probe->info();
  const int pool = info.threads;  // shared by the job's rings
  if (info.backend != aio::Backend::kThreads ||
      pool >= spec.qd * spec.threads) {
    return spec;
  }
  spec.qd_requested = spec.qd;
  spec.qd = std::max(1, pool / spec.threads);
  return spec;
}

Result<JobResult> RunJob(const JobSpec& spec, const Target& target,
                         void* buffers, size_t buffer_bytes,
                         const ProgressFn& progress) {
  const size_t need = static_cast<size_t>(spec.threads) * spec.qd * spec.bs;
  STRATA_CHECK(buffer_bytes >= need);
  STRATA_RETURN_IF_ERROR(CheckRamp(spec.ramp, spec.seconds));
  STRATA_ASSIGN_OR_RETURN(const Session session,
                          OpenJob(spec, target, buffers, need));
  Job job(spec, session.engine.get(), session.files, target);
  STRATA_ASSIGN_OR_RETURN(const Timed timed,
                          TimeJob(job, spec, session, buffers, progress));
  JobResult r = ResultOf(spec, session, job, timed);
  r.dsync = target.dsync;
  return r;
}

}  // namespace strata::bench
