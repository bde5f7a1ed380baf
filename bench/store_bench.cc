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
#include <memory>
#include <string>
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

constexpr uint64_t kMiB = uint64_t{1} << 20;

// The command line, with its defaults.
struct Options {
  int groups = 64, passes = 20;
  uint64_t group_mib = 32, device_mib = 256, host_mib = 1024, nvme_mib = 0;
  double compute_ms = 0;  // synthetic compute per fetch
  std::string swap_dir = "strata-swap", device = "host";

  uint64_t group_bytes() const { return group_mib * kMiB; }
};

void AddOptions(CLI::App& app, Options& o) {
  app.add_option("--groups", o.groups)->check(CLI::Range(1, 100000));
  app.add_option("--group-mib", o.group_mib)->check(CLI::Range(1, 4096));
  app.add_option("--device-budget-mib", o.device_mib);
  app.add_option("--host-budget-mib", o.host_mib);
  app.add_option("--nvme-budget-mib", o.nvme_mib,
                 "default: groups x group size plus 1/8");
  app.add_option("--passes", o.passes)->check(CLI::Range(2, 100000));
  app.add_option("--compute-ms", o.compute_ms, "synthetic compute per fetch");
  app.add_option("--swap-dir", o.swap_dir);
  app.add_option("--device", o.device, "auto, cuda or host");
}

// An engine with every role homed on NVMe, within the budgets asked for.
strata::Result<std::unique_ptr<strata::Engine>> OpenEngine(const Options& o) {
  const uint64_t bytes = o.group_bytes();
  std::filesystem::create_directories(o.swap_dir);
  strata::EngineOptions e;
  e.device = o.device;
  e.device_budget = o.device_mib * kMiB;
  e.host_budget = o.host_mib * kMiB;
  e.nvme_budget = o.nvme_mib > 0 ? o.nvme_mib * kMiB
                                 : o.groups * bytes + o.groups * bytes / 8;
  e.swap_dir = o.swap_dir;
  e.placement.home.fill(strata::Tier::kNvme);
  return strata::Engine::Open(e);
}

// One group per layer, each one fp32 tensor of the group size.
strata::Status RegisterGroups(strata::Engine& engine, const Options& o) {
  for (int g = 0; g < o.groups; ++g) {
    strata::GroupSpec spec;
    spec.name = "layer." + std::to_string(g);
    spec.tensors.push_back({"w",
                            {int64_t(o.group_bytes() / 4)},
                            strata::DType::kFloat32,
                            strata::RoleBit(strata::Role::kCompute)});
    STRATA_RETURN_IF_ERROR(engine.RegisterGroup(spec).status());
  }
  return strata::Status::Ok();
}

// What the passes did: the visits each group has had, the words found
// wrong, and the figures the report compares.
struct Run {
  std::vector<int> order;   // one pass: forward, then reverse
  std::vector<int> visits;  // per group
  std::vector<uint64_t> staging;
  uint64_t bad_words = 0;
  strata::EngineStats after_first;  // the trace is recorded by then
  double steady_seconds = 0;        // passes 1 to the last
};

// One step: each group in `run->order` fetched to the device for writing,
// checked, computed on and rewritten, and released.
strata::Status Pass(strata::Engine& engine, const Options& o, Run* run) {
  engine.BeginStep();
  for (int g : run->order) {
    STRATA_ASSIGN_OR_RETURN(
        strata::GroupView view,
        engine.Fetch(g, strata::Tier::kDevice,
                     {.roles = strata::kAllRoles, .write = true}));
    run->bad_words +=
        CheckAndRewrite(view.tensors[0], g, run->visits[g]++, &run->staging);
    BusyWait(o.compute_ms);
    STRATA_RETURN_IF_ERROR(view.pin.Release());
  }
  return engine.EndStep();
}

strata::Status Measure(strata::Engine& engine, const Options& o, Run* run) {
  for (int g = 0; g < o.groups; ++g) run->order.push_back(g);
  for (int g = o.groups - 1; g >= 0; --g) run->order.push_back(g);
  run->visits.assign(o.groups, 0);
  Clock::time_point steady_start;
  for (int pass = 0; pass < o.passes; ++pass) {
    if (pass == 1) {
      run->after_first = engine.stats();
      steady_start = Clock::now();
    }
    const auto pass_start = Clock::now();
    STRATA_RETURN_IF_ERROR(Pass(engine, o, run));
    std::printf("pass %2d: %.2f s\n", pass, Since(pass_start));
    std::fflush(stdout);
  }
  run->steady_seconds = Since(steady_start);
  return strata::Status::Ok();
}

// Reads each group's last visit's words back through the host.
strata::Status VerifyLast(strata::Engine& engine, const Options& o, Run* run) {
  for (int g = 0; g < o.groups; ++g) {
    STRATA_ASSIGN_OR_RETURN(strata::GroupView view,
                            engine.Fetch(g, strata::Tier::kHost));
    const auto* words = static_cast<const uint64_t*>(view.tensors[0].data);
    for (uint64_t i = 0; i < view.tensors[0].bytes / 8; ++i) {
      run->bad_words += words[i] != Word(g, run->visits[g] - 1, i);
    }
    STRATA_RETURN_IF_ERROR(view.pin.Release());
  }
  return strata::Status::Ok();
}

void Report(const strata::Engine& engine, const Options& o, const Run& run) {
  const strata::EngineStats s = engine.stats();
  const strata::EngineStats& first = run.after_first;
  const uint64_t fetches = s.fetches - first.fetches;
  const double hit_rate = double(s.hits - first.hits) / fetches;
  const double stall = s.stall_seconds - first.stall_seconds;
  const double steady = run.steady_seconds;
  const std::string plan = engine.Explain();
  std::printf("%s", plan.substr(plan.find("per step:")).c_str());
  std::printf(
      "after pass 0: %llu fetches, hit rate %.1f%% (prefetch hits %.1f%%), "
      "stall %.2f s of %.2f s (%.1f%%), compute %.2f s\n",
      (unsigned long long)fetches, 100 * hit_rate,
      100.0 * double(s.prefetch_hits - first.prefetch_hits) / fetches, stall,
      steady, 100 * stall / steady,
      o.compute_ms * 1e-3 * double(run.order.size()) * (o.passes - 1));
  const char* names[] = {"device", "host", "nvme"};
  for (int a = 0; a < 3; ++a) {
    for (int b = 0; b < 3; ++b) {
      if (s.bytes[a][b] == 0) continue;
      std::printf("moved %s->%s: %.2f GiB\n", names[a], names[b],
                  double(s.bytes[a][b]) / (1 << 30));
    }
  }
  std::printf("peak: device %.0f MiB, host %.0f MiB, nvme %.0f MiB\n",
              double(s.tiers[0].peak) / kMiB, double(s.tiers[1].peak) / kMiB,
              double(s.tiers[2].peak) / kMiB);
  std::printf("verify: %s (%llu bad words)\n",
              run.bad_words == 0 ? "OK" : "FAILED",
              (unsigned long long)run.bad_words);
}

// Registers the groups, runs the passes and reads the last bytes back.
strata::Status Bench(strata::Engine& engine, const Options& o, Run* run) {
  STRATA_RETURN_IF_ERROR(RegisterGroups(engine, o));
  STRATA_RETURN_IF_ERROR(Measure(engine, o, run));
  return VerifyLast(engine, o, run);
}

int Fail(const strata::Status& status) {
  std::fprintf(stderr, "store_bench: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata tiered-store benchmark (forward/reverse passes)"};
  Options o;
  AddOptions(app, o);
  CLI11_PARSE(app, argc, argv);

  auto opened = OpenEngine(o);
  if (!opened.ok()) return Fail(opened.status());
  strata::Engine& engine = **opened;
  const strata::EngineInfo& info = engine.info();
  std::printf("device: %s (%s); host tier: %s%s; aio: %s\n",
              info.device.c_str(), info.device_reason.c_str(),
              info.host_backing.c_str(), info.host_locked ? ", locked" : "",
              info.aio_backend.c_str());
  Run run;
  if (strata::Status st = Bench(engine, o, &run); !st.ok()) return Fail(st);
  Report(engine, o, run);
  return run.bad_words == 0 ? 0 : 2;
}
