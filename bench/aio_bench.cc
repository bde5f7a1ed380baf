// aio_bench: read throughput of the strata aio engine over block size x
// queue depth, against synchronous O_DIRECT pread of the same blocks
// measured in the same process (counter vs_pread_qd1).
//
// Run:
//   build/bin/aio_bench --benchmark_counters_tabular=true
// Environment: STRATA_BENCH_DIR (default: the current directory) holds the
// 512 MiB scratch file; STRATA_AIO_BACKEND picks the backend.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "strata/aio.h"
#include "tools/nvme_bench/workload.h"

namespace strata::bench {
namespace {

constexpr uint64_t kFileBytes = 512ull << 20;
constexpr size_t kPoolBytes = 256u << 20;  // largest bs x qd below

std::string ScratchFile() {
  const char* dir = std::getenv("STRATA_BENCH_DIR");
  return std::string(dir && *dir ? dir : ".") + "/strata-aio-bench.dat";
}

// The file and buffers, created and filled once per process. Every block
// holds its own offset in its first word, which is checked before timing.
struct Fixture {
  std::string path = ScratchFile();
  aio::PinnedBuffer pool;
  Status status;

  Fixture() {
    auto buf =
        aio::PinnedBuffer::Allocate(kPoolBytes, aio::PinOptions{.lock = false});
    if (!buf.ok()) {
      status = buf.status();
      return;
    }
    pool = std::move(*buf);
    auto e = aio::Engine::Open(aio::IoOptions{});
    if (!e.ok()) {
      status = e.status();
      return;
    }
    auto f = (*e)->OpenFile(path, aio::FileOptions{.size = kFileBytes});
    if (!f.ok()) {
      status = f.status();
      return;
    }
    auto* words = static_cast<uint64_t*>(pool.data());
    for (uint64_t off = 0; off < kFileBytes; off += kPoolBytes) {
      for (size_t i = 0; i < kPoolBytes / 8; ++i) {
        words[i] = Mix64(off / 8 + i);
      }
      auto h = (*e)->Write(*f, pool.data(), kPoolBytes, off);
      status = h.ok() ? h->Wait() : h.status();
      if (!status.ok()) return;
    }
    status = (*f)->Sync();
  }
  ~Fixture() { unlink(path.c_str()); }
};

Fixture& Shared() {
  static Fixture fixture;
  return fixture;
}

// Synchronous O_DIRECT pread of the whole file in `bs` blocks: GB/s.
double PreadQd1(size_t bs) {
  static std::map<size_t, double> cache;
  if (auto it = cache.find(bs); it != cache.end()) return it->second;
  const int fd = open(Shared().path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return 0;
  char* buf = static_cast<char*>(Shared().pool.data());
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t off = 0; off < kFileBytes; off += bs) {
    if (pread(fd, buf, bs, static_cast<off_t>(off)) !=
        static_cast<ssize_t>(bs)) {
      close(fd);
      return 0;
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  close(fd);
  return cache[bs] = kFileBytes / secs / 1e9;
}

void BM_Read(benchmark::State& state) {
  Fixture& fx = Shared();
  if (!fx.status.ok()) {
    state.SkipWithError(fx.status.ToString().c_str());
    return;
  }
  const JobSpec spec{Rw::kRead, static_cast<size_t>(state.range(0)),
                     static_cast<int>(state.range(1)), 1, kFileBytes};
  const Target target{{fx.path}};
  // Correctness first: the blocks the job reads hold what was written.
  auto check = RunJob(JobSpec{.rw = Rw::kRead,
                              .bs = spec.bs,
                              .qd = 1,
                              .threads = 1,
                              .size = spec.bs},
                      target, fx.pool.data(), fx.pool.size(), nullptr);
  if (!check.ok() || *static_cast<uint64_t*>(fx.pool.data()) != Mix64(0)) {
    state.SkipWithError("read-back check failed");
    return;
  }
  double seconds = 0;
  uint64_t bytes = 0;
  for (auto _ : state) {
    auto r = RunJob(spec, target, fx.pool.data(), fx.pool.size(), nullptr);
    if (!r.ok()) {
      state.SkipWithError(r.status().ToString().c_str());
      return;
    }
    state.SetIterationTime(r->seconds);
    seconds += r->seconds;
    bytes += r->bytes;
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  const double gbps = bytes / seconds / 1e9;
  state.counters["GB_per_s"] = gbps;
  state.counters["vs_pread_qd1"] = gbps / PreadQd1(spec.bs);
}

BENCHMARK(BM_Read)
    ->ArgNames({"bs", "qd"})
    ->ArgsProduct({{128 << 10, 1 << 20, 8 << 20}, {1, 8, 32}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

}  // namespace
}  // namespace strata::bench

BENCHMARK_MAIN();
