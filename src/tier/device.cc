#include "src/tier/device.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <utility>

#include "common/text.h"
#include "src/tier/device_internal.h"

namespace strata::tier {
namespace {

bool IsPowerOfTwo(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// Rejects options no backend can use and rounds the budget down to the
// alignment, so every backend sees a budget its RangeAllocator uses whole.
Result<DeviceOptions> Normalize(DeviceOptions options) {
  if (options.budget == 0) {
    return Status::InvalidArgument(
        "device tier: the device budget is 0 bytes; give the bytes "
        "of device memory strata may use (--device-budget)");
  }
  if (!IsPowerOfTwo(options.alignment)) {
    return Status::InvalidArgument("device tier: allocation alignment " +
                                   std::to_string(options.alignment) +
                                   " is not a power of two; use e.g. 256");
  }
  const uint64_t usable =
      options.budget / options.alignment * options.alignment;
  if (usable == 0) {
    return Status::InvalidArgument(
        "device tier: the device budget (" + HumanBytes(options.budget) +
        ") is smaller than the allocation alignment (" +
        HumanBytes(options.alignment) +
        "); raise the budget (--device-budget)");
  }
  options.budget = usable;
  return options;
}

}  // namespace

Result<DeviceKind> ParseDeviceKind(std::string_view name) {
  if (name == "auto") return DeviceKind::kAuto;
  if (name == "host" || name == "emulated") return DeviceKind::kHostEmulated;
  if (name == "cuda") return DeviceKind::kCuda;
  return Status::InvalidArgument("unknown device kind '" + std::string(name) +
                                 "'; use auto, host (or emulated) or cuda");
}

std::string_view DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kAuto:
      return "auto";
    case DeviceKind::kHostEmulated:
      return "host";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

bool CudaAvailable(std::string* why) {
#ifdef STRATA_HAVE_CUDA
  return internal::ProbeCuda(why);
#else
  if (why != nullptr) {
    *why = "built without CUDA (nvcc not found at configure time)";
  }
  return false;
#endif
}

Result<std::unique_ptr<Device>> OpenDevice(const DeviceOptions& options) {
  STRATA_ASSIGN_OR_RETURN(DeviceOptions normalized, Normalize(options));
  if (options.kind == DeviceKind::kHostEmulated) {
    return internal::OpenHostDevice(normalized,
                                    "host-emulated device requested");
  }
  std::string why;
  if (CudaAvailable(&why)) {  // never true in a build without CUDA
#ifdef STRATA_HAVE_CUDA
    return internal::OpenCudaDevice(
        normalized, options.kind == DeviceKind::kAuto
                        ? "auto: a CUDA device is present, using it"
                        : "CUDA device requested");
#endif
  }
  if (options.kind == DeviceKind::kCuda) {
    return Status::Unavailable(
        "device tier: a CUDA device was requested but CUDA is "
        "unavailable: " +
        why +
        "; run on the host-emulated device instead "
        "(--device host)");
  }
  return internal::OpenHostDevice(
      normalized, "auto: " + why + ", using the host-emulated device");
}

namespace internal {

// Note [Live allocation map]
// RangeAllocator answers "how large is the range that starts here", but
// copy validation needs "which allocation contains this address", a floor
// lookup it does not offer. live_ mirrors the allocator's allocated ranges
// for that lookup; both change together under mu_.

namespace {

DeviceInfo WithAlignment(DeviceInfo info, uint64_t alignment) {
  info.alignment = alignment;
  return info;
}

}  // namespace

ArenaDevice::ArenaDevice(DeviceInfo info, std::byte* base, uint64_t alignment)
    : info_(WithAlignment(std::move(info), alignment)),
      base_(base),
      ranges_(info_.budget, alignment) {
  STRATA_CHECK(base_ != nullptr);
  STRATA_CHECK(ranges_.capacity() == info_.budget);
}

std::string ArenaDevice::Tier() const {
  if (info_.kind == DeviceKind::kHostEmulated) {
    return "device tier (host-emulated)";
  }
  return "device tier (CUDA " + info_.name + ")";
}

DeviceStats ArenaDevice::stats() const {
  DeviceStats stats;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats.used = ranges_.used();
    stats.peak = peak_;
  }
  stats.h2d_bytes = h2d_bytes_.load(std::memory_order_relaxed);
  stats.d2h_bytes = d2h_bytes_.load(std::memory_order_relaxed);
  return stats;
}

uint64_t ArenaDevice::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ranges_.free_bytes();
}

Result<void*> ArenaDevice::Allocate(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<uint64_t> offset = ranges_.Allocate(bytes);
  if (!offset) return ExhaustedStatus(bytes);
  // Note [Live allocation map]
  live_.emplace(*offset, ranges_.SizeOf(*offset));
  peak_ = std::max(peak_, ranges_.used());
  return static_cast<void*>(base_ + *offset);
}

// Called with mu_ held.
Status ArenaDevice::ExhaustedStatus(uint64_t bytes) const {
  const uint64_t largest = ranges_.largest_free();
  std::string msg = Tier() + ": cannot allocate " + HumanBytes(bytes) + ": " +
                    HumanBytes(ranges_.free_bytes()) + " free of budget " +
                    HumanBytes(info_.budget) + ", largest free range " +
                    HumanBytes(largest);
  if (ranges_.free_bytes() >= ranges_.RoundUp(bytes)) {
    msg += " (the free memory is fragmented)";
  }
  msg +=
      "; raise the device budget (--device-budget) or free device memory "
      "first";
  return Status::ResourceExhausted(std::move(msg));
}

void ArenaDevice::Free(void* ptr) {
  if (ptr == nullptr) return;
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  const auto base = reinterpret_cast<uintptr_t>(base_);
  STRATA_CHECK(addr >= base && addr - base < info_.budget);
  const uint64_t offset = addr - base;
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_CHECK(live_.erase(offset) == 1);
  ranges_.Free(offset);
}

Status ArenaDevice::Invalid(const char* what,
                            const std::string& problem) const {
  return Status::InvalidArgument(Tier() + ": " + what + ": " + problem);
}

Status ArenaDevice::CheckDevice(const void* device, size_t bytes,
                                const char* what) const {
  if (device == nullptr) return Invalid(what, "the device pointer is null");
  const auto addr = reinterpret_cast<uintptr_t>(device);
  const auto base = reinterpret_cast<uintptr_t>(base_);
  if (addr < base || addr - base >= info_.budget) {
    return Invalid(what,
                   "the device pointer is not memory of this device; pass "
                   "memory from its Allocate()");
  }
  const uint64_t offset = addr - base;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(offset);
  if (it == live_.begin() ||
      offset >= std::prev(it)->first + std::prev(it)->second) {
    return Invalid(what, "device offset " + std::to_string(offset) +
                             " lies in no allocation (freed or never "
                             "allocated)");
  }
  --it;
  const uint64_t end = it->first + it->second;
  if (bytes > end - offset) {
    return Invalid(what, HumanBytes(bytes) + " at device offset " +
                             std::to_string(offset) +
                             " run past the end of its " +
                             HumanBytes(it->second) + " allocation at offset " +
                             std::to_string(it->first) + "; at most " +
                             std::to_string(end - offset) + " bytes fit");
  }
  return Status();
}

// Host memory that overlaps the arena is rejected on both backends, so a
// host/device mix-up that CUDA would reject is caught without a GPU too.
Status ArenaDevice::CheckCopy(const void* device, const void* host,
                              size_t bytes, const char* what) const {
  STRATA_RETURN_IF_ERROR(CheckDevice(device, bytes, what));
  if (host == nullptr) return Invalid(what, "the host pointer is null");
  const auto addr = reinterpret_cast<uintptr_t>(host);
  const auto base = reinterpret_cast<uintptr_t>(base_);
  if (addr < base + info_.budget && base < addr + bytes) {
    return Invalid(what,
                   "the host range lies in this device's memory; pass host "
                   "memory (device-to-device copies are not supported)");
  }
  return Status();
}

Result<Event> ArenaDevice::Issue(Direction direction, void* dst,
                                 const void* src, size_t bytes) {
  if (bytes == 0) return Event();
  Result<Event> event = StartCopy(direction, dst, src, bytes);
  if (event.ok()) {
    std::atomic<uint64_t>& counter =
        direction == Direction::kToDevice ? h2d_bytes_ : d2h_bytes_;
    counter.fetch_add(bytes, std::memory_order_relaxed);
  }
  return event;
}

Result<Event> ArenaDevice::CopyToDevice(void* device, const void* host,
                                        size_t bytes) {
  STRATA_RETURN_IF_ERROR(CheckCopy(device, host, bytes, "copy to device"));
  return Issue(Direction::kToDevice, device, host, bytes);
}

Result<Event> ArenaDevice::CopyToHost(void* host, const void* device,
                                      size_t bytes) {
  STRATA_RETURN_IF_ERROR(CheckCopy(device, host, bytes, "copy to host"));
  return Issue(Direction::kToHost, host, device, bytes);
}

Status ArenaDevice::Memset(void* device, int byte, size_t bytes) {
  STRATA_RETURN_IF_ERROR(CheckDevice(device, bytes, "memset"));
  if (bytes == 0) return Status();
  return Fill(device, byte, bytes);
}

}  // namespace internal
}  // namespace strata::tier
