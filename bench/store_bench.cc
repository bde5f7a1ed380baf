// store_bench: the tiered store under a layer-by-layer training access
// pattern, verified byte for byte.
//
// G groups of S bytes each (one fp32 tensor, homed on NVMe) are fetched to
// the device in forward-then-reverse order for P passes; a pass is one
// step (BeginStep/EndStep), so the first pass records the trace and the
// others prefetch along it. Each fetch checks the bytes the previous visit
// wrote, busy-waits --compute-ms (the synthetic compute of the layer) and
// writes new bytes. Reports, after the first pass: the hit rate (fetches
// whose data was resident on arrival), the stall time against the run time,
// and the bytes moved per tier pair; plus the plan's I/O floor per pass.
//
// On a CUDA device a view's data is device memory, which the host cannot
// touch: each visit then copies the group to a host staging buffer, checks
// and rewrites it there and copies it back, waiting until the bytes have
// landed before Release; that copying counts as the visit's compute.
//
// Run (the acceptance scenario; 2 GiB, needs ~3 GiB free in the swap dir):
//   build/bin/store_bench --groups 64 --group-mib 32 --device-budget-mib 256
//       --host-budget-mib 1024 --passes 20 --compute-ms 40 --swap-dir DIR
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "strata/engine.h"

#if STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The word each 8-byte slot of group g holds after visit v.
uint64_t Word(int group, int visit, uint64_t i) {
  return (uint64_t(group) << 48) ^ (uint64_t(visit) << 32) ^
         (i * 0x9E3779B97F4A7C15ull);
}

#if STRATA_HAVE_CUDA
bool CudaOk(cudaError_t err) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "store_bench: CUDA: %s (%s)\n", cudaGetErrorName(err),
                 cudaGetErrorString(err));
  }
  return err == cudaSuccess;
}
#endif

// Checks that `view` holds visit - 1's words of group g (zeros before the
// first visit), then writes visit's words; returns the bad words (all of
// them when a copy through the staging buffer fails).
uint64_t CheckAndRewrite(const strata::TensorView& view, int g, int visit,
                         std::vector<uint64_t>* staging) {
  uint64_t* words = static_cast<uint64_t*>(view.data);
  const uint64_t n = view.bytes / 8;
#if STRATA_HAVE_CUDA
  if (view.on_cuda) {
    staging->resize(n);
    if (!CudaOk(cudaMemcpy(staging->data(), view.data, view.bytes,
                           cudaMemcpyDeviceToHost))) {
      return n;
    }
    words = staging->data();
  }
#endif
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t expect = visit == 0 ? 0 : Word(g, visit - 1, i);
    bad += words[i] != expect;
    words[i] = Word(g, visit, i);
  }
#if STRATA_HAVE_CUDA
  // From pageable memory cudaMemcpy may return before the copy has landed;
  // the engine's streams do not wait for the legacy stream it ran on.
  if (view.on_cuda && (!CudaOk(cudaMemcpy(view.data, words, view.bytes,
                                          cudaMemcpyHostToDevice)) ||
                       !CudaOk(cudaStreamSynchronize(cudaStreamLegacy)))) {
    return n;
  }
#endif
  return bad;
}

void BusyWait(double ms) {
  const auto until =
      Clock::now() + std::chrono::duration<double, std::milli>(ms);
  while (Clock::now() < until) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata tiered-store benchmark (forward/reverse passes)"};
  int groups = 64, passes = 20;
  uint64_t group_mib = 32, device_mib = 256, host_mib = 1024, nvme_mib = 0;
  double compute_ms = 0;
  std::string swap_dir = "strata-swap", device = "host";
  app.add_option("--groups", groups)->check(CLI::Range(1, 100000));
  app.add_option("--group-mib", group_mib)->check(CLI::Range(1, 4096));
  app.add_option("--device-budget-mib", device_mib);
  app.add_option("--host-budget-mib", host_mib);
  app.add_option("--nvme-budget-mib", nvme_mib,
                 "default: groups x group size plus 1/8");
  app.add_option("--passes", passes)->check(CLI::Range(2, 100000));
  app.add_option("--compute-ms", compute_ms, "synthetic compute per fetch");
  app.add_option("--swap-dir", swap_dir);
  app.add_option("--device", device, "auto, cuda or host");
  CLI11_PARSE(app, argc, argv);

  const uint64_t mib = uint64_t{1} << 20;
  const uint64_t bytes = group_mib * mib;
  std::filesystem::create_directories(swap_dir);
  strata::EngineOptions o;
  o.device = device;
  o.device_budget = device_mib * mib;
  o.host_budget = host_mib * mib;
  o.nvme_budget =
      nvme_mib > 0 ? nvme_mib * mib : groups * bytes + groups * bytes / 8;
  o.swap_dir = swap_dir;
  o.placement.home.fill(strata::Tier::kNvme);
  auto opened = strata::Engine::Open(o);
  if (!opened.ok()) {
    std::fprintf(stderr, "store_bench: %s\n",
                 opened.status().ToString().c_str());
    return 1;
  }
  strata::Engine& engine = **opened;
  std::printf("device: %s (%s); host tier: %s%s; aio: %s\n",
              engine.info().device.c_str(), engine.info().device_reason.c_str(),
              engine.info().host_backing.c_str(),
              engine.info().host_locked ? ", locked" : "",
              engine.info().aio_backend.c_str());
  for (int g = 0; g < groups; ++g) {
    strata::GroupSpec spec;
    spec.name = "layer." + std::to_string(g);
    spec.tensors.push_back({"w",
                            {int64_t(bytes / 4)},
                            strata::DType::kFloat32,
                            strata::RoleBit(strata::Role::kCompute)});
    auto id = engine.RegisterGroup(spec);
    if (!id.ok()) {
      std::fprintf(stderr, "store_bench: %s\n", id.status().ToString().c_str());
      return 1;
    }
  }
  std::vector<int> order;
  for (int g = 0; g < groups; ++g) order.push_back(g);
  for (int g = groups - 1; g >= 0; --g) order.push_back(g);
  std::vector<int> visits(groups, 0);
  std::vector<uint64_t> staging;
  uint64_t bad_words = 0;
  strata::EngineStats after_first;
  Clock::time_point steady_start;
  for (int pass = 0; pass < passes; ++pass) {
    if (pass == 1) {
      after_first = engine.stats();
      steady_start = Clock::now();
    }
    const auto pass_start = Clock::now();
    engine.BeginStep();
    for (int g : order) {
      auto view =
          engine.Fetch(g, strata::Tier::kDevice, {strata::kAllRoles, true});
      if (!view.ok()) {
        std::fprintf(stderr, "store_bench: %s\n",
                     view.status().ToString().c_str());
        return 1;
      }
      bad_words += CheckAndRewrite(view->tensors[0], g, visits[g]++, &staging);
      BusyWait(compute_ms);
      if (auto s = engine.Release(g); !s.ok()) return 1;
    }
    if (auto s = engine.EndStep(); !s.ok()) return 1;
    std::printf("pass %2d: %.2f s\n", pass, Since(pass_start));
    std::fflush(stdout);
  }
  const double steady = Since(steady_start);
  for (int g = 0; g < groups; ++g) {  // the last visit's bytes, via the host
    auto view = engine.Fetch(g, strata::Tier::kHost);
    if (!view.ok()) {
      std::fprintf(stderr, "store_bench: %s\n",
                   view.status().ToString().c_str());
      return 1;
    }
    const auto* words = static_cast<const uint64_t*>(view->tensors[0].data);
    for (uint64_t i = 0; i < view->tensors[0].bytes / 8; ++i) {
      bad_words += words[i] != Word(g, visits[g] - 1, i);
    }
    if (auto st = engine.Release(g); !st.ok()) return 1;
  }
  const strata::EngineStats s = engine.stats();
  const uint64_t fetches = s.fetches - after_first.fetches;
  const double hit_rate = double(s.hits - after_first.hits) / fetches;
  const double stall = s.stall_seconds - after_first.stall_seconds;
  const std::string plan = engine.Explain();
  std::printf("%s", plan.substr(plan.find("per step:")).c_str());
  std::printf(
      "after pass 0: %llu fetches, hit rate %.1f%% (prefetch hits %.1f%%), "
      "stall %.2f s of %.2f s (%.1f%%), compute %.2f s\n",
      (unsigned long long)fetches, 100 * hit_rate,
      100.0 * double(s.prefetch_hits - after_first.prefetch_hits) / fetches,
      stall, steady, 100 * stall / steady,
      compute_ms * 1e-3 * double(order.size()) * (passes - 1));
  const char* names[] = {"device", "host", "nvme"};
  for (int a = 0; a < 3; ++a) {
    for (int b = 0; b < 3; ++b) {
      if (s.bytes[a][b] == 0) continue;
      std::printf("moved %s->%s: %.2f GiB\n", names[a], names[b],
                  double(s.bytes[a][b]) / (1 << 30));
    }
  }
  std::printf("peak: device %.0f MiB, host %.0f MiB, nvme %.0f MiB\n",
              double(s.tiers[0].peak) / mib, double(s.tiers[1].peak) / mib,
              double(s.tiers[2].peak) / mib);
  std::printf("verify: %s (%llu bad words)\n", bad_words == 0 ? "OK" : "FAILED",
              (unsigned long long)bad_words);
  return bad_words == 0 ? 0 : 2;
}
