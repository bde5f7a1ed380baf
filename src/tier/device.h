// The device tier: memory on the accelerator under a hard byte budget, and
// asynchronous copies between it and host memory.
//
// Two backends sit behind one interface, chosen at run time:
// - kCuda: one cudaMalloc'd arena of `budget` bytes, carved with a
//   RangeAllocator; copies run on two non-blocking streams (host->device and
//   device->host) and complete through CUDA events.
// - kHostEmulated: "device" memory is host memory under the same hard
//   budget, and copies run on two worker threads (one per direction, each
//   in FIFO order like a stream) that signal completion events. Every
//   scheduling path therefore runs without a GPU.
// OpenDevice() with kAuto picks CUDA when the build has it and a GPU is
// present, otherwise the host-emulated device, and DeviceInfo::reason says
// why.
//
// Ownership: the Device owns its arena; pointers from Allocate() stay valid
// until Free() or the Device's destruction. Copy sources and destinations
// must stay valid until the copy's event completes. Destroying the Device
// first finishes every copy in flight; Events may outlive it.
//
// Ordering: copies in one direction complete in the order they were
// issued; the two directions are independent, so a copy back to the host
// must wait for the event of the copy to the device it depends on.
//
// Thread safety: every method may be called from any thread.
//
// Failure: Allocate() beyond the budget returns kResourceExhausted naming
// the tier, the bytes asked for, the bytes free and the largest free range.
// A copy or Memset whose device range is not inside one allocation of this
// device, whose host range lies in device memory, or that has a null
// pointer, is rejected with kInvalidArgument before anything runs. A CUDA
// failure the context survives comes back as a Status (through the event's
// Wait() for a copy, with CUDA's error text); a sticky CUDA error (the
// context is lost) aborts with file:line (DESIGN §4.3).
#ifndef STRATA_SRC_TIER_DEVICE_H_
#define STRATA_SRC_TIER_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "strata/engine.h"
#include "strata/status.h"

namespace strata::tier {

enum class DeviceKind { kAuto, kHostEmulated, kCuda };

// The two copy engines (streams) of a device.
enum class Direction { kToDevice, kToHost };

// "auto", "host" (or "emulated"), "cuda".
Result<DeviceKind> ParseDeviceKind(std::string_view name);
std::string_view DeviceKindName(DeviceKind kind);

// Whether this build has CUDA and a GPU is visible; `why` (when not null)
// gets the reason when it is not.
bool CudaAvailable(std::string* why = nullptr);

struct DeviceOptions {
  DeviceKind kind = DeviceKind::kAuto;
  uint64_t budget = 0;       // bytes of device memory strata may use; > 0
  int cuda_device = 0;       // CUDA ordinal
  uint64_t alignment = 256;  // allocation granularity, a power of two
};

struct DeviceInfo {
  DeviceKind kind = DeviceKind::kHostEmulated;
  std::string name;          // "host-emulated" or the GPU's name
  std::string reason;        // why kAuto chose this backend
  int numa_node = -1;        // the GPU's NUMA node, -1 when unknown or emulated
  uint64_t budget = 0;       // usable bytes: options.budget rounded down to the
                             // alignment
  uint64_t alignment = 256;  // every allocation is a multiple of it
};

struct DeviceStats {
  uint64_t used = 0;       // bytes allocated now
  uint64_t peak = 0;       // most bytes ever allocated at once
  uint64_t h2d_bytes = 0;  // bytes of host->device copies issued
  uint64_t d2h_bytes = 0;  // bytes of device->host copies issued
};

// Completion of one asynchronous copy. Copyable; copies share the copy.
// A default-constructed Event is already complete and OK.
class Event {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual bool Poll() = 0;
    virtual Status Wait() = 0;
  };
  Event() = default;
  explicit Event(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  // True once the copy has finished (successfully or not).
  bool Poll() const { return impl_ == nullptr || impl_->Poll(); }
  // Blocks until the copy finishes; returns its outcome. Repeatable.
  Status Wait() const { return impl_ == nullptr ? Status() : impl_->Wait(); }
  // The backend's event (null when complete from the start), for a backend
  // that orders its streams after it.
  Impl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<Impl> impl_;
};

// Host memory that a device copies to and from at full speed: page-locked
// and known to its driver (cudaHostAlloc), as ggml's CUDA backend supplies
// its pinned host buffer type. The pinned host tier takes its slab from the
// device's allocator when it has one (Note [Device host memory] in
// pinned_pool.cc).
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  // How the memory is obtained, for PinnedPoolInfo::backing.
  virtual const char* name() const = 0;
  // `bytes` of page-locked host memory, at least 4096-aligned, its pages
  // placed by the calling thread's NUMA policy and already faulted in; or
  // nullptr when the device cannot supply them (the caller falls back to
  // ordinary pages).
  virtual void* Allocate(uint64_t bytes) = 0;
  // Returns memory from Allocate().
  virtual void Free(void* ptr) = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceInfo& info() const = 0;
  virtual DeviceStats stats() const = 0;
  // The device's host allocator, or null when ordinary locked pages serve
  // it as well (the host-emulated device). Valid for the device's lifetime;
  // its memory must be freed before the device is destroyed.
  virtual HostAllocator* host_allocator() { return nullptr; }

  // Device memory for `bytes` (rounded up to the alignment; 0 counts as
  // one alignment unit).
  virtual Result<void*> Allocate(uint64_t bytes) = 0;
  // Frees memory from Allocate(); nullptr is a no-op, any other pointer
  // that is not a live allocation of this device aborts.
  virtual void Free(void* ptr) = 0;
  virtual uint64_t free_bytes() const = 0;

  // Asynchronous copies. `host` is host memory (pinned for full speed on
  // CUDA), `device` lies inside memory from Allocate(). A 0-byte copy
  // returns an event that is already complete.
  virtual Result<Event> CopyToDevice(void* device, const void* host,
                                     size_t bytes) = 0;
  virtual Result<Event> CopyToHost(void* host, const void* device,
                                   size_t bytes) = 0;
  // Fills device memory with `byte`, synchronously. Not ordered after the
  // copies in flight: the caller must not fill memory a copy in flight
  // reads or writes (strata frees or reuses memory only after its copies
  // land). So a fill never waits behind the copies to the device, which
  // may themselves wait for NVMe reads: each AcquireGradients zeroes a
  // gradient buffer while backward waits for it.
  virtual Status Memset(void* device, int byte, size_t bytes) = 0;

  // Fences (Note [Fences] in src/store/residency_holds.cc). The point of a
  // caller's work that `fence` names, as an Event: on CUDA a cudaStream_t or a
  // cudaEvent_t, on the host-emulated device a HostStream*. The default
  // fence gives an Event that is already complete; one the backend cannot
  // use is kInvalidArgument.
  virtual Result<Event> Record(const Fence& fence) = 0;
  // Copies in `direction` issued from now on start only after `event`
  // completed; the call itself does not wait (on CUDA, the stream waits).
  virtual Status OrderAfter(Direction direction, const Event& event) = 0;
  // The caller's `stream` (as in a Fence) waits for `event` before the work
  // queued on it later; the call itself does not wait.
  virtual Status StreamWait(void* stream, const Event& event) = 0;
};

// kInvalidArgument for a zero budget, a budget below the alignment or an
// alignment that is not a power of two; kUnavailable for kCuda without CUDA
// (naming why and --device host); kResourceExhausted when the budget
// cannot be reserved.
Result<std::unique_ptr<Device>> OpenDevice(const DeviceOptions& options);

}  // namespace strata::tier

#endif  // STRATA_SRC_TIER_DEVICE_H_
