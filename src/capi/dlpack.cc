// DLPack export of a fetched tensor. See strata/dlpack.h for the contract.
#include "strata/dlpack.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace strata {
namespace {

// One allocation holds the managed tensor (DLManagedTensor or
// strata_dlpack_versioned), the arrays it points to and the export's hold;
// manager_ctx points back to it, so the deleter frees exactly what the
// export allocated and never the tensor memory, which the Engine owns.
template <typename Managed>
struct ManagedTensor {
  Managed managed = {};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  std::shared_ptr<void> hold;
};

template <typename Managed>
void DeleteManagedTensor(Managed* self) {
  delete static_cast<ManagedTensor<Managed>*>(self->manager_ctx);
}

DLDataType ToDLDataType(DType dtype) {
  DLDataType out;
  out.lanes = 1;
  switch (dtype) {
    case DType::kFloat32:
      out.code = kDLFloat;
      out.bits = 32;
      return out;
    case DType::kBFloat16:
      out.code = kDLBfloat;
      out.bits = 16;
      return out;
    case DType::kFloat16:
      out.code = kDLFloat;
      out.bits = 16;
      return out;
    case DType::kUInt8:
      out.code = kDLUInt;
      out.bits = 8;
      return out;
  }
  STRATA_CHECK(!"unknown DType");
  return out;
}

// Compact row-major strides, in elements; fails on a negative extent or an
// element count that disagrees with view.bytes.
Result<std::vector<int64_t>> CompactStrides(const TensorView& view) {
  std::vector<int64_t> strides(view.shape.size());
  uint64_t elements = 1;
  for (size_t i = view.shape.size(); i-- > 0;) {
    if (view.shape[i] < 0) {
      return Status::InvalidArgument("tensor '" + view.name +
                                     "' has a negative extent (" +
                                     std::to_string(view.shape[i]) +
                                     ") in dimension " + std::to_string(i));
    }
    strides[i] = static_cast<int64_t>(elements);
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(view.shape[i]),
                               &elements)) {
      return Status::InvalidArgument("tensor '" + view.name +
                                     "' has more elements than fit "
                                     "in 64 bits");
    }
  }
  const uint64_t element_bytes = DTypeSize(view.dtype);
  if (elements > view.bytes / element_bytes ||
      elements * element_bytes != view.bytes) {
    return Status::InvalidArgument(
        "tensor '" + view.name + "' has " + std::to_string(elements) +
        " elements of " + std::to_string(element_bytes) + " bytes but " +
        std::to_string(view.bytes) +
        " bytes of memory; the view does not describe it");
  }
  if (view.data == nullptr && view.bytes > 0) {
    return Status::InvalidArgument(
        "tensor '" + view.name +
        "' has no memory (data is null); "
        "export a view returned by a successful Fetch");
  }
  return strides;
}

template <typename Managed>
Result<Managed*> Export(const TensorView& view, int cuda_device,
                        std::shared_ptr<void> hold) {
  STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> strides, CompactStrides(view));
  auto holder = std::make_unique<ManagedTensor<Managed>>();
  holder->shape = view.shape;
  holder->strides = std::move(strides);
  holder->hold = std::move(hold);
  DLTensor& tensor = holder->managed.dl_tensor;
  tensor.data = view.data;
  tensor.device.device_type = view.on_cuda ? kDLCUDA : kDLCPU;
  tensor.device.device_id = view.on_cuda ? cuda_device : 0;
  tensor.ndim = static_cast<int32_t>(holder->shape.size());
  tensor.dtype = ToDLDataType(view.dtype);
  tensor.shape = holder->shape.data();
  tensor.strides = holder->strides.data();
  tensor.byte_offset = 0;
  holder->managed.manager_ctx = holder.get();
  holder->managed.deleter = DeleteManagedTensor<Managed>;
  return &holder.release()->managed;
}

}  // namespace

Result<DLManagedTensor*> ToDLPack(const TensorView& view, int cuda_device,
                                  std::shared_ptr<void> hold) {
  return Export<DLManagedTensor>(view, cuda_device, std::move(hold));
}

Result<strata_dlpack_versioned*> ToDLPackVersioned(const TensorView& view,
                                                   int cuda_device,
                                                   bool read_only,
                                                   std::shared_ptr<void> hold) {
  STRATA_ASSIGN_OR_RETURN(
      strata_dlpack_versioned * managed,
      Export<strata_dlpack_versioned>(view, cuda_device, std::move(hold)));
  managed->version = {1, 0};
  managed->flags = read_only ? STRATA_DLPACK_FLAG_READ_ONLY : 0;
  return managed;
}

}  // namespace strata
