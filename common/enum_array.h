// A fixed-size array indexed by an enum, so that code says which element it
// means: copies[Tier::kHost], not copies[1].
//
//   TierArray<uint64_t> free;            // zero-initialized
//   free[Tier::kDevice] = device->free_bytes();
//   for (uint64_t bytes : free) total += bytes;
#ifndef STRATA_COMMON_ENUM_ARRAY_H_
#define STRATA_COMMON_ENUM_ARRAY_H_

#include <array>
#include <cstddef>

#include "strata/engine.h"

namespace strata {

// `Enum`'s values must be 0 .. N-1.
template <typename Enum, typename T, size_t N>
class EnumArray {
 public:
  constexpr EnumArray() = default;
  // The values in enum order: RoleArray<int> chunk = {-1, -1, -1, -1, -1}.
  template <typename... V>
  requires(sizeof...(V) == N) constexpr EnumArray(V... values)
      : values_{static_cast<T>(values)...} {}

  constexpr T& operator[](Enum e) { return values_[static_cast<size_t>(e)]; }
  constexpr const T& operator[](Enum e) const {
    return values_[static_cast<size_t>(e)];
  }
  constexpr auto begin() { return values_.begin(); }
  constexpr auto end() { return values_.end(); }
  constexpr auto begin() const { return values_.begin(); }
  constexpr auto end() const { return values_.end(); }

 private:
  std::array<T, N> values_{};
};

// Every enumerator, in order: for (Role role : kRoles) ...
inline constexpr std::array<Tier, kNumTiers> kTiers = {
    Tier::kDevice, Tier::kHost, Tier::kNvme};
inline constexpr std::array<Role, kNumRoles> kRoles = {
    Role::kCompute, Role::kMaster, Role::kState1, Role::kState2, Role::kGrad};

template <typename T>
using TierArray = EnumArray<Tier, T, kNumTiers>;
template <typename T>
using RoleArray = EnumArray<Role, T, kNumRoles>;

}  // namespace strata

#endif  // STRATA_COMMON_ENUM_ARRAY_H_
