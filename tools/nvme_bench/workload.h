// One strata-nvme-bench configuration run through the strata aio engine.
//
// A job of T threads is T rings; thread t owns the t-th slice of the job's
// blocks and keeps `qd` requests of `bs` bytes in flight on its own ring,
// resubmitting from the completion callback, which is the job fio's io_uring
// engine runs with numjobs=T, offset_increment=size/T. Random patterns visit
// every block of the slice once per pass in a seeded pseudo-random order.
//
// Note [Striping]: a job may run on several files (or devices). Block b of
// the job lives in file b % F at offset (b / F) * bs, so that sequential
// requests go round robin over the files one block each, as fio's default
// file_service_type=roundrobin does, and every file holds 1/F of the bytes.
// A thread's slice is a multiple of F blocks: it covers one contiguous range
// in every file, which is fio's offset_increment applied to each of its
// files (FioCommand).
#ifndef STRATA_TOOLS_NVME_BENCH_WORKLOAD_H_
#define STRATA_TOOLS_NVME_BENCH_WORKLOAD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/aio.h"
#include "strata/status.h"
#include "tools/nvme_bench/device_stat.h"
#include "tools/nvme_bench/latency.h"

namespace strata::bench {

// fio's names: kReadWrite is "rw" (sequential) and kRandReadWrite "randrw",
// mixed jobs whose requests are each a read with probability rwmixread%.
enum class Rw {
  kRead,
  kWrite,
  kRandRead,
  kRandWrite,
  kReadWrite,
  kRandReadWrite
};

std::string_view RwName(Rw rw);
Result<Rw> ParseRw(std::string_view name);
inline bool IsMixed(Rw rw) {
  return rw == Rw::kReadWrite || rw == Rw::kRandReadWrite;
}
// Whether the job writes at all (a mixed job does): it then needs
// --overwrite on someone else's file, and a buffered run ends with a flush.
inline bool IsWrite(Rw rw) {
  return rw == Rw::kWrite || rw == Rw::kRandWrite || IsMixed(rw);
}
// Whether every request writes (write, randwrite): --fsync applies.
inline bool OnlyWrites(Rw rw) {
  return rw == Rw::kWrite || rw == Rw::kRandWrite;
}
// Whether the job reads at all: a buffered run then starts from a cold cache.
inline bool IsRead(Rw rw) { return !IsWrite(rw) || IsMixed(rw); }
inline bool IsRandom(Rw rw) {
  return rw == Rw::kRandRead || rw == Rw::kRandWrite ||
         rw == Rw::kRandReadWrite;
}

struct JobSpec {
  Rw rw = Rw::kRead;
  size_t bs = 1 << 20;
  int qd = 32;
  int threads = 1;
  uint64_t size = 0;   // bytes the job covers, over all its files
  double seconds = 0;  // > 0: time based, looping over the file
  uint64_t seed = 1;
  int rwmixread = 50;  // mixed jobs: the percentage of requests that read
  double ramp = 0;     // time based: seconds run first and not counted
  // Write jobs: each thread fdatasyncs the file (an asynchronous
  // Engine::Sync) after every `fsync` of its writes are back, and issues no
  // more until it returns; 0: never.
  uint64_t fsync = 0;
  int qd_requested = 0;  // the --qd asked for when `qd` is less, else 0
};

// The blocks of each thread's slice when `spec` runs on `files` files
// (Note [Striping]): a multiple of `files`, 0 when --size is too small.
uint64_t BlocksPerThread(const JobSpec& spec, int files);

// Bytes each of `files` files must hold for a job of `size` bytes: its
// share, whole 4 KiB pages.
inline uint64_t FileShare(uint64_t size, int files) {
  return size / files / 4096 * 4096;
}

// Whether request `i` of ring `ring` writes: for a mixed job drawn from the
// seed, a read with probability spec.rwmixread%.
bool WritesRequest(const JobSpec& spec, int ring, uint64_t i);

// Completion latencies of a run (submit to completion), in microseconds.
struct LatencyUs {
  double min = 0;
  double mean = 0;
  double p50 = 0;
  double p99 = 0;
  double p999 = 0;
  double p9999 = 0;
  double max = 0;
};

// One direction of a mixed job, over the same seconds as the whole.
struct DirectionResult {
  uint64_t bytes = 0;
  uint64_t ios = 0;
  LatencyUs lat;
};

// What one file of a striped job served.
struct FileResult {
  uint64_t bytes = 0;
  uint64_t ios = 0;
};

struct JobResult {
  JobSpec spec;  // as run
  bool direct = true;
  bool dsync = false;  // the file was opened with O_DSYNC
  std::string backend;
  int submit_batch = 0;  // the engine's IoInfo::submit_batch
  uint64_t bytes = 0;
  uint64_t ios = 0;
  uint64_t syncs = 0;  // fdatasyncs of --fsync, summed over threads
  double seconds = 0;
  LatencyUs lat;
  double usr_pct = 0;  // of one core, over the run, summed over threads
  double sys_pct = 0;
  // What the disk under the file served over the run; none when the file
  // is on no block device. Filled by the caller (main.cc), which reads the
  // disk's counters around the run.
  std::optional<DeviceFigures> device;
  // A mixed job's reads and writes, which add up to bytes and ios.
  DirectionResult read;
  DirectionResult write;
  // Per file of the target, in its order; they add up to bytes and ios.
  // Empty for fio, which does not report them.
  std::vector<FileResult> files;

  double gb_per_s() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  double gib_per_s() const {
    return seconds > 0 ? bytes / seconds / (1024.0 * 1024 * 1024) : 0;
  }
  double iops() const { return seconds > 0 ? ios / seconds : 0; }
  // Reads over all requests.
  double read_share() const {
    const uint64_t n = read.ios + write.ios;
    return n > 0 ? static_cast<double>(read.ios) / n : 0;
  }
};

// splitmix64's finalizer: a cheap, well-mixed 64-bit hash.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t NowNs();

// Bijection on [0, n) that visits blocks in a pseudo-random order: a
// 4-round Feistel network on the next power of four, cycle-walked into
// range. Random access, O(1) memory.
class Permutation {
 public:
  Permutation(uint64_t n, uint64_t seed);
  uint64_t operator()(uint64_t i) const;

 private:
  uint64_t Encrypt(uint64_t x) const;
  uint64_t n_;
  int half_bits_;
  uint64_t keys_[4];
};

// What a job has done so far, summed over its threads.
struct JobProgress {
  // Counted as the result counts them: after the ramp.
  uint64_t bytes = 0;
  uint64_t ios = 0;
  uint64_t lat_ns = 0;  // the ios' latencies, summed
  double seconds = 0;   // since the ramp ended; 0 during it
  bool done = false;    // the last report: every request is back
  // For the progress line: the ramp's included.
  uint64_t moved = 0;  // bytes
  double elapsed = 0;  // seconds since the start
};

// How often a job reports its progress (and fio's runs theirs, with
// --log: fio_log.h).
constexpr uint64_t kProgressPeriodNs = 500'000'000;

// Called every kProgressPeriodNs while a job runs, and once when it ends.
using ProgressFn = std::function<void(const JobProgress&)>;

// The files a job runs on and how the engine should treat them.
struct Target {
  std::vector<std::string> paths;  // one or more: Note [Striping]
  bool direct = true;
  aio::Backend backend = aio::Backend::kAuto;
  aio::FaultInjector* fault_injector = nullptr;  // tests only
  // When set, a job or verify run stops early once it reads true and
  // returns kCancelled (Ctrl-C: tools/nvme_bench/interrupt.h).
  const std::atomic<bool>* cancel = nullptr;
  // With JobSpec::ramp: called once, from RunJob's thread, as the counted
  // part begins (strata-nvme-bench reads the disk's counters then).
  std::function<void()> on_ramp_end = nullptr;
  int submit_batch = aio::IoOptions{}.submit_batch;
  bool dsync = false;  // O_DSYNC (--sync)
  // `path` is a raw block device: opened as it is, never created
  // (aio::FileOptions::block_device).
  bool block_device = false;
  bool read_only = false;  // opened O_RDONLY: a run that never writes
};

// An engine shaped for one run, with the target's files open on it.
struct Session {
  std::unique_ptr<aio::Engine> engine;
  std::vector<aio::File*> files;  // as Target::paths
};

// Whether every one of `files` is open with O_DIRECT.
bool AllDirect(const std::vector<aio::File*>& files);

// Refuses a time-based job on a file without O_DIRECT, which would measure
// the page cache; names the fix.
Status CheckTimedBuffered(bool direct, double seconds);

// Refuses a negative ramp, and a ramp without --time; names the fix.
Status CheckRamp(double ramp, double seconds);

// Opens an engine of `rings` rings of depth `qd` that splits at
// `block_size`, and opens the target's files on it, creating and
// preallocating each to `file_bytes` bytes when that is not 0 (a block
// device must hold `file_bytes`).
Result<Session> OpenSession(const Target& target, int rings, int qd,
                            size_t block_size, uint64_t file_bytes);

// `spec` at the depth it can run at: the thread backend's pool runs at
// most one request per pool thread, so a job asking more of it runs at
// what the pool holds (qd_requested then keeps the --qd asked for), and so
// does fio beside it; the latency is then the device's, not a queue's.
Result<JobSpec> DepthThatRuns(JobSpec spec, aio::Backend backend);

// Runs `spec` on `target` with buffers carved from `buffers` (at least
// threads * qd * bs bytes, aligned for O_DIRECT). Opens its own engine so
// that rings and queue depth match the spec, and registers the buffers.
// kCancelled, with no result, when target.cancel stopped it. With
// spec.ramp, only the requests that complete after the ramp count, and the
// CPU time from then on.
Result<JobResult> RunJob(const JobSpec& spec, const Target& target,
                         void* buffers, size_t buffer_bytes,
                         const ProgressFn& progress);

// Process CPU time (user, system) in seconds.
void CpuTimes(double* user, double* sys);

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_WORKLOAD_H_
