// Opens an aio engine, takes one AdamW step and asks the C ABI for its
// version, through the installed headers and libraries.
#include <cstdio>
#include <string>
#include <vector>

#include "strata/aio.h"
#include "strata/cpu_adam.h"
#include "strata/strata.h"

int main() {
  auto engine = strata::aio::Engine::Open(strata::aio::IoOptions{});
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }
  auto opt = strata::CpuOptimizer::Create();
  if (!opt.ok()) {
    std::fprintf(stderr, "%s\n", opt.status().ToString().c_str());
    return 1;
  }
  std::vector<float> p(100, 1.0f), g(100, 0.5f), m(100), v(100);
  strata::OptimBuffers b;
  b.params = p.data();
  b.grads = g.data();
  b.state1 = m.data();
  b.state2 = v.data();
  b.n = p.size();
  auto step = (*opt)->Step({}, b);
  if (!step.ok() || p[0] >= 1.0f) {
    std::fprintf(stderr, "AdamW step did not move the parameters\n");
    return 1;
  }
  int32_t major = -1, minor = -1, patch = -1;
  if (strata_version_get(&major, &minor, &patch) != STRATA_OK ||
      major != STRATA_VERSION_MAJOR || minor != STRATA_VERSION_MINOR) {
    std::fprintf(stderr, "libstrata %d.%d.%d does not match strata.h %d.%d\n",
                 major, minor, patch, STRATA_VERSION_MAJOR,
                 STRATA_VERSION_MINOR);
    return 1;
  }
  std::printf(
      "consumer: libstrata %d.%d.%d, strata aio backend %s, cpu_adam path "
      "%s\n",
      major, minor, patch,
      std::string(strata::aio::BackendName((*engine)->info().backend)).c_str(),
      std::string(strata::CpuIsaName((*opt)->isa())).c_str());
  return 0;
}
