#include "tools/sim/busy.h"

#include <chrono>
#include <string>

#include "tools/sim/busy_cuda.h"

namespace strata::sim {

Status Busy(double seconds, bool on_cuda) {
  if (on_cuda) {
#ifdef STRATA_HAVE_CUDA
    const char* call = nullptr;
    if (const char* error = SpinOnCuda(seconds, &call)) {
      return Status::Internal(std::string("strata-sim: ") + call +
                              " failed: " + error);
    }
    return Status();
#else
    return Status::FailedPrecondition(
        "strata-sim was built without CUDA; rebuild with nvcc "
        "present or use --device host");
#endif
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point end =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(seconds));
  while (Clock::now() < end) {
  }
  return Status();
}

}  // namespace strata::sim
