// strata-sim's command line: options, strata-plan's floor for the simulated
// placement, and the report (a table on stdout, JSON with --json).
// Contract: ParseCommandLine() returns kInvalidArgument naming the bad
// option; Run() returns the exit status, or the Status of the failure.
#ifndef STRATA_TOOLS_SIM_CLI_H_
#define STRATA_TOOLS_SIM_CLI_H_

#include <string>

#include "strata/status.h"
#include "tools/plan/cli.h"
#include "tools/sim/sim.h"

namespace strata::sim {

struct CliOptions {
  SimOptions sim;
  plan::PlanOptions rates;  // links and optimizer rate for the floor
  bool measure = false;
  std::string json_path;
};

Result<CliOptions> ParseCommandLine(int argc, char** argv, bool* exit_now);
Result<int> Run(CliOptions options);

}  // namespace strata::sim

#endif  // STRATA_TOOLS_SIM_CLI_H_
