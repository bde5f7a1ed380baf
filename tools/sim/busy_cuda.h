// The CUDA half of tools/sim/busy.h, in busy_cuda.cu, which is compiled
// only with CUDA and kept free of strata headers (nvcc builds it as C++17).
#ifndef STRATA_TOOLS_SIM_BUSY_CUDA_H_
#define STRATA_TOOLS_SIM_BUSY_CUDA_H_

namespace strata::sim {

// Spins a kernel on the current CUDA device for `seconds`, on a stream of
// its own, and waits for it. Returns null, or the CUDA error's text with
// `*failed_call` naming the call that failed (both static strings).
const char* SpinOnCuda(double seconds, const char** failed_call);

}  // namespace strata::sim

#endif  // STRATA_TOOLS_SIM_BUSY_CUDA_H_
