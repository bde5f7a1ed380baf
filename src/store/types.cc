// Names and sizes of the engine's vocabulary (strata/engine.h).
#include <string>

#include "strata/engine.h"

namespace strata {

std::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kNvme:
      return "nvme";
  }
  return "unknown";
}

Result<Tier> ParseTier(std::string_view name) {
  for (Tier t : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
    if (name == TierName(t)) return t;
  }
  return Status::InvalidArgument("unknown tier '" + std::string(name) +
                                 "'; use device, host or nvme");
}

std::string_view RoleName(Role role) {
  static constexpr std::string_view kNames[kNumRoles] = {
      "compute", "master", "state1", "state2", "grad"};
  const int i = static_cast<int>(role);
  return i >= 0 && i < kNumRoles ? kNames[i] : "unknown";
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
    case DType::kUInt8:
      return "u8";
  }
  return "unknown";
}

Result<DType> ParseDType(std::string_view name) {
  for (DType d : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    if (name == DTypeName(d)) return d;
  }
  return Status::InvalidArgument("dtype '" + std::string(name) +
                                 "' is not one of bf16, fp16, fp32");
}

size_t DTypeSize(DType dtype) {
  return dtype == DType::kFloat32 ? 4 : dtype == DType::kUInt8 ? 1 : 2;
}

DType RoleDType(Role role, DType compute, StateFormat state) {
  if (role == Role::kCompute) return compute;
  if (role != Role::kState1 && role != Role::kState2) return DType::kFloat32;
  return state == StateFormat::kBF16 ? DType::kBFloat16
         : state == StateFormat::kQ8 ? DType::kUInt8
                                     : DType::kFloat32;
}

const TensorView* GroupView::Find(std::string_view name, Role role) const {
  for (const TensorView& t : tensors) {
    if (t.name == name && t.role == role) return &t;
  }
  return nullptr;
}

}  // namespace strata
