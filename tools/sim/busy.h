// strata-sim's synthetic device work: a layer's compute as time the device
// is busy.
// - Host-emulated device: a timed busy loop on the calling thread (the
//   emulated GPU is busy, not asleep, so it takes a core as real work
//   would).
// - CUDA: a kernel that spins on the GPU's global timer (one thread) for
//   the time asked, on a stream of its own; the caller then waits for it,
//   as a training thread waits for a layer's kernels before it hands off
//   the layer's gradients. The host core stays free meanwhile.
//
// Failure: a CUDA launch or synchronization error comes back naming the
// call; Busy() on CUDA in a build without CUDA is kFailedPrecondition.
// Thread safety: one caller at a time (strata-sim's training thread).
#ifndef STRATA_TOOLS_SIM_BUSY_H_
#define STRATA_TOOLS_SIM_BUSY_H_

#include "strata/status.h"

namespace strata::sim {

// Keeps the device busy for `seconds` (>= 0) and returns when it is done.
Status Busy(double seconds, bool on_cuda);

}  // namespace strata::sim

#endif  // STRATA_TOOLS_SIM_BUSY_H_
