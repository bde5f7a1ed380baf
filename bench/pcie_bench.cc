// pcie_bench: host<->device copy bandwidth through strata's device tier,
// against cudaMemcpy of the same bytes between the same pinned buffers in
// the same run. The driver's own copy is the ceiling: a ratio of 1.0 means
// the tier (its streams, events and checks) costs nothing.
//
// Host memory comes from strata's pinned pool (cudaHostAlloc on a GPU),
// device memory from the device tier's arena. Before timing, the bytes are
// checked: random data goes to the device through strata and comes back
// through cudaMemcpy, then the other way round. Then, for each size and
// direction, --repeat pairs alternate strata (copy, wait on its event) and
// cudaMemcpy (which returns when the copy is done), the first of each pair
// swapping every time; the medians and their ratio are reported.
//
// Run (on a GPU machine; scripts/gpu-check.sh runs it):
//   build/bin/pcie_bench --sizes 1M,16M,256M --repeat 20 --json out.json
// Exit status: 0; 1 on an error or a byte that did not round-trip; 77 when
// there is no GPU (the reason on stderr).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "common/text.h"
#include "src/tier/device.h"
#include "src/tier/pinned_pool.h"

namespace strata {
namespace {

constexpr int kSkip = 77;

struct Buffers {
  std::unique_ptr<tier::Device> device;
  std::unique_ptr<tier::PinnedPool> pool;
  void* dev = nullptr;
  void* host = nullptr;  // two halves of `bytes`: source and destination
  uint64_t bytes = 0;
};

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::Internal(fmt::format(
      "{}: {} ({})", what, cudaGetErrorName(err), cudaGetErrorString(err)));
}

Result<Buffers> Open(uint64_t bytes, int cuda_device) {
  Buffers b;
  b.bytes = bytes;
  STRATA_ASSIGN_OR_RETURN(b.device,
                          tier::OpenDevice({.kind = tier::DeviceKind::kCuda,
                                            .budget = bytes,
                                            .cuda_device = cuda_device}));
  tier::PinnedPoolOptions pool{.budget = 2 * bytes,
                               .gpu_numa_node = b.device->info().numa_node,
                               .host_allocator = b.device->host_allocator()};
  STRATA_ASSIGN_OR_RETURN(b.pool, tier::PinnedPool::Create(pool, nullptr));
  STRATA_ASSIGN_OR_RETURN(b.dev, b.device->Allocate(bytes));
  STRATA_ASSIGN_OR_RETURN(b.host, b.pool->Allocate(2 * bytes));
  return b;
}

Status StrataCopy(Buffers& b, bool to_device, uint64_t n) {
  char* host = static_cast<char*>(b.host);
  Result<tier::Event> e = to_device
                              ? b.device->CopyToDevice(b.dev, host, n)
                              : b.device->CopyToHost(host + b.bytes, b.dev, n);
  return e.ok() ? e->Wait() : e.status();
}

Status CudaCopy(Buffers& b, bool to_device, uint64_t n) {
  char* host = static_cast<char*>(b.host);
  return to_device
             ? CudaStatus(cudaMemcpy(b.dev, host, n, cudaMemcpyHostToDevice),
                          "cudaMemcpy host->device")
             : CudaStatus(
                   cudaMemcpy(host + b.bytes, b.dev, n, cudaMemcpyDeviceToHost),
                   "cudaMemcpy device->host");
}

// Random bytes up one way and back the other, both ways round.
Status CheckRoundTrips(Buffers& b) {
  std::mt19937_64 rng(1);
  auto* words = static_cast<uint64_t*>(b.host);
  for (int strata_up = 1; strata_up >= 0; --strata_up) {
    for (uint64_t i = 0; i < b.bytes / 8; ++i) words[i] = rng();
    std::memset(static_cast<char*>(b.host) + b.bytes, 0, b.bytes);
    Status st =
        strata_up ? StrataCopy(b, true, b.bytes) : CudaCopy(b, true, b.bytes);
    if (st.ok()) {
      st = strata_up ? CudaCopy(b, false, b.bytes)
                     : StrataCopy(b, false, b.bytes);
    }
    if (!st.ok()) return st;
    if (std::memcmp(b.host, static_cast<char*>(b.host) + b.bytes, b.bytes)) {
      return Status::DataLoss(
          fmt::format("bytes changed on the way {} through strata",
                      strata_up ? "up" : "down"));
    }
  }
  return Status::Ok();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

Result<double> TimedGbps(const std::function<Status()>& copy, uint64_t n) {
  const auto start = std::chrono::steady_clock::now();
  STRATA_RETURN_IF_ERROR(copy());
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return n / std::max(s, 1e-9) / 1e9;
}

// One size and direction: --repeat alternating pairs.
Result<nlohmann::json> Measure(Buffers& b, bool to_device, uint64_t n,
                               int repeat) {
  std::vector<double> ours, cuda;
  for (int rep = 0; rep < repeat; ++rep) {
    for (int k = 0; k < 2; ++k) {
      const bool strata_turn = (k == 0) == (rep % 2 == 0);
      Result<double> g = TimedGbps(
          [&] {
            return strata_turn ? StrataCopy(b, to_device, n)
                               : CudaCopy(b, to_device, n);
          },
          n);
      if (!g.ok()) return g.status();
      (strata_turn ? ours : cuda).push_back(*g);
    }
  }
  const double s = Median(ours), c = Median(cuda);
  return nlohmann::json{{"direction", to_device ? "h2d" : "d2h"},
                        {"bytes", n},
                        {"strata_gb_per_s", s},
                        {"cuda_memcpy_gb_per_s", c},
                        {"ratio", s / c},
                        {"strata_runs", ours},
                        {"cuda_memcpy_runs", cuda}};
}

nlohmann::json Versions(const Buffers& b) {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  return {{"gpu", b.device->info().name},
          {"cuda_runtime", runtime},
          {"cuda_driver", driver},
          {"host_memory", b.pool->info().backing}};
}

Result<nlohmann::json> Run(const std::vector<uint64_t>& sizes, int repeat,
                           int cuda_device) {
  STRATA_ASSIGN_OR_RETURN(
      Buffers b,
      Open(*std::max_element(sizes.begin(), sizes.end()), cuda_device));
  STRATA_RETURN_IF_ERROR(CheckRoundTrips(b));
  nlohmann::json report = Versions(b);
  std::printf("pcie_bench: %s, host memory %s, CUDA runtime %d, driver %d\n",
              report["gpu"].get<std::string>().c_str(),
              report["host_memory"].get<std::string>().c_str(),
              report["cuda_runtime"].get<int>(),
              report["cuda_driver"].get<int>());
  std::printf("%-5s %8s  %12s %14s %7s\n", "dir", "bytes", "strata GB/s",
              "cudaMemcpy GB/s", "ratio");
  for (uint64_t n : sizes) {
    for (bool up : {true, false}) {
      STRATA_ASSIGN_OR_RETURN(nlohmann::json row, Measure(b, up, n, repeat));
      std::printf("%-5s %8s  %12.2f %14.2f %7.3f\n", up ? "h2d" : "d2h",
                  SizeText(n).c_str(), row["strata_gb_per_s"].get<double>(),
                  row["cuda_memcpy_gb_per_s"].get<double>(),
                  row["ratio"].get<double>());
      report["rows"].push_back(row);
    }
  }
  b.device->Free(b.dev);
  b.pool->Free(b.host);
  return report;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  CLI::App app{"pcie_bench: strata's host<->device copies vs cudaMemcpy"};
  std::vector<std::string> size_texts = {"1M", "16M", "256M"};
  int repeat = 20, cuda_device = 0;
  std::string json;
  app.add_option("--sizes", size_texts, "Copy sizes")->delimiter(',');
  app.add_option("--repeat", repeat, "Pairs per size and direction")
      ->check(CLI::Range(1, 100000));
  app.add_option("--cuda-device", cuda_device, "CUDA ordinal");
  app.add_option("--json", json, "Also write the figures as JSON");
  CLI11_PARSE(app, argc, argv);
  std::vector<uint64_t> sizes;
  for (const std::string& text : size_texts) {
    strata::Result<uint64_t> n = strata::ParseSize(text);
    if (!n.ok() || *n == 0) {
      std::fprintf(stderr, "pcie_bench: --sizes: '%s' is not a size (1M)\n",
                   text.c_str());
      return 2;
    }
    sizes.push_back(*n);
  }
  std::string why;
  if (!strata::tier::CudaAvailable(&why)) {
    std::fprintf(stderr, "pcie_bench: skipped: %s\n", why.c_str());
    return strata::kSkip;
  }
  strata::Result<nlohmann::json> report =
      strata::Run(sizes, repeat, cuda_device);
  if (!report.ok()) {
    std::fprintf(stderr, "pcie_bench: %s\n",
                 report.status().ToString().c_str());
    return 1;
  }
  if (!json.empty()) std::ofstream(json) << report->dump(2) << "\n";
  return 0;
}
