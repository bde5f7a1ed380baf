// Group layout: how a group's tensors are packed into chunks, one chunk per
// role, each chunk a multiple of 4096 bytes (what O_DIRECT needs).
//
// Tensors are placed by element, the same way in every role: tensor i
// starts at element index `element` (a multiple of 128, so at least a
// 256-byte boundary, what CUDA and DLPack consumers expect), and a role's
// chunk stores element e at byte e * width, width being the widest dtype of
// that role in the group. So element e of the compute copy, the master, the
// optimizer state and the gradients of a group line up, and the optimizer
// can update a whole group in one pass over flat arrays. Gaps (alignment,
// and tensors that lack a role) are never handed out and stay zero (the
// codes that pad 8-bit state to whole blocks are part of its view).
//
// Except the state roles in 8-bit (StateFormat::kQ8, Note [8-bit state] in
// strata/cpu_adam.h): there a tensor of at least kQ8MinElements elements
// keeps its codes (padded to whole blocks) followed by its scales, a
// smaller one fp32 elements (a few blocks gain nothing, and bitsandbytes
// and torchao keep them so too), each tensor's bytes packed in order at
// 256-byte boundaries; the optimizer steps such a group tensor by tensor.
// Pure: validation and arithmetic, no memory.
#ifndef STRATA_SRC_STORE_LAYOUT_H_
#define STRATA_SRC_STORE_LAYOUT_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/enum_array.h"
#include "strata/engine.h"

namespace strata::store {

inline constexpr uint64_t kTensorAlignElements = 128;
inline constexpr uint64_t kChunkAlign = 4096;
inline constexpr uint64_t kQ8MinElements = 4096;

struct TensorLayout {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  RoleMask roles = 0;
  uint64_t elements = 0;
  uint64_t element = 0;                   // first element index
  RoleArray<uint64_t> offset;             // bytes, within the chunk
  StateFormat state = StateFormat::kF32;  // of kState1 and kState2
};

// The bytes of `role` of tensor `t`: its elements at the role's dtype, or
// in kQ8, the codes of whole blocks and a 4-byte scale a block.
uint64_t TensorBytes(const TensorLayout& t, Role role);

struct ChunkLayout {
  Role role = Role::kCompute;
  Tier home = Tier::kHost;
  uint64_t bytes = 0;  // a multiple of kChunkAlign
};

struct GroupLayout {
  std::string name;
  std::vector<TensorLayout> tensors;
  std::vector<ChunkLayout> chunks;
  RoleArray<int> chunk_of_role = {-1, -1, -1, -1, -1};
  RoleMask roles = 0;
  RoleMask device_roles = kAllRoles;  // Placement::device_roles
  // Per role: the element index just past its last tensor (0: unused).
  RoleArray<uint64_t> elements;
  // Some tensor's state is kQ8, so the state roles hold each tensor's bytes
  // packed, not element e at e * width: the optimizer steps the group
  // tensor by tensor.
  bool packed_state = false;
};

// Element count of `shape`, or 0 when a dimension is zero or negative or
// the product overflows 2^62 (BuildGroupLayout refuses such shapes).
uint64_t ShapeElements(const std::vector<int64_t>& shape);

// Validates `spec` (names, shapes, dtypes, roles, placements) and packs it,
// its state roles in `state`. Errors name the group and
// tensor at fault.
Result<GroupLayout> BuildGroupLayout(const GroupSpec& spec,
                                     const Placement& defaults,
                                     StateFormat state = StateFormat::kF32);

}  // namespace strata::store

#endif  // STRATA_SRC_STORE_LAYOUT_H_
