#include "tools/sim/sim.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#include "cpu_adam/convert.h"
#include "strata/aio.h"
#include "tools/sim/busy.h"

namespace strata::sim {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool KeepsGradients(const OffloadOptimizerOptions& o) {
  return o.micro_batches > 1 || o.mode == OptimMode::kAfterBackward ||
         o.clip_norm > 0 || o.skip_on_overflow;
}

struct Run {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<OffloadOptimizer> optimizer;
  std::vector<uint64_t> layer_params;
  bool on_cuda = false;
};

// The budgets and homes of the offloaded run, or of the resident one.
EngineOptions EngineOptionsFor(const SimOptions& o, bool resident) {
  EngineOptions e;
  e.device = o.device;
  const uint64_t state_bytes = o.params * 12 + o.params * 4;
  const uint64_t compute_bytes = o.params * DTypeSize(o.dtype);
  if (resident) {
    // Unlimited, in effect: every role in memory with room to spare.
    e.device_budget = compute_bytes * 2 + (64u << 20);
    e.host_budget = state_bytes + compute_bytes * 2 + (64u << 20);
  } else {
    e.device_budget = o.device_budget;
    e.host_budget = o.host_budget;
    e.nvme_budget = o.nvme_dir.empty() ? 0 : o.nvme_budget;
    e.swap_dir = o.nvme_dir;
  }
  const Tier state = resident ? Tier::kHost : o.state_home;
  e.placement.home = {resident ? Tier::kDevice : o.params_home, state, state,
                      state, state};
  e.placement.device_roles = RoleBit(Role::kCompute);
  e.state_format = o.state_format;
  return e;
}

Result<Run> Build(const SimOptions& o, bool resident) {
  STRATA_ASSIGN_OR_RETURN(auto engine,
                          Engine::Open(EngineOptionsFor(o, resident)));
  Run run;
  run.engine = std::move(engine);
  run.on_cuda = run.engine->info().device == "cuda";
  RoleMask roles = kAllRoles;
  if (!KeepsGradients(o.optimizer)) roles &= ~RoleBit(Role::kGrad);
  for (int l = 0; l < o.layers; ++l) {
    const uint64_t each = o.params / o.layers;
    const uint64_t n = l + 1 < o.layers ? each : o.params - each * l;
    run.layer_params.push_back(n);
    GroupSpec spec;
    spec.name = "layer." + std::to_string(l);
    spec.tensors.push_back({"w", {static_cast<int64_t>(n)}, o.dtype, roles});
    STRATA_RETURN_IF_ERROR(run.engine->RegisterGroup(spec).status());
  }
  STRATA_ASSIGN_OR_RETURN(
      run.optimizer, OffloadOptimizer::Create(run.engine.get(), o.optimizer));
  return run;
}

// What step `s` hands off: every gradient element equal to `value`, and
// a NaN in the first layer's when `poison`.
struct Gradients {
  float value = 0.01f;
  bool poison = false;
};

// Without clipping, small finite gradients (about 0.01) so the optimizer
// does real arithmetic. With it, gradients whose global norm (summed over
// the micro-batches) is half the clip norm, or twice it on the steps where
// clipping should fire.
Gradients GradientsFor(const SimOptions& o, int s) {
  Gradients g;
  const auto every = [s](int n) { return n > 0 && (s + 1) % n == 0; };
  g.poison = every(o.overflow_every);
  const double clip = o.optimizer.clip_norm;
  if (clip > 0) {
    const double norm = every(o.clip_fires_every) ? 2 * clip : clip / 2;
    g.value = static_cast<float>(
        norm / (o.optimizer.micro_batches * std::sqrt(double(o.params))));
  }
  return g;
}

void WriteGradients(const GradientBuffer& buffer, DType dtype,
                    const Gradients& g, int layer) {
  if (buffer.on_cuda) return;  // zeroed by AcquireGradients: valid too
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const TensorView& t : buffer.tensors) {
    if (dtype == DType::kFloat32) {
      std::fill_n(static_cast<float*>(t.data), t.bytes / 4, g.value);
      if (g.poison && layer == 0) static_cast<float*>(t.data)[0] = nan;
    } else {
      const auto half = [dtype](float f) {
        return dtype == DType::kBFloat16 ? cpu_adam::F32ToBf16(f)
                                         : cpu_adam::F32ToF16(f);
      };
      std::fill_n(static_cast<uint16_t*>(t.data), t.bytes / 2, half(g.value));
      if (g.poison && layer == 0) static_cast<uint16_t*>(t.data)[0] = half(nan);
    }
  }
}

Status Pass(const SimOptions& o, Run& run, bool forward, const Gradients& g,
            StepFigures* f) {
  Engine& engine = *run.engine;
  for (int i = 0; i < o.layers; ++i) {
    const int l = forward ? i : o.layers - 1 - i;
    STRATA_ASSIGN_OR_RETURN(
        GroupView view,
        engine.Fetch(l, Tier::kDevice, {RoleBit(Role::kCompute)}));
    const double flops = (forward ? 2.0 : 4.0) * run.layer_params[l] * o.tokens;
    const double seconds = o.tflops > 0 ? flops / (o.tflops * 1e12) : 0;
    Result<GradientBuffer> grads = GradientBuffer{};
    if (!forward) {
      grads = run.optimizer->AcquireGradients(l);
      STRATA_RETURN_IF_ERROR(grads.status());
    }
    STRATA_RETURN_IF_ERROR(Busy(seconds, run.on_cuda));
    f->compute_seconds += seconds;
    if (!forward) WriteGradients(*grads, o.dtype, g, l);
    STRATA_RETURN_IF_ERROR(view.pin.Release());
    if (!forward) {
      STRATA_RETURN_IF_ERROR(run.optimizer->HandOff(*grads));
    }
  }
  return Status::Ok();
}

Result<StepFigures> OneStep(const SimOptions& o, Run& run, int s) {
  StepFigures f;
  const EngineStats before = run.engine->stats();
  const Clock::time_point start = Clock::now();
  run.engine->BeginStep();
  StepHyper hyper;
  hyper.lr = 1e-4;
  STRATA_RETURN_IF_ERROR(run.optimizer->BeginStep(hyper));
  const Gradients g = GradientsFor(o, s);
  for (int mb = 0; mb < o.optimizer.micro_batches; ++mb) {
    STRATA_RETURN_IF_ERROR(Pass(o, run, true, g, &f));
    STRATA_RETURN_IF_ERROR(Pass(o, run, false, g, &f));
  }
  STRATA_ASSIGN_OR_RETURN(OptimStepReport report, run.optimizer->FinishStep());
  STRATA_RETURN_IF_ERROR(run.engine->EndStep());
  f.seconds = Since(start);
  const EngineStats after = run.engine->stats();
  f.fetch_stall = after.stall_seconds - before.stall_seconds;
  f.update_wait = after.update_wait_seconds - before.update_wait_seconds;
  f.clipped = report.clip_coef < 1.0;
  f.skipped = report.skipped;
  f.speculated = report.speculated;
  f.undone = report.undone;
  f.gradient_wait = report.acquire_wait_seconds;
  f.optimizer_wait = report.finish_wait_seconds;
  f.optimizer_seconds = report.step_seconds;
  f.hidden_fraction =
      report.step_seconds > 0 ? report.hidden_seconds / report.step_seconds : 0;
  f.discarded_bytes = after.discarded_bytes - before.discarded_bytes;
  for (int a = 0; a < kNumTiers; ++a) {
    for (int b = 0; b < kNumTiers; ++b) {
      f.bytes[a][b] = after.bytes[a][b] - before.bytes[a][b];
      for (int r = 0; r < kNumRoles; ++r) {
        f.role_bytes[r][a][b] =
            after.role_bytes[r][a][b] - before.role_bytes[r][a][b];
      }
    }
  }
  return f;
}

// Runs o.steps steps of a model built for `o` (its optimizer mode as
// given); `label` starts each progress line. `peaks` (may be null) gets
// the engine's per-tier peaks and budgets at the end.
Result<std::vector<StepFigures>> Steps(
    const SimOptions& o, bool resident, const std::string& label,
    const std::function<void(const std::string&)>& progress, ModeRun* peaks) {
  STRATA_ASSIGN_OR_RETURN(Run run, Build(o, resident));
  std::vector<StepFigures> steps;
  for (int s = 0; s < o.steps; ++s) {
    STRATA_ASSIGN_OR_RETURN(StepFigures f, OneStep(o, run, s));
    steps.push_back(f);
    progress(fmt::format(
        "{} step {}/{}: {:.2f} s (compute {:.2f} s, "
        "optimizer {:.2f} s, {:.0f}% hidden){}{}",
        label, s + 1, o.steps, f.seconds, f.compute_seconds,
        f.optimizer_seconds, 100 * f.hidden_fraction,
        f.skipped   ? ", skipped"
        : f.clipped ? ", clipped"
                    : "",
        f.speculated > 0 ? fmt::format(", {} of {} speculative group steps "
                                       "undone",
                                       f.undone, f.speculated)
                         : ""));
  }
  if (peaks != nullptr) {
    const EngineStats stats = run.engine->stats();
    for (int t = 0; t < kNumTiers; ++t) {
      peaks->peak[t] = stats.tiers[t].peak;
      peaks->budget[t] = stats.tiers[t].budget;
    }
  }
  return steps;
}

}  // namespace

double SteadySeconds(const std::vector<StepFigures>& steps) {
  const size_t first = steps.size() > 2 ? 2 : 0;
  if (first == steps.size()) return 0;
  double sum = 0;
  for (size_t i = first; i < steps.size(); ++i) sum += steps[i].seconds;
  return sum / static_cast<double>(steps.size() - first);
}

Result<SimResult> Simulate(
    const SimOptions& options,
    const std::function<void(const std::string&)>& progress) {
  SimResult result;
  std::vector<SimOptions> runs;
  for (OptimMode mode : options.modes) {
    runs.push_back(options);
    runs.back().optimizer.mode = mode;
  }
  if (options.compare_unclipped) {
    runs.push_back(options);
    runs.back().optimizer.mode = OptimMode::kOverlap;
    runs.back().optimizer.clip_norm = 0;
    runs.back().optimizer.skip_on_overflow = false;
    runs.back().overflow_every = 0;
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const SimOptions& o = runs[i];
    ModeRun run;
    run.mode = o.optimizer.mode;
    run.clipping = o.optimizer.clip_norm > 0 || o.optimizer.skip_on_overflow;
    run.unclipped = i == options.modes.size();
    const std::string label =
        fmt::format("offloaded ({}{})", OptimModeName(run.mode),
                    run.unclipped ? ", no clipping" : "");
    STRATA_ASSIGN_OR_RETURN(run.steps, Steps(o, false, label, progress, &run));
    result.runs.push_back(std::move(run));
  }
  if (options.resident_baseline) {
    SimOptions o = options;
    o.optimizer.mode = OptimMode::kOverlap;
    Result<std::vector<StepFigures>> resident =
        Steps(o, true, "resident", progress, nullptr);
    if (!resident.ok()) {
      return Status(resident.status().code(),
                    "the resident baseline: " + resident.status().message() +
                        " (it needs the whole model in memory; pass "
                        "--no-baseline to skip it)");
    }
    result.resident = std::move(*resident);
    for (ModeRun& run : result.runs) {
      run.offload_efficiency =
          SteadySeconds(result.resident) / SteadySeconds(run.steps);
    }
  }
  return result;
}

}  // namespace strata::sim
