// The host-emulated device: "device" memory is an anonymous host mapping of
// exactly the budget, and copies run on worker threads.
//
// Note [Emulated streams]
// Each direction has one worker thread running its queue in FIFO order,
// like the CUDA backend's two streams: copies in one direction complete in
// the order they were issued, and the two directions overlap. Memset runs
// on the caller's thread, behind no queued copy, as the CUDA backend's
// fills run on a stream of their own (Device::Memset).
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "common/text.h"
#include "common/thread_name.h"
#include "src/tier/device_internal.h"
#include "strata/aio.h"

namespace strata::tier::internal {
namespace {

class HostEvent : public Event::Impl {
 public:
  bool Poll() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  // A memcpy cannot fail once its arguments were validated.
  Status Wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return done_; });
    return Status();
  }
  void Complete() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    done_cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
};

// The point `mark` of a caller's HostStream (a fence on this device).
class StreamMark : public Event::Impl {
 public:
  StreamMark(HostStream* stream, uint64_t mark)
      : stream_(stream), mark_(mark) {}
  bool Poll() override { return stream_->Done(mark_); }
  Status Wait() override {
    stream_->Wait(mark_);
    return Status();
  }

 private:
  HostStream* const stream_;
  const uint64_t mark_;
};

// One emulated stream (Note [Emulated streams]). The destructor runs every
// queued job before it returns.
class WorkQueue {
 public:
  WorkQueue() : thread_([this] { Run(); }) {}
  ~WorkQueue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_one();
    thread_.join();
  }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  Event Push(std::function<void()> work) {
    auto done = std::make_shared<HostEvent>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back({std::move(work), done});
    }
    work_cv_.notify_one();
    return Event(std::move(done));
  }

 private:
  struct Job {
    std::function<void()> work;
    std::shared_ptr<HostEvent> done;
  };

  void Run() {
    NameThisThread("strata-stream");
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and everything ran
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job.work();
      job.done->Complete();
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::deque<Job> jobs_;   // guarded by mu_
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;     // last: starts once the members above exist
};

// The arena's anonymous mapping, over-sized when the alignment exceeds a
// page so that an aligned base fits inside it.
class Mapping {
 public:
  static Result<Mapping> Create(uint64_t bytes, uint64_t alignment) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t slack = alignment > page ? alignment : 0;
    void* addr = mmap(nullptr, bytes + slack, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (addr == MAP_FAILED) {
      const Status failed = aio::ErrnoStatus(
          errno, "device tier (host-emulated): reserving the " +
                     HumanBytes(bytes) + " device budget (mmap)");
      return Status(
          failed.code(),
          failed.message() + "; lower the device budget (--device-budget)");
    }
    return Mapping(addr, bytes + slack);
  }
  Mapping(Mapping&& other) noexcept
      : addr_(std::exchange(other.addr_, nullptr)), size_(other.size_) {}
  Mapping& operator=(Mapping&&) = delete;
  ~Mapping() {
    if (addr_ != nullptr) munmap(addr_, size_);
  }

  void* address() const { return addr_; }

 private:
  Mapping(void* addr, size_t size) : addr_(addr), size_(size) {}
  void* addr_;
  size_t size_;
};

class HostDevice : public ArenaDevice {
 public:
  HostDevice(DeviceInfo info, Mapping mapping, uint64_t alignment)
      : ArenaDevice(std::move(info), AlignUp(mapping.address(), alignment),
                    alignment),
        mapping_(std::move(mapping)) {}

  Result<Event> Record(const Fence& fence) override {
    if (fence.stream == nullptr && fence.event == nullptr) return Event();
    if (fence.stream == nullptr) {
      return Status::InvalidArgument(
          "the host-emulated device takes a fence's stream as a "
          "strata::HostStream*; an event is CUDA's (pass the stream)");
    }
    auto* stream = static_cast<HostStream*>(fence.stream);
    return Event(std::make_shared<StreamMark>(stream, stream->Mark()));
  }

  Status StreamWait(void* stream, const Event& event) override {
    static_cast<HostStream*>(stream)->Queue([event] { (void)event.Wait(); });
    return Status();
  }

  // The queue's worker waits, as a CUDA stream waits for an event.
  Status OrderAfter(Direction direction, const Event& event) override {
    WorkQueue& queue =
        direction == Direction::kToDevice ? to_device_ : to_host_;
    queue.Push([event] { (void)event.Wait(); });
    return Status();
  }

 protected:
  Result<Event> StartCopy(Direction direction, void* dst, const void* src,
                          size_t bytes) override {
    WorkQueue& queue =
        direction == Direction::kToDevice ? to_device_ : to_host_;
    return queue.Push([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }

  Status Fill(void* device, int byte, size_t bytes) override {
    std::memset(device, byte, bytes);
    return Status();
  }

 private:
  // Members are destroyed in reverse order: both queues drain before the
  // mapping their jobs touch goes away.
  Mapping mapping_;
  WorkQueue to_device_;
  WorkQueue to_host_;
};

}  // namespace

Result<std::unique_ptr<Device>> OpenHostDevice(const DeviceOptions& options,
                                               std::string reason) {
  STRATA_ASSIGN_OR_RETURN(Mapping mapping,
                          Mapping::Create(options.budget, options.alignment));
  DeviceInfo info;
  info.kind = DeviceKind::kHostEmulated;
  info.name = "host-emulated";
  info.reason = std::move(reason);
  info.budget = options.budget;
  return std::unique_ptr<Device>(std::make_unique<HostDevice>(
      std::move(info), std::move(mapping), options.alignment));
}

}  // namespace strata::tier::internal
