// Private to the device tier: what both backends share.
//
// ArenaDevice owns the allocation, budget, validation and statistics logic
// for a Device whose memory is one contiguous arena. A backend supplies the
// arena (its base address, fixed for the device's lifetime) and the two
// primitives that differ: starting an asynchronous copy and filling memory.
#ifndef STRATA_SRC_TIER_DEVICE_INTERNAL_H_
#define STRATA_SRC_TIER_DEVICE_INTERNAL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "src/tier/device.h"
#include "src/tier/range_allocator.h"
#include "strata/status.h"

namespace strata::tier::internal {

// `address` rounded up to `alignment` (a power of two). A backend whose
// allocator guarantees less than the alignment over-allocates by the
// alignment and places its arena here.
inline std::byte* AlignUp(void* address, uint64_t alignment) {
  const auto addr = reinterpret_cast<uintptr_t>(address);
  return reinterpret_cast<std::byte*>((addr + alignment - 1) &
                                      ~(alignment - 1));
}

class ArenaDevice : public Device {
 public:
  const DeviceInfo& info() const override { return info_; }
  DeviceStats stats() const override;

  Result<void*> Allocate(uint64_t bytes) override;
  void Free(void* ptr) override;
  uint64_t free_bytes() const override;

  Result<Event> CopyToDevice(void* device, const void* host,
                             size_t bytes) override;
  Result<Event> CopyToHost(void* host, const void* device,
                           size_t bytes) override;
  Status Memset(void* device, int byte, size_t bytes) override;

 protected:
  // `info.budget` must already be the usable arena size: a multiple of
  // `alignment`, and the arena at `base` at least that large.
  ArenaDevice(DeviceInfo info, std::byte* base, uint64_t alignment);

  // Starts a copy whose arguments have been validated; returns its event.
  virtual Result<Event> StartCopy(Direction direction, void* dst,
                                  const void* src, size_t bytes) = 0;
  // Fills validated device memory, after the host->device copies issued
  // before it, and returns when the fill is done.
  virtual Status Fill(void* device, int byte, size_t bytes) = 0;

 private:
  // The prefix of every message: "device tier (<backend name>)".
  std::string Tier() const;
  Status Invalid(const char* what, const std::string& problem) const;
  // The device range must lie inside one live allocation.
  Status CheckDevice(const void* device, size_t bytes, const char* what) const;
  // CheckDevice, and the host range must be non-null and outside the arena.
  Status CheckCopy(const void* device, const void* host, size_t bytes,
                   const char* what) const;
  // Starts a validated copy and counts its bytes once it is issued.
  Result<Event> Issue(Direction direction, void* dst, const void* src,
                      size_t bytes);
  Status ExhaustedStatus(uint64_t bytes) const;

  const DeviceInfo info_;
  std::byte* const base_;

  mutable std::mutex mu_;
  RangeAllocator ranges_;  // guarded by mu_
  // offset -> reserved size; guarded by mu_ (Note [Live allocation map]).
  std::map<uint64_t, uint64_t> live_;
  uint64_t peak_ = 0;  // guarded by mu_
  std::atomic<uint64_t> h2d_bytes_{0};
  std::atomic<uint64_t> d2h_bytes_{0};
};

// The backends. `options` is validated by OpenDevice(); `reason` becomes
// DeviceInfo::reason.
Result<std::unique_ptr<Device>> OpenHostDevice(const DeviceOptions& options,
                                               std::string reason);
#ifdef STRATA_HAVE_CUDA
// Whether the CUDA runtime sees a GPU; `why` gets the reason when not.
bool ProbeCuda(std::string* why);
Result<std::unique_ptr<Device>> OpenCudaDevice(const DeviceOptions& options,
                                               std::string reason);
#endif

}  // namespace strata::tier::internal

#endif  // STRATA_SRC_TIER_DEVICE_INTERNAL_H_
