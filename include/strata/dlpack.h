// strata/dlpack.h: zero-copy export of a fetched tensor as DLPack. Library
// `strata`.
//
// Contract
// - ToDLPack(view, cuda_device) describes the memory of `view` as a
//   DLManagedTensor: kDLCPU for host memory (also the host-emulated device),
//   kDLCUDA with `cuda_device` when view.on_cuda; dtype kDLFloat 32,
//   kDLBfloat 16 or kDLFloat 16, one lane; compact row-major shape and
//   strides (in elements), byte_offset 0.
// - Ownership: the DLManagedTensor owns only itself and its shape/strides
//   arrays; its deleter frees them and nothing else. The tensor memory stays
//   owned by the Engine and is valid only until the Release() of the Fetch
//   that produced `view`. The consumer calls the deleter exactly once.
// - Failure: a view that cannot be described (a negative extent, bytes that
//   disagree with shape and dtype) is kInvalidArgument.
// - Thread safety: a pure function of its arguments.
#ifndef STRATA_DLPACK_H_
#define STRATA_DLPACK_H_

#include <dlpack/dlpack.h>

#include "strata/engine.h"
#include "strata/export.h"
#include "strata/status.h"

namespace strata {

STRATA_EXPORT Result<DLManagedTensor*> ToDLPack(const TensorView& view,
                                                int cuda_device);

}  // namespace strata

#endif  // STRATA_DLPACK_H_
