// strata-sim's command line, its report and strata-plan's floor for the
// simulated placement.
#include "tools/sim/cli.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/cli.h"
#include "common/text.h"
#include "tools/plan/cli.h"
#include "tools/plan/estimate.h"

namespace strata::sim {
namespace {

Result<uint64_t> Size(const std::string& flag, const std::string& text) {
  Result<uint64_t> bytes = ParseSize(text);
  if (!bytes.ok()) {
    return Status::InvalidArgument(flag + ": " + bytes.status().message());
  }
  return bytes;
}

// strata-plan's model of the simulated placement: the compute copy and the
// optimizer state where the simulation homes them, gradients on the device.
plan::Floor PlanFloor(const CliOptions& cli, double* host_gb) {
  const SimOptions& o = cli.sim;
  plan::Model model{o.params, o.dtype, 12};
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

}  // namespace

Result<CliOptions> ParseCommandLine(int argc, char** argv, bool* exit_now) {
  CliOptions cli;
  SimOptions& o = cli.sim;
  std::string params = "1G", dtype = "bf16", device_budget = "256M",
              host_budget = "3G", nvme_budget, params_home = "host",
              state_home = "nvme";
  std::vector<std::string> modes = {"overlap"};
  CLI::App app(
      "strata-sim: a training step of a synthetic model through "
      "the whole engine",
      "strata-sim");
  app.add_option("--params", params, "Total parameters (1G, 350M, ...)")
      ->capture_default_str();
  app.add_option("--layers", o.layers, "Layers (one group each)")->required();
  app.add_option("--dtype", dtype, "Compute dtype: bf16, fp16, fp32")
      ->capture_default_str();
  app.add_option("--device", o.device, "auto, cuda or host (emulated)")
      ->capture_default_str();
  app.add_option("--device-budget", device_budget, "Device bytes")
      ->capture_default_str();
  app.add_option("--host-budget", host_budget, "Pinned host bytes")
      ->capture_default_str();
  app.add_option("--nvme", o.nvme_dir, "Swap directory (NVMe tier)");
  app.add_option("--nvme-budget", nvme_budget,
                 "Swap bytes (default: what the model needs, plus room)");
  app.add_option("--params-home", params_home,
                 "Compute copy home: host or nvme")
      ->capture_default_str();
  app.add_option("--state-home", state_home,
                 "Master, m, v home: host or nvme (nvme needs --nvme)")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "Steps")->capture_default_str();
  app.add_option("--tflops", o.tflops,
                 "Synthetic device speed, TFLOP/s (0: no compute)")
      ->capture_default_str();
  app.add_option("--tokens", o.tokens, "Tokens per micro-batch")
      ->capture_default_str();
  app.add_option("--mode", modes,
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
  app.add_option("--threads", o.optimizer.threads,
                 "CPU optimizer threads (0: all cores but one)")
      ->capture_default_str();
  app.add_flag("--measure", cli.measure,
               "Measure host memory and NVMe bandwidth for the floor (about "
               "2 s) instead of assuming strata-plan's defaults");
  app.add_flag("!--no-baseline", o.resident_baseline,
               "Skip the resident run (no offload_efficiency)");
  app.add_option("--json", cli.json_path, "Also write the report as JSON");
  STRATA_RETURN_IF_ERROR(ParseArgs(app, argc, argv, exit_now));
  if (*exit_now) return cli;
  Result<uint64_t> n = plan::ParseParamCount(params);
  if (!n.ok()) {
    return Status::InvalidArgument("--params: " + n.status().message());
  }
  o.params = *n;
  if (o.layers < 1 || static_cast<uint64_t>(o.layers) > o.params) {
    return Status::InvalidArgument("--layers must be in 1..params");
  }
  Result<DType> d = ParseDType(dtype);
  if (!d.ok()) {
    return Status::InvalidArgument("--dtype: " + d.status().message());
  }
  o.dtype = *d;
  o.modes.clear();
  for (const std::string& name : modes) {
    Result<OptimMode> m = ParseOptimMode(name);
    if (!m.ok()) {
      return Status::InvalidArgument("--mode: " + m.status().message());
    }
    o.modes.push_back(*m);
  }
  if (o.modes.empty()) {
    return Status::InvalidArgument("--mode: give at least one mode");
  }
  for (auto [flag, text, tier] :
       {std::tuple{"--params-home", params_home, &o.params_home},
        std::tuple{"--state-home", state_home, &o.state_home}}) {
    Result<Tier> t = ParseTier(text);
    if (!t.ok() || *t == Tier::kDevice) {
      return Status::InvalidArgument(std::string(flag) +
                                     ": host or nvme, not '" + text + "'");
    }
    *tier = *t;
  }
  const bool uses_nvme =
      o.params_home == Tier::kNvme || o.state_home == Tier::kNvme;
  if (uses_nvme && o.nvme_dir.empty()) {
    return Status::InvalidArgument(
        "a role is homed on NVMe: give the swap directory with "
        "--nvme DIR (or --state-home host --params-home host)");
  }
  STRATA_ASSIGN_OR_RETURN(o.device_budget,
                          Size("--device-budget", device_budget));
  STRATA_ASSIGN_OR_RETURN(o.host_budget, Size("--host-budget", host_budget));
  if (!nvme_budget.empty()) {
    STRATA_ASSIGN_OR_RETURN(o.nvme_budget, Size("--nvme-budget", nvme_budget));
  } else if (!o.nvme_dir.empty()) {
    // Everything homed there, gradients included, plus 1/8 for extents.
    o.nvme_budget = o.params * (16 + DTypeSize(o.dtype)) * 9 / 8;
  }
  cli.rates.swap_dir = o.nvme_dir;
  return cli;
}

namespace {

nlohmann::ordered_json StepJson(const StepFigures& f) {
  nlohmann::ordered_json bytes = nlohmann::ordered_json::object();
  for (int a = 0; a < kNumTiers; ++a) {
    for (int b = 0; b < kNumTiers; ++b) {
      if (f.bytes[a][b] == 0) continue;
      bytes[fmt::format("{}->{}", TierName(static_cast<Tier>(a)),
                        TierName(static_cast<Tier>(b)))] = f.bytes[a][b];
    }
  }
  return {{"seconds", f.seconds},
          {"compute_seconds", f.compute_seconds},
          {"stall",
           {{"fetch", f.fetch_stall},
            {"gradient_buffers", f.gradient_wait},
            {"optimizer", f.optimizer_wait}}},
          {"optimizer_seconds", f.optimizer_seconds},
          {"optimizer_hidden_fraction", f.hidden_fraction},
          {"bytes", bytes}};
}

nlohmann::ordered_json RunJson(const ModeRun& run) {
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (const StepFigures& f : run.steps) steps.push_back(StepJson(f));
  nlohmann::ordered_json peaks = nlohmann::ordered_json::object();
  for (int t = 0; t < kNumTiers; ++t) {
    peaks[std::string(TierName(static_cast<Tier>(t)))] = {
        {"peak", run.peak[t]}, {"budget", run.budget[t]}};
  }
  return {{"mode", OptimModeName(run.mode)},
          {"steady_step_seconds", SteadySeconds(run.steps)},
          {"offload_efficiency", run.offload_efficiency},
          {"memory", peaks},
          {"steps", steps}};
}

void PrintRun(const ModeRun& run, const std::vector<StepFigures>& resident) {
  std::printf("\nmode %s\n", std::string(OptimModeName(run.mode)).c_str());
  std::printf("%-6s %9s %9s %9s %9s %9s %9s %8s\n", "step", "seconds",
              "compute", "stall:f", "stall:g", "stall:o", "optim", "hidden");
  for (size_t i = 0; i < run.steps.size(); ++i) {
    const StepFigures& f = run.steps[i];
    std::printf("%-6zu %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %7.0f%%\n", i,
                f.seconds, f.compute_seconds, f.fetch_stall, f.gradient_wait,
                f.optimizer_wait, f.optimizer_seconds, 100 * f.hidden_fraction);
  }
  std::printf("steady step %.2f s; resident %.2f s; offload_efficiency %.3f\n",
              SteadySeconds(run.steps), SteadySeconds(resident),
              run.offload_efficiency);
  for (int t = 0; t < kNumTiers; ++t) {
    std::printf("peak %-7s %s of %s\n",
                std::string(TierName(static_cast<Tier>(t))).c_str(),
                HumanBytes(run.peak[t]).c_str(),
                HumanBytes(run.budget[t]).c_str());
  }
}

}  // namespace

Result<int> Run(CliOptions cli) {
  if (cli.measure) {
    STRATA_RETURN_IF_ERROR(plan::Measure(&cli.rates));
  }
  const SimOptions& o = cli.sim;
  double host_gb = 0;
  const plan::Floor floor = PlanFloor(cli, &host_gb);
  const double read_gbps =
      cli.rates.links[static_cast<int>(plan::Link::kNvmeToHost)].value;
  const double write_gbps =
      cli.rates.links[static_cast<int>(plan::Link::kHostToNvme)].value;
  const double compute = o.tflops > 0
                             ? 6.0 * o.params * o.tokens *
                                   o.optimizer.micro_batches / (o.tflops * 1e12)
                             : 0.0;
  std::fprintf(stderr,
               "strata-sim: %s params, %d layers; strata-plan floor %.2f "
               "s/step (NVMe read %.2f, write %.2f GB/s); compute %.2f "
               "s/step (%.2fx the floor)\n",
               HumanBytes(o.params).c_str(), o.layers, floor.seconds, read_gbps,
               write_gbps, compute, compute / floor.seconds);
  Result<SimResult> result = Simulate(o, [](const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
  });
  if (!result.ok()) return result.status();
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  for (const ModeRun& run : result->runs) {
    runs.push_back(RunJson(run));
    PrintRun(run, result->resident);
  }
  std::printf(
      "\nstrata-plan floor %.2f s/step (bound by %s; NVMe read %.2f, write "
      "%.2f GB/s; optimizer %.2f s); compute %.2f s/step\n",
      floor.seconds, plan::BindingName(floor).c_str(), read_gbps, write_gbps,
      floor.optimizer_seconds, compute);
  const nlohmann::ordered_json doc = {
      {"params", o.params},
      {"layers", o.layers},
      {"tflops", o.tflops},
      {"compute_seconds", compute},
      {"resident_step_seconds", SteadySeconds(result->resident)},
      {"floor",
       {{"seconds", floor.seconds},
        {"transfer_seconds", floor.transfer_seconds},
        {"nvme_seconds", floor.nvme_seconds},
        {"binding", plan::BindingName(floor)},
        {"nvme_read_gbps", read_gbps},
        {"nvme_write_gbps", write_gbps},
        {"optimizer_seconds", floor.optimizer_seconds},
        {"host_memory_gb", host_gb}}},
      {"runs", runs}};
  if (!cli.json_path.empty()) {
    std::ofstream out(cli.json_path);
    out << doc.dump(2) << "\n";
    if (!out) {
      return Status::IoError("cannot write --json " + cli.json_path);
    }
  }
  return 0;
}

}  // namespace strata::sim
