// strata::ToDLPack on hand-made views: every dtype and device mapping, the
// strides, and the views it must refuse. The engine-backed round trips are
// capi/lifecycle_test.c and capi/dlpack_roundtrip.py.
#include "strata/dlpack.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace strata {
namespace {

TensorView MakeView(DType dtype, std::vector<int64_t> shape, void* data) {
  TensorView view;
  view.name = "t";
  view.dtype = dtype;
  view.shape = std::move(shape);
  view.data = data;
  uint64_t elements = 1;
  for (int64_t extent : view.shape) elements *= extent;
  view.bytes = elements * DTypeSize(dtype);
  return view;
}

// Exports `view`, checks the invariants every export shares and frees it.
DLTensor ExportAndFree(const TensorView& view, int cuda_device) {
  Result<DLManagedTensor*> managed = ToDLPack(view, cuda_device);
  EXPECT_TRUE(managed.ok()) << managed.status().ToString();
  if (!managed.ok()) return {};
  DLManagedTensor* m = *managed;
  EXPECT_NE(m->manager_ctx, nullptr);
  EXPECT_EQ(m->dl_tensor.data, view.data);
  EXPECT_EQ(m->dl_tensor.byte_offset, 0u);
  EXPECT_EQ(m->dl_tensor.dtype.lanes, 1);
  EXPECT_EQ(m->dl_tensor.ndim, static_cast<int>(view.shape.size()));
  for (size_t d = 0; d < view.shape.size(); ++d) {
    EXPECT_EQ(m->dl_tensor.shape[d], view.shape[d]) << "dimension " << d;
  }
  DLTensor copy = m->dl_tensor;
  copy.shape = nullptr;  // freed by the deleter below
  copy.strides = nullptr;
  m->deleter(m);
  return copy;
}

TEST(DLPackTest, DTypesMapToDLPackCodes) {
  float buffer[6] = {};
  DLTensor f32 = ExportAndFree(MakeView(DType::kFloat32, {2, 3}, buffer), 0);
  EXPECT_EQ(f32.dtype.code, kDLFloat);
  EXPECT_EQ(f32.dtype.bits, 32);
  DLTensor bf16 = ExportAndFree(MakeView(DType::kBFloat16, {6}, buffer), 0);
  EXPECT_EQ(bf16.dtype.code, kDLBfloat);
  EXPECT_EQ(bf16.dtype.bits, 16);
  DLTensor f16 = ExportAndFree(MakeView(DType::kFloat16, {3, 2}, buffer), 0);
  EXPECT_EQ(f16.dtype.code, kDLFloat);
  EXPECT_EQ(f16.dtype.bits, 16);
}

TEST(DLPackTest, HostMemoryIsCpuAndCudaMemoryNamesItsDevice) {
  float buffer[4] = {};
  TensorView view = MakeView(DType::kFloat32, {4}, buffer);
  DLTensor host = ExportAndFree(view, 3);
  EXPECT_EQ(host.device.device_type, kDLCPU);
  EXPECT_EQ(host.device.device_id, 0);
  view.on_cuda = true;
  DLTensor cuda = ExportAndFree(view, 3);
  EXPECT_EQ(cuda.device.device_type, kDLCUDA);
  EXPECT_EQ(cuda.device.device_id, 3);
}

TEST(DLPackTest, StridesAreCompactRowMajorInElements) {
  std::vector<uint16_t> buffer(2 * 3 * 5);
  Result<DLManagedTensor*> managed =
      ToDLPack(MakeView(DType::kBFloat16, {2, 3, 5}, buffer.data()), 0);
  ASSERT_TRUE(managed.ok()) << managed.status().ToString();
  const DLTensor& t = (*managed)->dl_tensor;
  EXPECT_EQ(t.strides[0], 15);
  EXPECT_EQ(t.strides[1], 5);
  EXPECT_EQ(t.strides[2], 1);
  (*managed)->deleter(*managed);
}

TEST(DLPackTest, ScalarsAndEmptyTensorsExport) {
  float scalar = 1.0f;
  DLTensor t = ExportAndFree(MakeView(DType::kFloat32, {}, &scalar), 0);
  EXPECT_EQ(t.ndim, 0);
  DLTensor empty = ExportAndFree(MakeView(DType::kFloat32, {4, 0}, nullptr), 0);
  EXPECT_EQ(empty.ndim, 2);
}

TEST(DLPackTest, RefusesViewsThatDoNotDescribeTheirMemory) {
  float buffer[8] = {};
  TensorView negative = MakeView(DType::kFloat32, {2, 4}, buffer);
  negative.shape[1] = -4;
  Result<DLManagedTensor*> r = ToDLPack(negative, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("negative extent"), std::string::npos);

  TensorView short_bytes = MakeView(DType::kFloat32, {2, 4}, buffer);
  short_bytes.bytes -= 4;
  r = ToDLPack(short_bytes, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("28 bytes"), std::string::npos)
      << r.status().message();

  TensorView no_memory = MakeView(DType::kFloat32, {2, 4}, nullptr);
  r = ToDLPack(no_memory, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no memory"), std::string::npos);
}

}  // namespace
}  // namespace strata
