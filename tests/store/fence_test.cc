// Fences (Note [Fences] in src/store/residency_holds.cc) on the host-emulated
// device, with "kernels" that run late on a testutil::FakeStream: memory a
// released view's kernels still read is not reused, memory they still
// write is not copied down, and handed-off gradients are copied to the host
// only after the kernels that write them. Each test fails when the engine
// ignores the fence.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "strata/engine.h"
#include "strata/offload_optimizer.h"
#include "tests/testutil/fake_stream.h"

namespace strata {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kChunk = 64 * kKiB;
constexpr RoleMask kCompute = RoleBit(Role::kCompute);
constexpr auto kWhile = std::chrono::milliseconds(100);

class FenceTest : public testing::Test {
 protected:
  // A 2-chunk device; groups g, a, b of one 64 KiB compute chunk each,
  // homed on the host.
  void SetUp() override {
    EngineOptions options;
    options.device = "host";
    options.device_budget = 2 * kChunk;
    options.host_budget = 16 * kChunk;
    auto engine = Engine::Open(options);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    for (const char* name : {"g", "a", "b"}) {
      GroupSpec spec;
      spec.name = name;
      spec.tensors.push_back({"w",
                              {static_cast<int64_t>(kChunk / 2)},
                              DType::kBFloat16,
                              kCompute});
      ASSERT_TRUE(engine_->RegisterGroup(spec).ok());
    }
  }

  GroupView Fetch(int group, Tier tier, bool write = false) {
    auto view =
        engine_->Fetch(group, tier, {.roles = kCompute, .write = write});
    EXPECT_TRUE(view.ok()) << view.status().ToString();
    return view.ok() ? std::move(*view) : GroupView();
  }
  static void* Data(const GroupView& view) { return view.tensors.at(0).data; }
  static bool All(const void* data, unsigned char byte) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (uint64_t i = 0; i < kChunk; ++i) {
      if (bytes[i] != byte) return false;
    }
    return true;
  }

  static constexpr int kG = 0, kA = 1, kB = 2;
  std::unique_ptr<Engine> engine_;
  testutil::FakeStream stream_;
};

// A kernel still reads g's device copy: fetching a and b, which need its
// room, waits for the kernel; the kernel sees g's bytes, not a's zeros.
TEST_F(FenceTest, MemoryAKernelStillReadsIsNotReused) {
  GroupView w = Fetch(kG, Tier::kHost, true);
  std::memset(Data(w), 7, kChunk);
  ASSERT_TRUE(w.pin.Release().ok());
  GroupView g = Fetch(kG, Tier::kDevice);
  std::vector<unsigned char> seen(kChunk);
  void* on_device = Data(g);
  stream_.Queue([&] { std::memcpy(seen.data(), on_device, kChunk); });
  ASSERT_TRUE(g.pin.Release(stream_.fence()).ok());

  std::future<Status> others = std::async(std::launch::async, [&] {
    STRATA_ASSIGN_OR_RETURN(GroupView a, engine_->Fetch(kA, Tier::kDevice));
    STRATA_ASSIGN_OR_RETURN(GroupView b, engine_->Fetch(kB, Tier::kDevice));
    return Status();
  });
  EXPECT_EQ(others.wait_for(kWhile), std::future_status::timeout)
      << "g's device memory was reused before the kernel reading it ran";
  stream_.Run();
  EXPECT_TRUE(others.get().ok());
  EXPECT_TRUE(All(seen.data(), 7)) << "the kernel read overwritten memory";
}

// A kernel still writes g's device copy (a write view released with the
// fence): evicting g writes it down only after the kernel ran.
TEST_F(FenceTest, MemoryAKernelStillWritesIsNotCopiedEarly) {
  GroupView g = Fetch(kG, Tier::kDevice, true);
  void* on_device = Data(g);
  stream_.Queue([on_device] { std::memset(on_device, 9, kChunk); });
  ASSERT_TRUE(g.pin.Release(stream_.fence()).ok());
  std::future<Status> evict = std::async(
      std::launch::async, [&] { return engine_->Evict(kG, Tier::kDevice); });
  EXPECT_EQ(evict.wait_for(kWhile), std::future_status::timeout)
      << "g was written down before the kernel writing it ran";
  stream_.Run();
  ASSERT_TRUE(evict.get().ok());
  GroupView host = Fetch(kG, Tier::kHost);
  EXPECT_TRUE(All(Data(host), 9)) << "the kernel's bytes were lost";
}

TEST_F(FenceTest, AFenceTheDeviceCannotUseIsRefusedAndThePinStays) {
  GroupView g = Fetch(kG, Tier::kDevice);
  int not_an_event = 0;
  const Status refused = g.pin.Release({.event = &not_an_event});
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("HostStream"), std::string::npos)
      << refused.message();
  EXPECT_TRUE(g.pin.held());
  EXPECT_EQ(engine_->Evict(kG, Tier::kDevice).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(g.pin.Release().ok());
}

// The backward kernel writes the gradients late; the hand-off names its
// stream, so the copy to the host carries the kernel's gradients (1.0) and
// AdamW moves every weight by about -lr. Without the fence the copy takes
// the zeros AcquireGradients handed out, and no weight moves.
TEST(FencedHandOffTest, GradientsAreCopiedAfterTheKernelWritingThem) {
  EngineOptions options;
  options.device = "host";
  options.device_budget = options.host_budget = 4 << 20;
  auto engine = Engine::Open(options);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  GroupSpec spec;
  spec.name = "layer.0";
  spec.tensors.push_back({"w", {1000}, DType::kFloat32, kAllRoles});
  ASSERT_TRUE((*engine)->RegisterGroup(spec).ok());
  auto opt = OffloadOptimizer::Create(engine->get(), {});
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  testutil::FakeStream stream;

  (*engine)->BeginStep();
  ASSERT_TRUE((*opt)->BeginStep({.lr = 0.1}).ok());
  auto grads = (*opt)->AcquireGradients(0);
  ASSERT_TRUE(grads.ok()) << grads.status().ToString();
  float* data = static_cast<float*>(grads->data);
  stream.Queue([data] { std::fill(data, data + 1000, 1.0f); });
  ASSERT_TRUE((*opt)->HandOff(*grads, stream.fence()).ok());
  std::this_thread::sleep_for(kWhile);  // time for a copy that ran too early
  stream.Run();
  ASSERT_TRUE((*opt)->FinishStep().ok());
  ASSERT_TRUE((*engine)->EndStep().ok());

  auto master =
      (*engine)->Fetch(0, Tier::kHost, {.roles = RoleBit(Role::kMaster)});
  ASSERT_TRUE(master.ok()) << master.status().ToString();
  const auto* w = static_cast<const float*>(master->tensors.at(0).data);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_NEAR(w[i], -0.1f, 1e-3f) << "weight " << i;
  }
}

}  // namespace
}  // namespace strata
