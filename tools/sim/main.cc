// strata-sim: a synthetic training step through the engine; see --help.
#include <cstdio>

#include "tools/sim/cli.h"

int main(int argc, char** argv) {
  bool exit_now = false;
  auto options = strata::sim::ParseCommandLine(argc, argv, &exit_now);
  if (!options.ok()) {
    std::fprintf(stderr, "strata-sim: %s\n",
                 options.status().message().c_str());
    return 1;
  }
  if (exit_now) return 0;
  auto rc = strata::sim::Run(*options);
  if (!rc.ok()) {
    std::fprintf(stderr, "strata-sim: error: %s\n",
                 rc.status().ToString().c_str());
    return 1;
  }
  return *rc;
}
