// strata-plan's command line: option parsing, the --measure probes, and
// Run, which prints the report (report.h) over a Plan (estimate.h).
//
// Contract
// - ParseCommandLine() returns kInvalidArgument with a message naming the
//   bad option and what it accepts; main() exits 1 on it.
// - Measure() runs quick probes (about 2 s in all) and replaces the rates
//   that were assumed; rates given on the command line are kept. It fails
//   only when the NVMe probe cannot run in the swap directory; a GPU probe
//   that cannot run leaves the PCIe rates assumed and says why.
// - Run() prints one report (a table, or one JSON document with --json) on
//   stdout and returns the exit status: 0, or 2 when the model does not fit
//   its budgets, in which case stderr also says which tier lacks how many
//   bytes and how to fix it.
// Not thread-safe: Measure() and Run() use the process's stdout and cwd.
#ifndef STRATA_TOOLS_PLAN_CLI_H_
#define STRATA_TOOLS_PLAN_CLI_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "strata/status.h"
#include "tools/plan/estimate.h"

namespace strata::plan {

// The rates assumed when neither given nor measured.
inline constexpr double kDefaultPcieGbps = 25;      // PCIe 4.0 x16, pinned
inline constexpr double kDefaultNvmeReadGbps = 6;   // one PCIe 4.0 x4 drive
inline constexpr double kDefaultNvmeWriteGbps = 4;  // sustained
inline constexpr double kDefaultHostMemGbps = 50;   // DRAM read + write
inline constexpr double kDefaultNetGbps = 25;       // a 200 Gb/s NIC a rank
inline constexpr double kDefaultAdamGparams = 1.8;  // CPU Adam, DESIGN.md §5

// The budget flags, in kTiers order.
inline constexpr std::array<const char*, kNumTiers> kBudgetFlags = {
    "--device-budget", "--host-budget", "--nvme-budget"};

enum class Source { kAssumed, kGiven, kMeasured };
std::string_view SourceName(Source source);  // "assumed", "given", ...

// A rate the floor uses, and where it came from.
struct Rate {
  double value = 0;  // GB/s for links, 1e9 params/s for the optimizer
  Source source = Source::kAssumed;
  std::string note;  // how it was measured, or why it was not
};

inline Rate Assumed(double value) { return {value, Source::kAssumed, ""}; }

struct PlanOptions {
  Model model;
  std::string model_source;  // how Ψ was given, for the report
  Budgets budgets;
  uint64_t gpus = 1;
  // In kLinks order; the assumed defaults until given or measured.
  std::array<Rate, kNumLinks> links = {
      Assumed(kDefaultPcieGbps),     Assumed(kDefaultPcieGbps),
      Assumed(kDefaultNvmeReadGbps), Assumed(kDefaultNvmeWriteGbps),
      Assumed(kDefaultHostMemGbps),  Assumed(kDefaultNetGbps)};
  Rate adam = Assumed(kDefaultAdamGparams);
  bool measure = false;
  std::string swap_dir;  // empty: a temporary directory under the cwd
  bool json = false;
  // --explain: print the engine's schedule for the model split into
  // `groups` equal groups (explain.h).
  bool explain = false;
  uint64_t groups = 0;
};

// Parses argv. Sets *exit_now (and returns defaults) when --help was
// printed.
Result<PlanOptions> ParseCommandLine(int argc, char** argv, bool* exit_now);

// The --measure probes: host memcpy, an NVMe write and read through the aio
// engine in options->swap_dir, and host<->device copies when a GPU is
// present.
Status Measure(PlanOptions* options);

Bandwidths RatesOf(const PlanOptions& options);

// Measures when asked, plans, prints (with the schedule when
// options.explain); returns the process exit status.
Result<int> Run(PlanOptions options);

}  // namespace strata::plan

#endif  // STRATA_TOOLS_PLAN_CLI_H_
