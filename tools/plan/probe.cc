#include "tools/plan/probe.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <vector>

#include "strata/aio.h"

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

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
    Status st = pass();
    if (!st.ok()) return st;
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
  auto engine = aio::Engine::Open(aio::EngineOptions{});
  if (!engine.ok()) return engine.status();
  aio::FileOptions file_options;
  file_options.size = kProbeBytes;
  Result<aio::File*> file = (*engine)->OpenFile(path, file_options);
  if (!file.ok()) return file.status();
  // Unlocked: the probe must not fail for a low RLIMIT_MEMLOCK, and page
  // pinning per request costs little at 1 MiB pieces.
  aio::PinOptions pin;
  pin.lock = false;
  auto buf = aio::PinnedBuffer::Allocate(kProbeBytes, pin);
  if (!buf.ok()) return buf.status();
  FillPattern(buf->data(), kProbeBytes);
  aio::Engine* e = engine->get();
  aio::File* f = *file;
  auto transfer = [&](bool write) -> Status {
    aio::Request request;
    request.file = f;
    request.buf = buf->data();
    request.len = kProbeBytes;
    request.write = write;
    Result<aio::Handle> h = e->Submit(std::move(request));
    if (!h.ok()) return h.status();
    Status st = h->Wait();
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
  const aio::EngineInfo& info = e->info();
  const std::string how = fmt::format(
      "{} at a time through {} ({} pieces, {} in flight), {}",
      aio::HumanBytes(kProbeBytes), aio::BackendName(info.backend),
      aio::HumanBytes(info.block_size), info.queue_depth,
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

#ifdef STRATA_HAVE_CUDA
Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kInternal,
                std::string(what) + ": " + cudaGetErrorString(err));
}

ProbeResult TimeCopy(void* dst, const void* src, cudaMemcpyKind kind,
                     const std::string& gpu) {
  Result<Timing> t = TimePasses(0.1, 64, [&] {
    return CudaStatus(cudaMemcpy(dst, src, kProbeBytes, kind), "cudaMemcpy");
  });
  if (!t.ok()) return {0, "not measured: " + t.status().message()};
  return {kProbeBytes / t->best_s / 1e9,
          fmt::format("pinned cudaMemcpy of {} on {}, best of {}",
                      aio::HumanBytes(kProbeBytes), gpu, t->passes)};
}
#endif

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
                      aio::HumanBytes(kProbeBytes), t->passes)};
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

#ifdef STRATA_HAVE_CUDA
PcieProbe ProbePcie() {
  PcieProbe out;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    const std::string why =
        err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device";
    out.h2d.note = out.d2h.note = "not measured: no GPU (" + why + ")";
    return out;
  }
  cudaDeviceProp prop = {};
  const std::string gpu =
      cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.name : "GPU 0";
  void* host = nullptr;
  void* dev = nullptr;
  Status st = CudaStatus(cudaMallocHost(&host, kProbeBytes), "cudaMallocHost");
  if (st.ok()) st = CudaStatus(cudaMalloc(&dev, kProbeBytes), "cudaMalloc");
  if (st.ok()) {
    out.h2d = TimeCopy(dev, host, cudaMemcpyHostToDevice, gpu);
    out.d2h = TimeCopy(host, dev, cudaMemcpyDeviceToHost, gpu);
  } else {
    out.h2d.note = out.d2h.note = "not measured: " + st.message();
  }
  cudaFree(dev);
  cudaFreeHost(host);
  return out;
}
#else
PcieProbe ProbePcie() {
  PcieProbe out;
  out.h2d.note = out.d2h.note = "not measured: this build has no CUDA";
  return out;
}
#endif

}  // namespace strata::plan
