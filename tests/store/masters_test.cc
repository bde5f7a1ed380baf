// Masters from compute copies (Note [Masters from compute copies] in
// src/store/engine_internal.h): which masters are unset, their exact
// widening, and that a group checked once is not read again.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "src/store/engine_internal.h"
#include "strata/engine.h"

namespace strata {
namespace {

using internal::EngineAccess;

constexpr int kElements = 1000;
constexpr uint16_t kBf16Five = 0x40A0;  // 5.0

std::unique_ptr<Engine> OpenWithOneGroup() {
  EngineOptions o;
  o.device = "host";
  o.device_budget = 1 << 20;
  o.host_budget = 8 << 20;
  auto engine = Engine::Open(o);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  GroupSpec spec;
  spec.name = "layer";
  spec.tensors = {{"w",
                   {kElements},
                   DType::kBFloat16,
                   RoleBit(Role::kCompute) | RoleBit(Role::kMaster)}};
  EXPECT_TRUE((*engine)->RegisterGroup(spec).ok());
  return std::move(*engine);
}

// Fetches `roles` for writing and fills compute with 5.0 and the master
// with `master` (when fetched).
void Write(Engine& engine, RoleMask roles, float master) {
  auto view = engine.Fetch(0, Tier::kHost, {.roles = roles, .write = true});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  for (const TensorView& t : view->tensors) {
    if (t.role == Role::kCompute) {
      auto* w = static_cast<uint16_t*>(t.data);
      for (int i = 0; i < kElements; ++i) w[i] = kBf16Five;
    } else {
      auto* w = static_cast<float*>(t.data);
      for (int i = 0; i < kElements; ++i) w[i] = master;
    }
  }
}

float MasterAt(Engine& engine, int i) {
  auto view = engine.Fetch(0, Tier::kHost, {.roles = RoleBit(Role::kMaster)});
  EXPECT_TRUE(view.ok());
  return static_cast<const float*>(view->tensors[0].data)[i];
}

bool Together(Engine& engine) {
  return internal::PartsOf(engine).residency->WrittenTogether(0, Role::kCompute,
                                                              Role::kMaster);
}

TEST(MastersTest, AMasterNeverWrittenTakesTheWidening) {
  auto engine = OpenWithOneGroup();
  Write(*engine, RoleBit(Role::kCompute), 0);
  ASSERT_TRUE(EngineAccess::FillUnsetMasters(*engine).ok());
  EXPECT_EQ(MasterAt(*engine, kElements - 1), 5.0f);
}

TEST(MastersTest, AnAllZeroMasterWrittenWithItsComputeCopyTakesIt) {
  auto engine = OpenWithOneGroup();
  Write(*engine, kAllRoles, 0.0f);
  EXPECT_TRUE(Together(*engine));
  ASSERT_TRUE(EngineAccess::FillUnsetMasters(*engine).ok());
  EXPECT_EQ(MasterAt(*engine, 0), 5.0f);
}

// A frozen group is never stepped, so nothing else ends its "written
// together": the check does, or every step would read the group again.
TEST(MastersTest, AGroupCheckedOnceIsNotReadAgain) {
  auto engine = OpenWithOneGroup();
  Write(*engine, kAllRoles, 2.0f);
  ASSERT_TRUE(Together(*engine));
  ASSERT_TRUE(EngineAccess::FillUnsetMasters(*engine).ok());
  EXPECT_EQ(MasterAt(*engine, 0), 2.0f);  // set: kept
  EXPECT_FALSE(Together(*engine));
}

TEST(MastersTest, AMasterWrittenAloneIsKeptZerosIncluded) {
  auto engine = OpenWithOneGroup();
  Write(*engine, RoleBit(Role::kCompute), 0);
  Write(*engine, RoleBit(Role::kMaster), 0.0f);
  EXPECT_FALSE(Together(*engine));
  ASSERT_TRUE(EngineAccess::FillUnsetMasters(*engine).ok());
  EXPECT_EQ(MasterAt(*engine, 0), 0.0f);
}

}  // namespace
}  // namespace strata
