// A device whose copies run late: the fake of a GPU stream whose work
// completes long after the CPU issued it. A CPU runs every copy at once, so
// without this the bugs of asynchrony (memory reused, read or validated
// before the copy is done) can never show in a test.
//
//   GatedDevice device(HostDevice(1 << 20));
//   device.Hold();                    // copies issued now wait
//   std::thread t([&] { residency.Prefetch(...); });  // blocks in Wait()
//   ...                               // the test acts while it is in flight
//   device.Release();                 // the held copies run, in order
//
// While held, a copy moves no byte and its event does not complete;
// Release() performs the held copies in issue order through the wrapped
// host-emulated device, then completes their events. Allocation, Memset
// and statistics go straight to the wrapped device.
#ifndef STRATA_TESTS_TESTUTIL_GATED_DEVICE_H_
#define STRATA_TESTS_TESTUTIL_GATED_DEVICE_H_

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>

#include "src/tier/device.h"

namespace strata::testutil {

// A host-emulated device of `budget` bytes; aborts when it cannot open.
inline std::unique_ptr<tier::Device> HostDevice(uint64_t budget) {
  auto device = tier::OpenDevice(
      {.kind = tier::DeviceKind::kHostEmulated, .budget = budget});
  STRATA_CHECK(device.ok());
  return std::move(*device);
}

class GatedDevice : public tier::Device {
 public:
  explicit GatedDevice(std::unique_ptr<tier::Device> inner)
      : inner_(std::move(inner)) {}
  ~GatedDevice() override { Release(); }

  // Copies issued from now on wait for Release().
  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    holding_ = true;
  }
  // Runs every held copy in issue order and stops holding.
  void Release() {
    std::deque<std::shared_ptr<Copy>> copies;
    {
      std::lock_guard<std::mutex> lock(mu_);
      holding_ = false;
      copies.swap(held_);
    }
    for (const std::shared_ptr<Copy>& copy : copies) copy->Run(*inner_);
  }
  // Copies issued and not yet released.
  size_t held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }

  const tier::DeviceInfo& info() const override { return inner_->info(); }
  tier::DeviceStats stats() const override { return inner_->stats(); }
  Result<void*> Allocate(uint64_t bytes) override {
    return inner_->Allocate(bytes);
  }
  void Free(void* ptr) override { inner_->Free(ptr); }
  uint64_t free_bytes() const override { return inner_->free_bytes(); }
  Result<tier::Event> CopyToDevice(void* device, const void* host,
                                   size_t bytes) override {
    return Issue(std::make_shared<Copy>(device, host, bytes, true));
  }
  Result<tier::Event> CopyToHost(void* host, const void* device,
                                 size_t bytes) override {
    return Issue(std::make_shared<Copy>(host, device, bytes, false));
  }
  Status Memset(void* device, int byte, size_t bytes) override {
    return inner_->Memset(device, byte, bytes);
  }
  Result<tier::Event> Record(const Fence& fence) override {
    return inner_->Record(fence);
  }
  Status StreamWait(void* stream, const tier::Event& event) override {
    return inner_->StreamWait(stream, event);
  }
  Status OrderAfter(tier::Direction direction,
                    const tier::Event& event) override {
    return inner_->OrderAfter(direction, event);
  }

 private:
  // One copy: its arguments, then its outcome once run.
  class Copy : public tier::Event::Impl {
   public:
    Copy(void* dst, const void* src, size_t bytes, bool to_device)
        : dst_(dst), src_(src), bytes_(bytes), to_device_(to_device) {}
    void Run(tier::Device& device) {
      Result<tier::Event> event = to_device_
                                      ? device.CopyToDevice(dst_, src_, bytes_)
                                      : device.CopyToHost(dst_, src_, bytes_);
      const Status status = event.ok() ? event->Wait() : event.status();
      std::lock_guard<std::mutex> lock(mu_);
      status_ = status;
      done_ = true;
      cv_.notify_all();
    }
    bool Poll() override {
      std::lock_guard<std::mutex> lock(mu_);
      return done_;
    }
    Status Wait() override {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return done_; });
      return status_;
    }

   private:
    void* const dst_;
    const void* const src_;
    const size_t bytes_;
    const bool to_device_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;  // guarded by mu_
    Status status_;      // guarded by mu_
  };

  Result<tier::Event> Issue(std::shared_ptr<Copy> copy) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (holding_) {
        held_.push_back(copy);
        return tier::Event(std::move(copy));
      }
    }
    copy->Run(*inner_);
    return tier::Event(std::move(copy));
  }

  const std::unique_ptr<tier::Device> inner_;
  mutable std::mutex mu_;
  bool holding_ = false;                    // guarded by mu_
  std::deque<std::shared_ptr<Copy>> held_;  // guarded by mu_
};

}  // namespace strata::testutil

#endif  // STRATA_TESTS_TESTUTIL_GATED_DEVICE_H_
