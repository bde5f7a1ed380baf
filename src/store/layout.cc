#include "src/store/layout.h"

#include <algorithm>
#include <set>

#include "strata/cpu_adam.h"

namespace strata::store {
namespace {

constexpr RoleMask kStateRoles =
    RoleBit(Role::kState1) | RoleBit(Role::kState2);

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

uint64_t TensorBytes(const TensorLayout& t, Role role) {
  const bool state = (RoleBit(role) & kStateRoles) != 0;
  if (state && t.state == StateFormat::kQ8) {
    return Q8Blocks(t.elements) * (kQ8Block + sizeof(float));
  }
  return t.elements * DTypeSize(RoleDType(role, t.dtype, t.state));
}

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

namespace {

// The element width of each role (its widest dtype), the element index
// just past its last tensor (0: no tensor has the role) and the bytes its
// tensors span.
struct RoleExtents {
  RoleArray<uint64_t> width;
  RoleArray<uint64_t> end;
  RoleArray<uint64_t> bytes;
};

// A tensor's state format in a group whose state is in `state`.
StateFormat TensorState(const TensorSpec& t, StateFormat state) {
  if ((t.roles & kStateRoles) == 0) return StateFormat::kF32;
  if (state == StateFormat::kQ8 && ShapeElements(t.shape) < kQ8MinElements) {
    return StateFormat::kF32;
  }
  return state;
}

Status CheckTensor(const GroupSpec& spec, const TensorSpec& t,
                   std::set<std::string>& names) {
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
  if (ShapeElements(t.shape) == 0) {
    return Invalid(spec, where + "has an empty, negative or overflowing shape");
  }
  return Status();
}

// Pass 1: checks every tensor and gives it its first element, aligned, in
// the order registered; every role of a tensor starts at the same element.
Result<RoleExtents> PlaceTensors(const GroupSpec& spec, StateFormat state,
                                 GroupLayout& layout) {
  std::set<std::string> names;
  RoleExtents extents;
  uint64_t element = 0;
  for (const TensorSpec& t : spec.tensors) {
    STRATA_RETURN_IF_ERROR(CheckTensor(spec, t, names));
    TensorLayout& tl = layout.tensors.emplace_back();
    tl.name = t.name;
    tl.shape = t.shape;
    tl.dtype = t.dtype;
    tl.roles = t.roles;
    tl.elements = ShapeElements(t.shape);
    tl.element = element;
    tl.state = TensorState(t, state);
    element = AlignUp(element + tl.elements, kTensorAlignElements);
    for (Role role : kRoles) {
      if ((t.roles & RoleBit(role)) == 0) continue;
      extents.width[role] = std::max<uint64_t>(
          extents.width[role], DTypeSize(RoleDType(role, t.dtype, tl.state)));
      extents.end[role] = tl.element + tl.elements;
    }
    layout.roles |= t.roles;
  }
  return extents;
}

// Pass 3: one chunk per role, at the role's home tier.
Status AddChunks(const GroupSpec& spec, const Placement& placement,
                 const RoleExtents& extents, GroupLayout& layout) {
  for (Role r : kRoles) {
    if (extents.end[r] == 0) continue;
    const std::string role(RoleName(r));
    const Tier home = placement.home[static_cast<int>(r)];
    if (!ValidTier(home)) {
      return Invalid(spec, "role '" + role + "' has an invalid home tier");
    }
    if (home == Tier::kDevice && (placement.device_roles & RoleBit(r)) == 0) {
      return Invalid(spec, "role '" + role +
                               "' is homed on the device but not in "
                               "device_roles");
    }
    layout.chunk_of_role[r] = static_cast<int>(layout.chunks.size());
    layout.chunks.push_back({.role = r,
                             .home = home,
                             .bytes = AlignUp(extents.bytes[r], kChunkAlign)});
  }
  return Status();
}

}  // namespace

Result<GroupLayout> BuildGroupLayout(const GroupSpec& spec,
                                     const Placement& defaults,
                                     StateFormat state) {
  if (spec.name.empty()) {
    return Status::InvalidArgument("a group needs a name");
  }
  if (spec.tensors.empty()) return Invalid(spec, "has no tensors");
  const Placement& placement =
      spec.use_default_placement ? defaults : spec.placement;
  GroupLayout layout;
  layout.name = spec.name;
  STRATA_ASSIGN_OR_RETURN(RoleExtents extents,
                          PlaceTensors(spec, state, layout));
  layout.packed_state = std::any_of(
      layout.tensors.begin(), layout.tensors.end(),
      [](const TensorLayout& t) { return t.state == StateFormat::kQ8; });
  // Pass 2: element offsets become byte offsets at each role's width, or
  // packed state follows the previous tensor's.
  for (TensorLayout& tl : layout.tensors) {
    for (Role role : kRoles) {
      if ((tl.roles & RoleBit(role)) == 0) continue;
      if (layout.packed_state && (RoleBit(role) & kStateRoles) != 0) {
        tl.offset[role] = AlignUp(extents.bytes[role], kQ8Block);
        extents.bytes[role] = tl.offset[role] + TensorBytes(tl, role);
      } else {
        tl.offset[role] = tl.element * extents.width[role];
        extents.bytes[role] = extents.end[role] * extents.width[role];
      }
    }
  }
  STRATA_RETURN_IF_ERROR(AddChunks(spec, placement, extents, layout));
  layout.elements = extents.end;
  layout.device_roles = placement.device_roles;
  return layout;
}

}  // namespace strata::store
