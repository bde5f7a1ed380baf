#include "tools/plan/probe.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <vector>

#include "common/text.h"
#include "src/tier/device.h"
#include "src/tier/pinned_pool.h"
#include "strata/aio.h"

namespace strata::plan {
namespace {

// Big enough to leave caches and per-request overheads behind, small enough
// that a pass takes milliseconds on any real device.
constexpr size_t kProbeBytes = 64u << 20;

struct Timing {
  int passes = 0;
  double total_s = 0;
  double best_s = 0;
};

// Runs `pass` at least once, then again until `budget_s` seconds are spent
// or `max_passes` have run.
Result<Timing> TimePasses(double budget_s, int max_passes,
                          const std::function<Status()>& pass) {
  using Clock = std::chrono::steady_clock;
  Timing t;
  while (t.passes == 0 || (t.total_s < budget_s && t.passes < max_passes)) {
    const Clock::time_point start = Clock::now();
    STRATA_RETURN_IF_ERROR(pass());
    const double s = std::max(
        1e-9, std::chrono::duration<double>(Clock::now() - start).count());
    t.best_s = t.passes == 0 ? s : std::min(t.best_s, s);
    t.total_s += s;
    ++t.passes;
  }
  return t;
}

// Incompressible data, so a compressing drive or file system cannot flatter
// the write figure.
void FillPattern(void* data, size_t bytes) {
  auto* words = static_cast<uint64_t*>(data);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < bytes / sizeof(uint64_t); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    words[i] = x;
  }
}

Result<NvmeProbe> ProbeFile(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto engine, aio::Engine::Open(aio::IoOptions{}));
  aio::FileOptions file_options;
  file_options.size = kProbeBytes;
  STRATA_ASSIGN_OR_RETURN(aio::File * file,
                          engine->OpenFile(path, file_options));
  // Unlocked: the probe must not fail for a low RLIMIT_MEMLOCK, and page
  // pinning per request costs little at 1 MiB pieces.
  aio::PinOptions pin;
  pin.lock = false;
  STRATA_ASSIGN_OR_RETURN(auto buf,
                          aio::PinnedBuffer::Allocate(kProbeBytes, pin));
  FillPattern(buf.data(), kProbeBytes);
  aio::Engine* e = engine.get();
  aio::File* f = file;
  auto transfer = [&](bool write) -> Status {
    aio::Request request;
    request.file = f;
    request.buf = buf.data();
    request.len = kProbeBytes;
    request.write = write;
    STRATA_ASSIGN_OR_RETURN(aio::Handle h, e->Submit(std::move(request)));
    Status st = h.Wait();
    if (!st.ok() || !write) return st;
    return f->Sync();
  };
  Result<Timing> w = TimePasses(0.4, 32, [&] { return transfer(true); });
  if (!w.ok()) return w.status();
  // A buffered file would otherwise be read from the page cache.
  Result<Timing> r = TimePasses(0.3, 32, [&] {
    Status st = f->DropCache();
    return st.ok() ? transfer(false) : st;
  });
  if (!r.ok()) return r.status();
  const aio::IoInfo& info = e->info();
  const std::string how = fmt::format(
      "{} at a time through {} ({} pieces, {} in flight), {}",
      HumanBytes(kProbeBytes), aio::BackendName(info.backend),
      HumanBytes(info.block_size), info.queue_depth,
      f->direct() ? "O_DIRECT"
                  : "buffered: the file system refused O_DIRECT, so this "
                    "is the page cache's speed, not the drive's");
  NvmeProbe out;
  out.write = {
      w->passes * kProbeBytes / w->total_s / 1e9,
      fmt::format("{} writes + fdatasync of {}; {}", w->passes, path, how)};
  out.read = {r->passes * kProbeBytes / r->total_s / 1e9,
              fmt::format("{} reads of {}; {}", r->passes, path, how)};
  return out;
}

// Times one direction of copies over the device tier, best of the passes.
ProbeResult TimeCopy(const std::function<Result<tier::Event>()>& copy,
                     const std::string& gpu) {
  Result<Timing> t = TimePasses(0.1, 64, [&]() -> Status {
    Result<tier::Event> event = copy();
    return event.ok() ? event->Wait() : event.status();
  });
  if (!t.ok()) return {0, "not measured: " + t.status().message()};
  return {kProbeBytes / t->best_s / 1e9,
          fmt::format("pinned copies of {} on {} through the device tier, "
                      "best of {}",
                      HumanBytes(kProbeBytes), gpu, t->passes)};
}

// Both directions between a pinned pool and a CUDA device tier.
Status ProbeCuda(PcieProbe* out) {
  tier::DeviceOptions device_options;
  device_options.kind = tier::DeviceKind::kCuda;
  device_options.budget = kProbeBytes;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<tier::Device> device,
                          tier::OpenDevice(device_options));
  tier::Device* d = device.get();
  tier::PinnedPoolOptions pool_options;
  pool_options.budget = kProbeBytes;
  pool_options.host_allocator = d->host_allocator();
  pool_options.gpu_numa_node = d->info().numa_node;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<tier::PinnedPool> pool,
                          tier::PinnedPool::Create(pool_options, nullptr));
  STRATA_ASSIGN_OR_RETURN(void* dev, d->Allocate(kProbeBytes));
  Result<void*> host = pool->Allocate(kProbeBytes);
  if (!host.ok()) {
    d->Free(dev);
    return host.status();
  }
  const std::string& gpu = d->info().name;
  out->h2d =
      TimeCopy([&] { return d->CopyToDevice(dev, *host, kProbeBytes); }, gpu);
  out->d2h =
      TimeCopy([&] { return d->CopyToHost(*host, dev, kProbeBytes); }, gpu);
  pool->Free(*host);
  d->Free(dev);
  return Status::Ok();
}

}  // namespace

ProbeResult ProbeHostMemory() {
  std::vector<char> src(kProbeBytes, 1);
  std::vector<char> dst(kProbeBytes, 0);
  volatile char sink = 0;
  Result<Timing> t = TimePasses(0.2, 64, [&] {
    std::memcpy(dst.data(), src.data(), kProbeBytes);
    sink = dst[kProbeBytes / 2];  // keeps the copy observable
    return Status::Ok();
  });
  STRATA_CHECK(t.ok());
  return {2.0 * kProbeBytes / t->best_s / 1e9,
          fmt::format("memcpy of {}, bytes read + written, best of {}",
                      HumanBytes(kProbeBytes), t->passes)};
}

Result<NvmeProbe> ProbeNvme(const std::string& dir) {
  const std::string path =
      (std::filesystem::path(dir) /
       ("strata-plan-probe." + std::to_string(getpid()) + ".dat"))
          .string();
  Result<NvmeProbe> out = ProbeFile(path);
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return out;
}

PcieProbe ProbePcie() {
  PcieProbe out;
  std::string why;
  if (!tier::CudaAvailable(&why)) {
    out.h2d.note = out.d2h.note = "not measured: " + why;
    return out;
  }
  const Status st = ProbeCuda(&out);
  if (!st.ok()) out.h2d.note = out.d2h.note = "not measured: " + st.message();
  return out;
}

}  // namespace strata::plan
