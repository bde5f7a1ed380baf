// strata-plan: placement and step-time estimates; see --help.
#include <cstdio>

#include "tools/plan/cli.h"

int main(int argc, char** argv) {
  bool exit_now = false;
  auto options = strata::plan::ParseCommandLine(argc, argv, &exit_now);
  if (!options.ok()) {
    std::fprintf(stderr, "strata-plan: %s\n",
                 options.status().message().c_str());
    return 1;
  }
  if (exit_now) return 0;
  auto rc = strata::plan::Run(*options);
  if (!rc.ok()) {
    std::fprintf(stderr, "strata-plan: error: %s\n",
                 rc.status().ToString().c_str());
    return 1;
  }
  return *rc;
}
