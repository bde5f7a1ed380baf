// strata/dlpack.h: zero-copy export of a fetched tensor as DLPack. Library
// `strata`.
//
// Contract
// - ToDLPack(view, cuda_device) describes the memory of `view` as a
//   DLManagedTensor: kDLCPU for host memory (also the host-emulated device),
//   kDLCUDA with `cuda_device` when view.on_cuda; dtype kDLFloat 32,
//   kDLBfloat 16 or kDLFloat 16, one lane; compact row-major shape and
//   strides (in elements), byte_offset 0.
// - ToDLPackVersioned is the same as DLPack 1.x's DLManagedTensorVersioned
//   (strata_dlpack_versioned in strata/strata.h: version 1.0, and
//   STRATA_DLPACK_FLAG_READ_ONLY when `read_only`), for consumers that ask
//   for it (NumPy >= 2.1 writes only through those).
// - Ownership: the managed tensor owns itself, its shape/strides arrays and
//   `hold`; its deleter destroys them and nothing else. The tensor memory
//   stays owned by the Engine and is valid only until the Release() of the
//   Fetch that produced `view`, unless `hold` keeps it (the C ABI's exports
//   hold their fetch: Note [Exports hold their memory] in
//   src/capi/handles.h). The consumer calls the deleter exactly once.
// - Failure: a view that cannot be described (a negative extent, bytes that
//   disagree with shape and dtype) is kInvalidArgument.
// - Thread safety: a pure function of its arguments.
#ifndef STRATA_DLPACK_H_
#define STRATA_DLPACK_H_

#include <dlpack/dlpack.h>

#include <memory>

#include "strata/engine.h"
#include "strata/export.h"
#include "strata/status.h"
#include "strata/strata.h"

namespace strata {

STRATA_EXPORT Result<DLManagedTensor*> ToDLPack(
    const TensorView& view, int cuda_device, std::shared_ptr<void> hold = {});
STRATA_EXPORT Result<strata_dlpack_versioned*> ToDLPackVersioned(
    const TensorView& view, int cuda_device, bool read_only,
    std::shared_ptr<void> hold = {});

}  // namespace strata

#endif  // STRATA_DLPACK_H_
