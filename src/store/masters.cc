// Masters from compute copies (Note [Masters from compute copies] in
// src/store/engine_internal.h).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu_adam/convert.h"
#include "src/store/engine_internal.h"

namespace strata::internal {
namespace {

// `master` (fp32) = the exact widening of `compute`.
void Widen(const TensorView& compute, const TensorView& master) {
  const uint64_t n = master.bytes / sizeof(float);
  auto* out = static_cast<float*>(master.data);
  const auto* in = static_cast<const uint16_t*>(compute.data);
  switch (compute.dtype) {
    case DType::kFloat32:
      std::memcpy(out, compute.data, master.bytes);
      return;
    case DType::kBFloat16:
      for (uint64_t i = 0; i < n; ++i) out[i] = cpu_adam::Bf16ToF32(in[i]);
      return;
    case DType::kFloat16:
      for (uint64_t i = 0; i < n; ++i) out[i] = cpu_adam::F16ToF32(in[i]);
      return;
    case DType::kUInt8:  // no compute copy has it
      STRATA_CHECK(false);
  }
}

bool AllZero(const GroupView& view) {
  return std::all_of(view.tensors.begin(), view.tensors.end(),
                     [](const TensorView& t) {
                       const auto* bytes = static_cast<const uint8_t*>(t.data);
                       return std::all_of(bytes, bytes + t.bytes,
                                          [](uint8_t b) { return b == 0; });
                     });
}

Result<GroupView> FetchHost(Engine& engine, int group, Role role, bool write) {
  return engine.Fetch(
      group, Tier::kHost,
      {.roles = RoleBit(role), .write = write, .record = false});
}

// Whether the group may have an unset master, before fetching anything.
bool Candidate(const store::Residency& residency, int group) {
  return residency.layout(group).chunk_of_role[Role::kMaster] >= 0 &&
         !residency.Blank(group, Role::kCompute) &&
         (residency.Blank(group, Role::kMaster) ||
          residency.WrittenTogether(group, Role::kCompute, Role::kMaster));
}

// Whether the group's master is unset; `compute` is its compute copy,
// fetched (which waited for an update of the group queued by the last
// step: it writes the master).
Result<bool> Unset(Engine& engine, const store::Residency& residency, int group,
                   const GroupView& compute) {
  if (residency.Blank(group, Role::kMaster)) return true;
  if (!residency.WrittenTogether(group, Role::kCompute, Role::kMaster) ||
      AllZero(compute)) {
    return false;
  }
  STRATA_ASSIGN_OR_RETURN(GroupView master,
                          FetchHost(engine, group, Role::kMaster, false));
  const bool zero = AllZero(master);
  STRATA_RETURN_IF_ERROR(master.pin.Release());
  return zero;
}

}  // namespace

Status EngineAccess::FillUnsetMasters(Engine& engine) {
  store::Residency& residency = *PartsOf(engine).residency;
  for (int g = 0; g < residency.group_count(); ++g) {
    if (!Candidate(residency, g)) continue;
    STRATA_ASSIGN_OR_RETURN(GroupView compute,
                            FetchHost(engine, g, Role::kCompute, false));
    Result<bool> unset = Unset(engine, residency, g, compute);
    if (unset.ok() && *unset) {
      Result<GroupView> master = FetchHost(engine, g, Role::kMaster, true);
      if (!master.ok()) return master.status();
      for (const TensorView& m : master->tensors) {
        if (const TensorView* c = compute.Find(m.name); c != nullptr) {
          Widen(*c, m);
        }
      }
      STRATA_RETURN_IF_ERROR(master->pin.Release());
    }
    STRATA_RETURN_IF_ERROR(compute.pin.Release());
    if (!unset.ok()) return unset.status();
    // Checked: a group never stepped (a frozen one) is not read again.
    residency.ForgetCallerWrites(g);
  }
  return Status();
}

}  // namespace strata::internal
