// strata-plan --measure: quick bandwidth probes (well under a second each).
// Each runs only long enough to take a figure a planner can use; none is a
// benchmark (strata-nvme-bench is).
//
// Failure: ProbeNvme() returns a Status naming the directory and the fix
// when it cannot create, write or read its file there. The other probes
// cannot fail in a way a user can fix; a PCIe probe that cannot run returns
// gbps 0 with the reason in `note`.
// Not thread-safe: the probes are meant to run one at a time, alone, so
// they do not disturb each other's figures.
#ifndef STRATA_TOOLS_PLAN_PROBE_H_
#define STRATA_TOOLS_PLAN_PROBE_H_

#include <string>

#include "strata/status.h"

namespace strata::plan {

struct ProbeResult {
  double gbps = 0;   // 1e9 B/s; 0 when not measured
  std::string note;  // how it was measured, or why it was not
};

// Host DRAM bandwidth: memcpy between two buffers, counting the bytes read
// and the bytes written.
ProbeResult ProbeHostMemory();

struct NvmeProbe {
  ProbeResult read;
  ProbeResult write;
};
// Writes (each pass ended by fdatasync) and then reads one file through the
// aio engine in `dir`, which must exist; the file is removed afterwards.
Result<NvmeProbe> ProbeNvme(const std::string& dir);

struct PcieProbe {
  ProbeResult h2d;
  ProbeResult d2h;
};
// Pinned host<->device copies on CUDA device 0, when the build has CUDA and
// a GPU is present.
PcieProbe ProbePcie();

}  // namespace strata::plan

#endif  // STRATA_TOOLS_PLAN_PROBE_H_
