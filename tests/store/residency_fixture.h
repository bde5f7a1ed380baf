// The fixture of the residency manager's tests (residency_test.cc and
// residency_fetch_test.cc, one binary): a Residency over a host-emulated
// device whose copies run late (testutil::GatedDevice) and a pinned pool.
#ifndef STRATA_TESTS_STORE_RESIDENCY_FIXTURE_H_
#define STRATA_TESTS_STORE_RESIDENCY_FIXTURE_H_

#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "src/store/layout.h"
#include "src/store/residency.h"
#include "tests/testutil/gated_device.h"

namespace strata::store::test {

inline constexpr uint64_t kKiB = 1024;
inline constexpr RoleMask kCompute = RoleBit(Role::kCompute);
inline constexpr Tier kDevice = Tier::kDevice;
inline constexpr Tier kHost = Tier::kHost;

// The tiers a Residency runs over: a gated host-emulated device of
// `device_chunks` 64 KiB chunks, a pinned pool, no NVMe.
class ResidencyTest : public testing::Test {
 protected:
  void Open(int device_chunks) { OpenBytes(device_chunks * 64 * kKiB); }
  void OpenBytes(uint64_t device_budget) {
    device_ = std::make_unique<testutil::GatedDevice>(
        testutil::HostDevice(device_budget));
    auto host = tier::PinnedPool::Create(
        {.budget = 4096 * kKiB, .lock = tier::LockMode::kOff}, nullptr);
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    host_ = std::move(*host);
    mover_ = std::make_unique<transport::Mover>(device_.get(), nullptr);
    residency_ = std::make_unique<Residency>(device_.get(), host_.get(),
                                             nullptr, mover_.get());
  }

  // A group of one bf16 tensor whose compute chunk is 64 KiB, homed on the
  // host, fetched to the device.
  int AddGroup(const std::string& name) {
    auto id = TryAddGroup(name, 64 * kKiB, kHost);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : -1;
  }
  // A group whose compute chunk of `bytes` is homed at `home`.
  Result<int> TryAddGroup(const std::string& name, uint64_t bytes, Tier home) {
    GroupSpec spec;
    spec.name = name;
    spec.tensors.push_back(
        {"w", {static_cast<int64_t>(bytes / 2)}, DType::kBFloat16, kCompute});
    Placement placement;
    placement.home[static_cast<int>(Role::kCompute)] = home;
    placement.device_roles = kCompute;
    auto layout = BuildGroupLayout(spec, placement);
    EXPECT_TRUE(layout.ok()) << layout.status().ToString();
    return residency_->AddGroup(std::move(*layout));
  }

  // A group of `tensors`, homed on the host, whose `device_roles` may be
  // fetched to the device.
  int Add(const std::string& name, std::vector<TensorSpec> tensors,
          RoleMask device_roles) {
    Placement placement;
    placement.device_roles = device_roles;
    GroupSpec spec{.name = name,
                   .tensors = std::move(tensors),
                   .use_default_placement = true,
                   .placement = {}};
    auto layout = BuildGroupLayout(spec, placement);
    EXPECT_TRUE(layout.ok()) << layout.status().ToString();
    auto id = residency_->AddGroup(std::move(*layout));
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : -1;
  }

  Status FetchAndRelease(int group, Tier tier) {
    STRATA_ASSIGN_OR_RETURN(
        Residency::Fetched fetched,
        residency_->Fetch(group, tier, {.roles = kCompute}));
    return fetched.pin.Release();
  }
  // A fetch that must succeed; its pin (empty on failure).
  Pin Hold(int group, Tier tier, FetchOptions opt = {.roles = kCompute}) {
    auto fetched = residency_->Fetch(group, tier, opt);
    EXPECT_TRUE(fetched.ok()) << fetched.status().ToString();
    return fetched.ok() ? std::move(fetched->pin) : Pin();
  }

  // Whether the group's compute copy is valid at the device now: a fetch
  // there counts a hit.
  bool OnDevice(int group) {
    const uint64_t hits = residency_->counters().hits;
    EXPECT_TRUE(FetchAndRelease(group, kDevice).ok());
    return residency_->counters().hits == hits + 1;
  }

  // Writes `byte` over the group's host copy.
  void WriteHost(int group, char byte) {
    Pin pin = Hold(group, kHost, {.roles = kCompute, .write = true});
    std::memset(HostBytes(group), byte, 64 * kKiB);
    ASSERT_TRUE(pin.Release().ok());
  }
  // A prefetch of the group to the device whose copy is held in flight
  // (device_->Release() lets it land).
  std::future<Status> PrefetchHeld(int group) {
    device_->Hold();
    std::future<Status> prefetch = std::async(std::launch::async, [=, this] {
      return residency_->Prefetch(group, kDevice, kCompute, -1);
    });
    while (device_->held() == 0) std::this_thread::yield();
    return prefetch;
  }

  char* HostBytes(int group) {
    return static_cast<char*>(
        residency_->Address(group, Role::kCompute, kHost, 0));
  }

  std::unique_ptr<testutil::GatedDevice> device_;
  std::unique_ptr<tier::PinnedPool> host_;
  std::unique_ptr<transport::Mover> mover_;
  std::unique_ptr<Residency> residency_;
};

}  // namespace strata::store::test

#endif  // STRATA_TESTS_STORE_RESIDENCY_FIXTURE_H_
