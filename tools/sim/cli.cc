// strata-sim's command line, its report and strata-plan's floor for the
// simulated placement.
#include "tools/sim/cli.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>
#include <tuple>
#include <vector>

#include "common/cli.h"
#include "common/text.h"
#include "tools/plan/cli.h"
#include "tools/plan/estimate.h"

namespace strata::sim {
namespace {

// The options given as text, resolved after parsing so that every error
// names its flag.
struct Texts {
  std::string params = "1G", dtype = "bf16", state_dtype = "fp32",
              device_budget = "256M", host_budget = "3G", nvme_budget,
              params_home = "host", state_home = "nvme";
  std::vector<std::string> modes = {"overlap"};
};

// The model, the device, the tiers' budgets and where the roles live.
void AddModelOptions(CLI::App& app, SimOptions& o, Texts& text) {
  app.add_option("--params", text.params, "Total parameters (1G, 350M, ...)")
      ->capture_default_str();
  app.add_option("--layers", o.layers, "Layers (one group each)")->required();
  app.add_option("--dtype", text.dtype, "Compute dtype: bf16, fp16, fp32")
      ->capture_default_str();
  app.add_option("--state-dtype", text.state_dtype,
                 "Optimizer state: fp32, bf16 or int8")
      ->capture_default_str();
  app.add_option("--device", o.device, "auto, cuda or host (emulated)")
      ->capture_default_str();
  app.add_option("--device-budget", text.device_budget, "Device bytes")
      ->capture_default_str();
  app.add_option("--host-budget", text.host_budget, "Pinned host bytes")
      ->capture_default_str();
  app.add_option("--nvme", o.nvme_dir, "Swap directory (NVMe tier)");
  app.add_option("--nvme-budget", text.nvme_budget,
                 "Swap bytes (default: what the model needs, plus room)");
  app.add_option("--params-home", text.params_home,
                 "Compute copy home: host or nvme")
      ->capture_default_str();
  app.add_option("--state-home", text.state_home,
                 "Master, m, v home: host or nvme (nvme needs --nvme)")
      ->capture_default_str();
}

// The steps and their synthetic compute, the optimizer, and the report.
void AddRunOptions(CLI::App& app, CliOptions& cli, Texts& text) {
  SimOptions& o = cli.sim;
  app.add_option("--steps", o.steps, "Steps")->capture_default_str();
  app.add_option("--tflops", o.tflops,
                 "Synthetic device speed, TFLOP/s (0: no compute)")
      ->capture_default_str();
  app.add_option("--tokens", o.tokens, "Tokens per micro-batch")
      ->capture_default_str();
  app.add_option("--mode", text.modes,
                 "overlap, after_backward, or both comma-separated (each "
                 "runs in turn against one resident baseline)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--micro-batches", o.optimizer.micro_batches,
                 "Gradient accumulation steps")
      ->capture_default_str();
  app.add_option("--clip-norm", o.optimizer.clip_norm,
                 "Global-norm clipping (0: off)")
      ->capture_default_str();
  app.add_option("--clip-fires-every", o.clip_fires_every,
                 "With --clip-norm: the gradients' norm is twice the clip "
                 "norm every N-th step, half of it otherwise (0: never)")
      ->capture_default_str();
  app.add_flag("--skip-on-overflow", o.optimizer.skip_on_overflow,
               "Skip a step whose gradients are not finite");
  app.add_option("--overflow-every", o.overflow_every,
                 "Put a NaN in the gradients every N-th step (needs "
                 "--skip-on-overflow; 0: never)")
      ->capture_default_str();
  app.add_flag("--speculate,!--no-speculate", o.optimizer.speculate,
               "With clipping or skipping in overlap mode, state homed on "
               "NVMe steps speculatively under backward, undone when "
               "clipping fires or a step is skipped (default); "
               "--no-speculate steps it under the next forward")
      ->capture_default_str();
  app.add_flag("--compare-unclipped", o.compare_unclipped,
               "Also run overlap mode with clipping and skipping off, for "
               "the cost of exactness in the same run");
  app.add_option("--threads", o.optimizer.threads,
                 "CPU optimizer threads (0: all usable cores but one)")
      ->capture_default_str();
  app.add_flag("--measure", cli.measure,
               "Measure host memory and NVMe bandwidth for the floor (about "
               "2 s) instead of assuming strata-plan's defaults");
  app.add_flag("!--no-baseline", o.resident_baseline,
               "Skip the resident run (no offload_efficiency)");
  app.add_option("--json", cli.json_path, "Also write the report as JSON");
}

Status ResolveModel(const Texts& text, SimOptions* o) {
  STRATA_ASSIGN_OR_RETURN(
      o->params, ForFlag("--params", plan::ParseParamCount(text.params)));
  if (o->layers < 1 || static_cast<uint64_t>(o->layers) > o->params) {
    return Status::InvalidArgument("--layers must be in 1..params");
  }
  STRATA_ASSIGN_OR_RETURN(o->dtype, ForFlag("--dtype", ParseDType(text.dtype)));
  STRATA_ASSIGN_OR_RETURN(
      o->state_format,
      ForFlag("--state-dtype", ParseStateFormat(text.state_dtype)));
  return Status::Ok();
}

Status ResolveModes(const Texts& text, SimOptions* o) {
  o->modes.clear();
  for (const std::string& name : text.modes) {
    STRATA_ASSIGN_OR_RETURN(OptimMode mode,
                            ForFlag("--mode", ParseOptimMode(name)));
    o->modes.push_back(mode);
  }
  if (o->modes.empty()) {
    return Status::InvalidArgument("--mode: give at least one mode");
  }
  if (o->clip_fires_every < 0 || o->overflow_every < 0) {
    return Status::InvalidArgument(
        "--clip-fires-every and --overflow-every must be >= 0 (0: never)");
  }
  if (o->clip_fires_every > 0 && !(o->optimizer.clip_norm > 0)) {
    return Status::InvalidArgument(
        "--clip-fires-every needs clipping on: give --clip-norm too");
  }
  if (o->overflow_every > 0 && !o->optimizer.skip_on_overflow) {
    return Status::InvalidArgument(
        "--overflow-every injects NaN gradients, which fail the step "
        "unless it is skipped: give --skip-on-overflow too");
  }
  if ((o->clip_fires_every > 0 || o->overflow_every > 0) &&
      o->device != "host") {
    return Status::InvalidArgument(
        "--clip-fires-every and --overflow-every write the gradients on "
        "the CPU: run them with --device host");
  }
  return Status::Ok();
}

// Each role's home is host or nvme; NVMe needs a swap directory.
Status ResolveHomes(const Texts& text, SimOptions* o) {
  for (auto [flag, name, home] :
       {std::tuple{"--params-home", text.params_home, &o->params_home},
        std::tuple{"--state-home", text.state_home, &o->state_home}}) {
    Result<Tier> tier = ParseTier(name);
    if (!tier.ok() || *tier == Tier::kDevice) {
      return Status::InvalidArgument(std::string(flag) +
                                     ": host or nvme, not '" + name + "'");
    }
    *home = *tier;
  }
  const bool uses_nvme =
      o->params_home == Tier::kNvme || o->state_home == Tier::kNvme;
  if (uses_nvme && o->nvme_dir.empty()) {
    return Status::InvalidArgument(
        "a role is homed on NVMe: give the swap directory with "
        "--nvme DIR (or --state-home host --params-home host)");
  }
  return Status::Ok();
}

Status ResolveBudgets(const Texts& text, SimOptions* o) {
  STRATA_ASSIGN_OR_RETURN(
      o->device_budget,
      ForFlag("--device-budget", ParseSize(text.device_budget)));
  STRATA_ASSIGN_OR_RETURN(
      o->host_budget, ForFlag("--host-budget", ParseSize(text.host_budget)));
  if (!text.nvme_budget.empty()) {
    STRATA_ASSIGN_OR_RETURN(
        o->nvme_budget, ForFlag("--nvme-budget", ParseSize(text.nvme_budget)));
  } else if (!o->nvme_dir.empty()) {
    // Everything homed there, gradients included, and the speculative
    // steps' second copy of master, m and v, plus 1/8 for extents.
    const OffloadOptimizerOptions& opt = o->optimizer;
    const bool spares =
        opt.speculate && (opt.clip_norm > 0 || opt.skip_on_overflow);
    o->nvme_budget =
        o->params * (16 + (spares ? 12 : 0) + DTypeSize(o->dtype)) * 9 / 8;
  }
  return Status::Ok();
}

}  // namespace

Result<CliOptions> ParseCommandLine(int argc, char** argv, bool* exit_now) {
  CliOptions cli;
  Texts text;
  CLI::App app(
      "strata-sim: a training step of a synthetic model through "
      "the whole engine",
      "strata-sim");
  AddModelOptions(app, cli.sim, text);
  AddRunOptions(app, cli, text);
  STRATA_RETURN_IF_ERROR(ParseArgs(app, argc, argv, exit_now));
  if (*exit_now) return cli;
  STRATA_RETURN_IF_ERROR(ResolveModel(text, &cli.sim));
  STRATA_RETURN_IF_ERROR(ResolveModes(text, &cli.sim));
  STRATA_RETURN_IF_ERROR(ResolveHomes(text, &cli.sim));
  STRATA_RETURN_IF_ERROR(ResolveBudgets(text, &cli.sim));
  cli.rates.swap_dir = cli.sim.nvme_dir;
  return cli;
}

namespace {

// strata-plan's model of the simulated placement: the compute copy and the
// optimizer state where the simulation homes them, gradients on the device.
plan::Floor PlanFloor(const CliOptions& cli, double* host_gb) {
  const SimOptions& o = cli.sim;
  // The master's 4 bytes and m's and v's (int8's scales, 1.6%, left out).
  const uint32_t k = o.state_format == StateFormat::kF32    ? 12
                     : o.state_format == StateFormat::kBF16 ? 8
                                                            : 6;
  plan::Model model{.params = o.params, .dtype = o.dtype, .k = k};
  plan::Placement placement;
  const plan::Tier tiers[] = {static_cast<plan::Tier>(o.params_home),
                              plan::Tier::kDevice,
                              static_cast<plan::Tier>(o.state_home),
                              static_cast<plan::Tier>(o.state_home)};
  for (int r = 0; r < plan::kNumRoles; ++r) {
    const plan::Role role = plan::kRoles[r];
    const uint64_t bytes = o.params * plan::BytesPerParam(model, role);
    placement.roles[r] = {role, tiers[r], bytes, true};
    placement.needs[static_cast<int>(tiers[r])] += bytes;
  }
  const auto link_bytes = plan::LinkBytes(plan::StepTraffic(model, placement));
  *host_gb = link_bytes[static_cast<int>(plan::Link::kHostMemory)] / 1e9;
  return plan::StepFloor(model, link_bytes, plan::RatesOf(cli.rates));
}

std::string PairName(int from, int to) {
  return fmt::format("{}->{}", TierName(static_cast<Tier>(from)),
                     TierName(static_cast<Tier>(to)));
}

// {"nvme->host": bytes, ...}, the pairs that moved nothing left out.
nlohmann::ordered_json TierBytesJson(const EngineStats::TierBytes& moved) {
  nlohmann::ordered_json bytes = nlohmann::ordered_json::object();
  for (int a = 0; a < kNumTiers; ++a) {
    for (int b = 0; b < kNumTiers; ++b) {
      if (moved[a][b] != 0) bytes[PairName(a, b)] = moved[a][b];
    }
  }
  return bytes;
}

bool MovedAny(const EngineStats::TierBytes& moved) {
  for (const auto& row : moved) {
    for (uint64_t b : row) {
      if (b != 0) return true;
    }
  }
  return false;
}

nlohmann::ordered_json StepJson(const StepFigures& f) {
  // {"master": {"nvme->host": bytes, ...}, ...}, roles that moved nothing
  // left out.
  nlohmann::ordered_json roles = nlohmann::ordered_json::object();
  for (int r = 0; r < kNumRoles; ++r) {
    if (!MovedAny(f.role_bytes[r])) continue;
    roles[std::string(RoleName(static_cast<Role>(r)))] =
        TierBytesJson(f.role_bytes[r]);
  }
  return {{"seconds", f.seconds},
          {"compute_seconds", f.compute_seconds},
          {"clipped", f.clipped},
          {"skipped", f.skipped},
          {"speculated_groups", f.speculated},
          {"undone_groups", f.undone},
          {"stall",
           {{"fetch", f.fetch_stall},
            {"gradient_buffers", f.gradient_wait},
            {"optimizer", f.optimizer_wait},
            {"updates", f.update_wait}}},
          {"optimizer_seconds", f.optimizer_seconds},
          {"optimizer_hidden_fraction", f.hidden_fraction},
          {"bytes", TierBytesJson(f.bytes)},
          {"role_bytes", roles},
          {"discarded_bytes", f.discarded_bytes}};
}

nlohmann::ordered_json RunJson(const ModeRun& run) {
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (const StepFigures& f : run.steps) steps.push_back(StepJson(f));
  nlohmann::ordered_json peaks = nlohmann::ordered_json::object();
  for (int t = 0; t < kNumTiers; ++t) {
    peaks[std::string(TierName(static_cast<Tier>(t)))] = {
        {"peak", run.peak[t]}, {"budget", run.budget[t]}};
  }
  int clipped = 0, skipped = 0, undone = 0;
  for (const StepFigures& f : run.steps) {
    clipped += f.clipped;
    skipped += f.skipped;
    undone += f.undone > 0;
  }
  return {{"mode", OptimModeName(run.mode)},
          {"clipping", run.clipping},
          {"clipped_steps", clipped},
          {"skipped_steps", skipped},
          {"undone_steps", undone},
          {"steady_step_seconds", SteadySeconds(run.steps)},
          {"offload_efficiency", run.offload_efficiency},
          {"memory", peaks},
          {"steps", steps}};
}

// Each step's bytes by role and tier pair, in MB (1e6 bytes): one row per
// role that moved anything, then the step's total.
void PrintRoleBytes(const ModeRun& run) {
  constexpr int kPairs[][2] = {{2, 1}, {1, 2}, {0, 1}, {1, 0}};
  std::printf("%-6s %-8s", "bytes", "MB");
  for (const auto& p : kPairs) {
    std::printf(" %13s", PairName(p[0], p[1]).c_str());
  }
  std::printf("\n");
  auto row = [&](size_t step, std::string_view what,
                 const EngineStats::TierBytes& moved) {
    std::printf("%-6zu %-8s", step, std::string(what).c_str());
    for (const auto& p : kPairs)
      std::printf(" %13.1f", moved[p[0]][p[1]] / 1e6);
    std::printf("\n");
  };
  for (size_t i = 0; i < run.steps.size(); ++i) {
    const StepFigures& f = run.steps[i];
    for (int r = 0; r < kNumRoles; ++r) {
      if (MovedAny(f.role_bytes[r])) {
        row(i, RoleName(static_cast<Role>(r)), f.role_bytes[r]);
      }
    }
    row(i, "all", f.bytes);
    if (f.discarded_bytes > 0) {
      std::printf("%-6zu %-8s %13.1f  (dirty, dropped unwritten)\n", i, "ended",
                  f.discarded_bytes / 1e6);
    }
  }
}

void PrintRun(const ModeRun& run, const std::vector<StepFigures>& resident) {
  std::printf("\nmode %s%s\n", std::string(OptimModeName(run.mode)).c_str(),
              run.unclipped ? " (no clipping)" : "");
  std::printf("%-6s %9s %9s %9s %9s %9s %9s %9s %8s %9s %s\n", "step",
              "seconds", "compute", "stall:f", "stall:g", "stall:o", "stall:u",
              "optim", "hidden", "undone", "step");
  for (size_t i = 0; i < run.steps.size(); ++i) {
    const StepFigures& f = run.steps[i];
    const std::string undone =
        f.speculated > 0 ? fmt::format("{}/{}", f.undone, f.speculated) : "-";
    std::printf(
        "%-6zu %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %7.0f%% %9s %s\n", i,
        f.seconds, f.compute_seconds, f.fetch_stall, f.gradient_wait,
        f.optimizer_wait, f.update_wait, f.optimizer_seconds,
        100 * f.hidden_fraction, undone.c_str(),
        f.skipped   ? "skipped"
        : f.clipped ? "clipped"
                    : "");
  }
  PrintRoleBytes(run);
  if (resident.empty()) {
    std::printf("steady step %.2f s (no resident run: --no-baseline)\n",
                SteadySeconds(run.steps));
  } else {
    std::printf(
        "steady step %.2f s; resident %.2f s; offload_efficiency %.3f\n",
        SteadySeconds(run.steps), SteadySeconds(resident),
        run.offload_efficiency);
  }
  for (int t = 0; t < kNumTiers; ++t) {
    std::printf("peak %-7s %s of %s\n",
                std::string(TierName(static_cast<Tier>(t))).c_str(),
                HumanBytes(run.peak[t]).c_str(),
                HumanBytes(run.budget[t]).c_str());
  }
}

// strata-plan's floor for the simulated placement, the rates it assumed,
// and the synthetic compute held against it.
struct Bounds {
  plan::Floor floor;
  double host_gb = 0;  // host memory traffic per step
  double read_gbps = 0;
  double write_gbps = 0;
  double compute = 0;  // seconds of synthetic compute per step
};

Bounds BoundsOf(const CliOptions& cli) {
  const SimOptions& o = cli.sim;
  Bounds b;
  b.floor = PlanFloor(cli, &b.host_gb);
  b.read_gbps =
      cli.rates.links[static_cast<int>(plan::Link::kNvmeToHost)].value;
  b.write_gbps =
      cli.rates.links[static_cast<int>(plan::Link::kHostToNvme)].value;
  b.compute = o.tflops > 0 ? 6.0 * o.params * o.tokens *
                                 o.optimizer.micro_batches / (o.tflops * 1e12)
                           : 0.0;
  return b;
}

nlohmann::ordered_json ReportJson(const SimOptions& o, const Bounds& b,
                                  const SimResult& result) {
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  for (const ModeRun& run : result.runs) runs.push_back(RunJson(run));
  return {{"params", o.params},
          {"layers", o.layers},
          {"tflops", o.tflops},
          {"compute_seconds", b.compute},
          {"resident_step_seconds", SteadySeconds(result.resident)},
          {"floor",
           {{"seconds", b.floor.seconds},
            {"transfer_seconds", b.floor.transfer_seconds},
            {"nvme_seconds", b.floor.nvme_seconds},
            {"binding", plan::BindingName(b.floor)},
            {"nvme_read_gbps", b.read_gbps},
            {"nvme_write_gbps", b.write_gbps},
            {"optimizer_seconds", b.floor.optimizer_seconds},
            {"host_memory_gb", b.host_gb}}},
          {"runs", runs}};
}

Status WriteJson(const std::string& path, const nlohmann::ordered_json& doc) {
  std::ofstream out(path);
  out << doc.dump(2) << "\n";
  if (!out) {
    return Status::IoError("cannot write --json " + path);
  }
  return Status::Ok();
}

}  // namespace

Result<int> Run(CliOptions cli) {
  if (cli.measure) {
    STRATA_RETURN_IF_ERROR(plan::Measure(&cli.rates));
  }
  const SimOptions& o = cli.sim;
  const Bounds b = BoundsOf(cli);
  std::fprintf(stderr,
               "strata-sim: %s params, %d layers; strata-plan floor %.2f "
               "s/step (NVMe read %.2f, write %.2f GB/s); compute %.2f "
               "s/step (%.2fx the floor)\n",
               HumanBytes(o.params).c_str(), o.layers, b.floor.seconds,
               b.read_gbps, b.write_gbps, b.compute,
               b.compute / b.floor.seconds);
  STRATA_ASSIGN_OR_RETURN(const SimResult result,
                          Simulate(o, [](const std::string& line) {
                            std::fprintf(stderr, "%s\n", line.c_str());
                          }));
  for (const ModeRun& run : result.runs) PrintRun(run, result.resident);
  std::printf(
      "\nstrata-plan floor %.2f s/step (bound by %s; NVMe read %.2f, write "
      "%.2f GB/s; optimizer %.2f s); compute %.2f s/step\n",
      b.floor.seconds, plan::BindingName(b.floor).c_str(), b.read_gbps,
      b.write_gbps, b.floor.optimizer_seconds, b.compute);
  if (!cli.json_path.empty()) {
    STRATA_RETURN_IF_ERROR(WriteJson(cli.json_path, ReportJson(o, b, result)));
  }
  return 0;
}

}  // namespace strata::sim
