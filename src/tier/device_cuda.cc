// The CUDA device: one cudaMalloc'd arena of the budget, two non-blocking
// streams (host->device, device->host), one CUDA event per copy.
//
// Note [Sticky CUDA errors]
// Some CUDA errors (an illegal address, a failed launch, an uncorrectable
// ECC error, ...) corrupt the context: every later call fails the same way
// and only a new process recovers. Those abort with file:line (DESIGN
// §4.3), since no caller can handle them. Every other failure (out of
// memory, an invalid value, no driver) is the environment's and becomes a
// Status carrying CUDA's error name and text; the error is then cleared
// with cudaGetLastError() so that it does not surface again in unrelated
// code that shares the thread (a framework checking cudaPeekAtLastError).
//
// Note [Current device]
// CUDA calls act on the calling thread's current device, and any thread may
// call this Device. Each entry point switches to the device's ordinal only
// when the thread is elsewhere and switches back on return, so a caller
// working on another GPU is left where it was, and the common one-GPU case
// costs one cudaGetDevice.
#include <cuda_runtime_api.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>

#include "common/text.h"
#include "src/tier/device_internal.h"

namespace strata::tier::internal {
namespace {

bool IsSticky(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

StatusCode CodeFor(cudaError_t err) {
  switch (err) {
    case cudaErrorMemoryAllocation:
      return StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
      return StatusCode::kInvalidArgument;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kInternal;
  }
}

std::string CudaText(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) +
         ")";
}

[[noreturn]] void CudaAbort(cudaError_t err, const std::string& what,
                            const char* file, int line) {
  std::fprintf(stderr,
               "strata: %s:%d: CUDA error in %s: %s; the CUDA context is "
               "unusable, restart the process\n",
               file, line, what.c_str(), CudaText(err).c_str());
  std::abort();
}

// Note [Sticky CUDA errors]
Status CudaStatus(cudaError_t err, const std::string& what, const char* file,
                  int line) {
  if (err == cudaSuccess) return Status();
  if (IsSticky(err)) CudaAbort(err, what, file, line);
  cudaGetLastError();
  return Status(CodeFor(err), what + ": " + CudaText(err));
}

// For calls that cannot fail on a healthy context (releasing what was
// created); a failure is a bug or a lost context. cudaErrorCudartUnloading
// means the process is exiting and the runtime already released it all.
void CudaCheck(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess && err != cudaErrorCudartUnloading) {
    CudaAbort(err, what, file, line);
  }
}

#define STRATA_CUDA_STATUS(call, what) \
  CudaStatus((call), (what), __FILE__, __LINE__)
#define STRATA_CUDA_CHECK(call) CudaCheck((call), #call, __FILE__, __LINE__)

// Note [Current device]
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal) {
    status_ = STRATA_CUDA_STATUS(cudaGetDevice(&previous_),
                                 "device tier: cudaGetDevice");
    if (!status_.ok() || previous_ == ordinal) return;
    status_ = STRATA_CUDA_STATUS(
        cudaSetDevice(ordinal),
        "device tier: cudaSetDevice(" + std::to_string(ordinal) + ")");
    switched_ = status_.ok();
  }
  ~ScopedDevice() {
    if (switched_) STRATA_CUDA_CHECK(cudaSetDevice(previous_));
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  // Whether the thread is on the device now.
  const Status& status() const { return status_; }

 private:
  Status status_;
  int previous_ = 0;
  bool switched_ = false;
};

// The event of one copy; destroyed with the last Event that shares it.
class CudaEvent : public Event::Impl {
 public:
  explicit CudaEvent(cudaEvent_t event) : event_(event) {}
  cudaEvent_t raw() const { return event_; }
  ~CudaEvent() override { STRATA_CUDA_CHECK(cudaEventDestroy(event_)); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  bool Poll() override {
    const cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) return false;
    // Finished: a recoverable failure is for Wait() to report.
    if (IsSticky(err)) CudaAbort(err, "cudaEventQuery", __FILE__, __LINE__);
    return true;
  }
  Status Wait() override {
    return STRATA_CUDA_STATUS(cudaEventSynchronize(event_),
                              "device tier: waiting for a CUDA copy");
  }

 private:
  cudaEvent_t event_;
};

// What the device owns on the GPU, released in the destructor after the
// streams drained, so the copies in flight finish before the arena goes.
struct CudaResources {
  explicit CudaResources(int device) : ordinal(device) {}
  ~CudaResources() {
    ScopedDevice on(ordinal);
    // Switching to a device that opened fine fails only while the runtime
    // unloads at process exit, and the runtime releases everything then.
    if (!on.status().ok()) return;
    for (cudaStream_t stream : {to_device, to_host, fences, fills}) {
      if (stream == nullptr) continue;
      STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
      STRATA_CUDA_CHECK(cudaStreamDestroy(stream));
    }
    if (raw != nullptr) STRATA_CUDA_CHECK(cudaFree(raw));
  }
  CudaResources(const CudaResources&) = delete;
  CudaResources& operator=(const CudaResources&) = delete;

  const int ordinal;
  void* raw = nullptr;         // from cudaMalloc
  std::byte* arena = nullptr;  // `raw` aligned up
  cudaStream_t to_device = nullptr;
  cudaStream_t to_host = nullptr;
  cudaStream_t fences = nullptr;  // captures a caller's event (Record)
  cudaStream_t fills = nullptr;   // Memset, behind no copy
};

// Portable pinned memory, so any device of the process copies from it at
// full speed.
class CudaHostAllocator : public HostAllocator {
 public:
  const char* name() const override { return "cudaHostAlloc"; }
  void* Allocate(uint64_t bytes) override {
    void* data = nullptr;
    if (cudaHostAlloc(&data, bytes, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();  // the caller falls back to ordinary pages
      return nullptr;
    }
    return data;
  }
  void Free(void* ptr) override { STRATA_CUDA_CHECK(cudaFreeHost(ptr)); }
};

class CudaDevice : public ArenaDevice {
 public:
  CudaDevice(DeviceInfo info, std::unique_ptr<CudaResources> gpu,
             uint64_t alignment)
      : ArenaDevice(std::move(info), gpu->arena, alignment),
        gpu_(std::move(gpu)) {}

  HostAllocator* host_allocator() override { return &host_allocator_; }

  // A caller's event is captured on the fences stream, so that the caller
  // may record it again at once.
  Result<Event> Record(const Fence& fence) override {
    if (fence.stream == nullptr && fence.event == nullptr) return Event();
    ScopedDevice on(gpu_->ordinal);
    if (!on.status().ok()) return on.status();
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<CudaEvent> event, NewEvent());
    cudaStream_t stream = static_cast<cudaStream_t>(fence.stream);
    if (stream == nullptr) {
      stream = gpu_->fences;
      STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(
          cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(fence.event), 0),
          "device tier: waiting for the fence's event"));
    }
    STRATA_RETURN_IF_ERROR(
        STRATA_CUDA_STATUS(cudaEventRecord(event->raw(), stream),
                           "device tier: recording a fence on the stream"));
    return Event(std::move(event));
  }

  Status OrderAfter(Direction direction, const Event& event) override {
    return StreamWait(
        direction == Direction::kToDevice ? gpu_->to_device : gpu_->to_host,
        event);
  }

  // An event of this device orders the stream; any other (complete from
  // the start) is waited for here.
  Status StreamWait(void* stream, const Event& event) override {
    auto* cuda = dynamic_cast<CudaEvent*>(event.impl());
    if (cuda == nullptr) return event.Wait();
    ScopedDevice on(gpu_->ordinal);
    if (!on.status().ok()) return on.status();
    return STRATA_CUDA_STATUS(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), cuda->raw(), 0),
        "device tier: making a stream wait for a copy or a fence");
  }

 protected:
  // On a stream of its own, so it waits for no copy (Device::Memset).
  Status Fill(void* device, int byte, size_t bytes) override {
    ScopedDevice on(gpu_->ordinal);
    if (!on.status().ok()) return on.status();
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(
        cudaMemsetAsync(device, byte, bytes, gpu_->fills),
        "device tier: cudaMemsetAsync of " + HumanBytes(bytes)));
    return STRATA_CUDA_STATUS(cudaStreamSynchronize(gpu_->fills),
                              "device tier: waiting for cudaMemsetAsync");
  }

  Result<Event> StartCopy(Direction direction, void* dst, const void* src,
                          size_t bytes) override {
    ScopedDevice on(gpu_->ordinal);
    if (!on.status().ok()) return on.status();
    const bool to_device = direction == Direction::kToDevice;
    cudaStream_t stream = to_device ? gpu_->to_device : gpu_->to_host;
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<CudaEvent> event, NewEvent());
    Status s = STRATA_CUDA_STATUS(
        cudaMemcpyAsync(
            dst, src, bytes,
            to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
            stream),
        "device tier: cudaMemcpyAsync of " + HumanBytes(bytes));
    if (!s.ok()) return s;
    s = STRATA_CUDA_STATUS(cudaEventRecord(event->raw(), stream),
                           "device tier: recording a CUDA event");
    if (!s.ok()) return s;
    return Event(std::move(event));
  }

  Result<std::shared_ptr<CudaEvent>> NewEvent() {
    cudaEvent_t raw = nullptr;
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(
        cudaEventCreateWithFlags(&raw, cudaEventDisableTiming),
        "device tier: creating a CUDA event"));
    return std::make_shared<CudaEvent>(raw);
  }

 private:
  std::unique_ptr<CudaResources> gpu_;
  CudaHostAllocator host_allocator_;
};

// The GPU's NUMA node from sysfs, -1 when unknown.
int NumaNodeOf(int ordinal) {
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), ordinal) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  // sysfs names devices "dddd:bb:dd.f" in lower case; the runtime may
  // spell the domain with eight digits and in upper case.
  std::string id(bus_id);
  if (id.find(':') == 8 && id.starts_with("0000")) id.erase(0, 4);
  for (char& c : id) c = static_cast<char>(std::tolower(c));
  std::ifstream in("/sys/bus/pci/devices/" + id + "/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node;
}

Status CheckOrdinal(int ordinal) {
  int count = 0;
  STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(cudaGetDeviceCount(&count),
                                            "device tier: cudaGetDeviceCount"));
  if (ordinal < 0 || ordinal >= count) {
    return Status::InvalidArgument(
        "device tier: CUDA device " + std::to_string(ordinal) +
        " does not exist (" + std::to_string(count) +
        " visible); pick an ordinal from 0 to " + std::to_string(count - 1) +
        " (--cuda-device)");
  }
  return Status();
}

// cudaMalloc guarantees this alignment; a larger one costs slack.
constexpr uint64_t kCudaMallocAlignment = 256;

Status AllocateArena(CudaResources& gpu, const DeviceInfo& info,
                     uint64_t alignment) {
  const uint64_t slack = alignment > kCudaMallocAlignment ? alignment : 0;
  const cudaError_t err = cudaMalloc(&gpu.raw, info.budget + slack);
  if (err == cudaSuccess) {
    gpu.arena = AlignUp(gpu.raw, alignment);
    return Status();
  }
  if (err != cudaErrorMemoryAllocation) {
    return STRATA_CUDA_STATUS(err, "device tier: cudaMalloc of the arena");
  }
  cudaGetLastError();
  size_t free = 0;
  size_t total = 0;
  std::string gpu_free = "unknown";
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
    gpu_free = HumanBytes(free) + " free of " + HumanBytes(total);
  }
  cudaGetLastError();
  return Status::ResourceExhausted(
      "device tier (CUDA " + info.name + "): cannot reserve the " +
      HumanBytes(info.budget) + " device budget: the GPU has " + gpu_free +
      "; lower the device budget (--device-budget) or free GPU "
      "memory held by other processes (nvidia-smi)");
}

}  // namespace

bool ProbeCuda(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (why != nullptr) {
      *why = "no CUDA device (cudaGetDeviceCount: " + CudaText(err) + ")";
    }
    return false;
  }
  if (count == 0) {
    if (why != nullptr) *why = "no CUDA device (cudaGetDeviceCount found 0)";
    return false;
  }
  return true;
}

Result<std::unique_ptr<Device>> OpenCudaDevice(const DeviceOptions& options,
                                               std::string reason) {
  STRATA_RETURN_IF_ERROR(CheckOrdinal(options.cuda_device));
  ScopedDevice on(options.cuda_device);
  if (!on.status().ok()) return on.status();
  cudaDeviceProp prop{};
  STRATA_RETURN_IF_ERROR(
      STRATA_CUDA_STATUS(cudaGetDeviceProperties(&prop, options.cuda_device),
                         "device tier: cudaGetDeviceProperties"));
  DeviceInfo info;
  info.kind = DeviceKind::kCuda;
  info.name = prop.name;
  info.reason = std::move(reason);
  info.numa_node = NumaNodeOf(options.cuda_device);
  info.budget = options.budget;

  auto gpu = std::make_unique<CudaResources>(options.cuda_device);
  STRATA_RETURN_IF_ERROR(AllocateArena(*gpu, info, options.alignment));
  for (cudaStream_t* stream :
       {&gpu->to_device, &gpu->to_host, &gpu->fences, &gpu->fills}) {
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(
        cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking),
        "device tier: creating a CUDA stream"));
  }
  return std::unique_ptr<Device>(std::make_unique<CudaDevice>(
      std::move(info), std::move(gpu), options.alignment));
}

}  // namespace strata::tier::internal
