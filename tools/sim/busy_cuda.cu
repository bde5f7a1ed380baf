// The CUDA busy kernel of tools/sim/busy.h.
#include <cuda_runtime.h>

#include <cstdint>

#include "tools/sim/busy_cuda.h"

namespace strata::sim {
namespace {

__device__ uint64_t GlobalNanoseconds() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__global__ void Spin(uint64_t nanoseconds) {
  const uint64_t start = GlobalNanoseconds();
  while (GlobalNanoseconds() - start < nanoseconds) {
  }
}

}  // namespace

const char* SpinOnCuda(double seconds, const char** failed_call) {
  static cudaStream_t stream = nullptr;  // the sim's compute stream
  cudaError_t err = cudaSuccess;
  if (stream == nullptr) {
    err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
      stream = nullptr;
      *failed_call = "cudaStreamCreateWithFlags";
      return cudaGetErrorString(err);
    }
  }
  Spin<<<1, 1, 0, stream>>>(static_cast<uint64_t>(seconds * 1e9));
  if ((err = cudaGetLastError()) != cudaSuccess) {
    *failed_call = "the busy kernel's launch";
    return cudaGetErrorString(err);
  }
  if ((err = cudaStreamSynchronize(stream)) != cudaSuccess) {
    *failed_call = "cudaStreamSynchronize";
    return cudaGetErrorString(err);
  }
  return nullptr;
}

}  // namespace strata::sim
