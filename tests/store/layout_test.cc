// src/store/layout.h: where a group's tensors lie in each role's chunk, in
// every state format; the 8-bit state packed tensor by tensor.
#include "src/store/layout.h"

#include <gtest/gtest.h>

#include "strata/cpu_adam.h"

namespace strata::store {
namespace {

constexpr RoleMask kState1 = RoleBit(Role::kState1);

GroupSpec Spec() {
  GroupSpec spec;
  spec.name = "layer";
  spec.tensors.push_back({"w", {5000}, DType::kBFloat16, kAllRoles});
  spec.tensors.push_back({"b", {333}, DType::kBFloat16, kAllRoles});
  spec.tensors.push_back({"n", {7}, DType::kBFloat16, RoleBit(Role::kCompute)});
  return spec;
}

// fp32 and bf16 state lie by element, as every other role: element e at
// e * width, so the optimizer steps the group in one pass.
TEST(LayoutTest, StateByElementInFp32AndBf16) {
  for (StateFormat state : {StateFormat::kF32, StateFormat::kBF16}) {
    SCOPED_TRACE(std::string(StateFormatName(state)));
    auto layout = BuildGroupLayout(Spec(), {}, state);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    const size_t width = state == StateFormat::kF32 ? 4 : 2;
    EXPECT_FALSE(layout->packed_state);
    const TensorLayout& b = layout->tensors[1];
    EXPECT_EQ(b.element, 5120u);
    EXPECT_EQ(b.state, state);
    EXPECT_EQ(b.offset[Role::kState1], 5120 * width);
    EXPECT_EQ(TensorBytes(b, Role::kState1), 333 * width);
    EXPECT_EQ(TensorBytes(b, Role::kMaster), 333 * 4u);
    EXPECT_EQ(layout->tensors[2].state, StateFormat::kF32) << "no state role";
    // (5120 + 333) elements, up to 4096 bytes.
    EXPECT_EQ(layout->chunks[layout->chunk_of_role[Role::kState2]].bytes,
              width == 4 ? 24576u : 12288u);
  }
}

// int8: the tensor of 5000 elements keeps 20 blocks of codes and their
// scales, the one of 333 fp32 elements after it at a 256-byte boundary;
// the other roles lie by element as before.
TEST(LayoutTest, Int8StateIsPackedTensorByTensor) {
  auto layout = BuildGroupLayout(Spec(), {}, StateFormat::kQ8);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_TRUE(layout->packed_state);
  const TensorLayout& w = layout->tensors[0];
  const TensorLayout& b = layout->tensors[1];
  EXPECT_EQ(w.state, StateFormat::kQ8);
  EXPECT_EQ(b.state, StateFormat::kF32) << "under kQ8MinElements";
  EXPECT_EQ(w.offset[Role::kState1], 0u);
  EXPECT_EQ(TensorBytes(w, Role::kState1), 20 * (kQ8Block + 4));
  EXPECT_EQ(b.offset[Role::kState1], 5376u);  // 5200 up to 256
  EXPECT_EQ(TensorBytes(b, Role::kState2), 333 * 4u);
  EXPECT_EQ(layout->chunks[layout->chunk_of_role[Role::kState1]].bytes, 8192u);
  EXPECT_EQ(b.offset[Role::kMaster], 5120 * 4u);
  EXPECT_EQ(RoleDType(Role::kState1, w.dtype, w.state), DType::kUInt8);
  EXPECT_EQ(layout->roles & kState1, kState1);

  // A group of small tensors alone keeps fp32 state by element: one pass.
  GroupSpec small = Spec();
  small.tensors.erase(small.tensors.begin());
  auto flat = BuildGroupLayout(small, {}, StateFormat::kQ8);
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  EXPECT_FALSE(flat->packed_state);
  EXPECT_EQ(flat->tensors[0].state, StateFormat::kF32);
  EXPECT_EQ(flat->tensors[0].offset[Role::kState1], 0u);
}

}  // namespace
}  // namespace strata::store
