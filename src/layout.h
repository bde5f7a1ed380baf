// Group layout: how a group's tensors are packed into chunks, one chunk per
// role, each tensor at a 256-byte boundary (what CUDA and DLPack consumers
// expect) and each chunk a multiple of 4096 bytes (what O_DIRECT needs).
// Pure: validation and arithmetic, no memory.
#ifndef STRATA_SRC_LAYOUT_H_
#define STRATA_SRC_LAYOUT_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/engine.h"

namespace strata::store {

inline constexpr uint64_t kTensorAlign = 256;
inline constexpr uint64_t kChunkAlign = 4096;

struct TensorLayout {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  RoleMask roles = 0;
  uint64_t elements = 0;
  std::array<uint64_t, kNumRoles> offset = {};  // within the role's chunk
};

struct ChunkLayout {
  Role role = Role::kCompute;
  Tier home = Tier::kHost;
  uint64_t bytes = 0;  // a multiple of kChunkAlign
};

struct GroupLayout {
  std::string name;
  std::vector<TensorLayout> tensors;
  std::vector<ChunkLayout> chunks;
  std::array<int, kNumRoles> chunk_of_role = {-1, -1, -1, -1, -1};
  RoleMask roles = 0;
};

// Validates `spec` (names, shapes, dtypes, roles, placements) and packs it.
// Errors name the group and tensor at fault.
Result<GroupLayout> BuildGroupLayout(const GroupSpec& spec,
                                     const Placement& defaults);

}  // namespace strata::store

#endif  // STRATA_SRC_LAYOUT_H_
