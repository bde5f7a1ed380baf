#include "src/store/layout.h"

#include <algorithm>
#include <set>

namespace strata::store {
namespace {

uint64_t AlignUp(uint64_t value, uint64_t align) {
  return (value + align - 1) / align * align;
}

Status Invalid(const GroupSpec& spec, const std::string& what) {
  return Status::InvalidArgument("group '" + spec.name + "': " + what);
}

bool ValidTier(Tier tier) {
  return tier == Tier::kDevice || tier == Tier::kHost || tier == Tier::kNvme;
}

}  // namespace

uint64_t ShapeElements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return 0;
    if (dim != 0 && n > (uint64_t{1} << 62) / static_cast<uint64_t>(dim)) {
      return 0;
    }
    n *= static_cast<uint64_t>(dim);
  }
  return n;
}

Result<GroupLayout> BuildGroupLayout(const GroupSpec& spec,
                                     const Placement& defaults) {
  if (spec.name.empty()) {
    return Status::InvalidArgument("a group needs a name");
  }
  if (spec.tensors.empty()) return Invalid(spec, "has no tensors");
  const Placement& placement =
      spec.use_default_placement ? defaults : spec.placement;
  GroupLayout layout;
  layout.name = spec.name;
  std::set<std::string> names;
  // Pass 1: validate, give each tensor its element offset, and find each
  // role's widest dtype; pass 2 turns element offsets into byte offsets.
  uint64_t element = 0;
  std::array<uint64_t, kNumRoles> width = {};
  std::array<uint64_t, kNumRoles> end = {};  // elements through the last user
  for (const TensorSpec& t : spec.tensors) {
    const std::string where = "tensor '" + t.name + "' ";
    if (t.name.empty()) return Invalid(spec, "a tensor has no name");
    if (!names.insert(t.name).second) {
      return Invalid(spec, where + "is registered twice");
    }
    if (t.roles == 0 || (t.roles & ~kAllRoles) != 0) {
      return Invalid(spec, where + "has no valid role (mask " +
                               std::to_string(t.roles) + ")");
    }
    if (t.dtype != DType::kFloat32 && t.dtype != DType::kBFloat16 &&
        t.dtype != DType::kFloat16) {
      return Invalid(spec, where + "has an unknown dtype");
    }
    TensorLayout tl{t.name, t.shape, t.dtype, t.roles, ShapeElements(t.shape),
                    0,      {}};
    if (tl.elements == 0) {
      return Invalid(spec,
                     where + "has an empty, negative or overflowing shape");
    }
    tl.element = element;
    element = AlignUp(element + tl.elements, kTensorAlignElements);
    for (int r = 0; r < kNumRoles; ++r) {
      if ((t.roles & (1u << r)) == 0) continue;
      width[r] = std::max<uint64_t>(
          width[r], DTypeSize(RoleDType(static_cast<Role>(r), t.dtype)));
      end[r] = tl.element + tl.elements;
    }
    layout.roles |= t.roles;
    layout.tensors.push_back(std::move(tl));
  }
  for (TensorLayout& tl : layout.tensors) {
    for (int r = 0; r < kNumRoles; ++r) {
      if ((tl.roles & (1u << r)) != 0) tl.offset[r] = tl.element * width[r];
    }
  }
  for (int r = 0; r < kNumRoles; ++r) {
    if (end[r] == 0) continue;
    const Tier home = placement.home[r];
    if (!ValidTier(home)) {
      return Invalid(spec, "role '" +
                               std::string(RoleName(static_cast<Role>(r))) +
                               "' has an invalid home tier");
    }
    if (home == Tier::kDevice && (placement.device_roles & (1u << r)) == 0) {
      return Invalid(spec, "role '" +
                               std::string(RoleName(static_cast<Role>(r))) +
                               "' is homed on the device but not in "
                               "device_roles");
    }
    layout.chunk_of_role[r] = static_cast<int>(layout.chunks.size());
    layout.chunks.push_back({static_cast<Role>(r), home,
                             AlignUp(end[r] * width[r], kChunkAlign),
                             width[r]});
  }
  layout.elements = end;
  layout.device_roles = placement.device_roles;
  return layout;
}

}  // namespace strata::store
