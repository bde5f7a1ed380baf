// The fallback backend: a pool of threads doing pread/pwrite, for kernels or
// sandboxes where io_uring is unavailable. It keeps the same in-flight
// budget as the rings (rings x queue_depth pieces, one per thread, capped),
// and settles every transfer through the same Settle() as io_uring, so short
// transfers and errors behave identically.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "aio/internal.h"
#include "common/thread_name.h"

namespace strata::aio::internal {
namespace {

// Beyond this many blocking threads, context switches cost more than the
// extra queue depth buys on any device we target.
constexpr int kMaxThreads = 64;

class ThreadBackend final : public Backend {
 public:
  explicit ThreadBackend(int threads) {
    workers_.reserve(threads);
    for (int i = 0; i < threads; ++i) {
      counters_.push_back(std::make_unique<Counters>());
    }
    for (int i = 0; i < threads; ++i) {
      workers_.emplace_back([this, i] { Main(i); });
    }
  }

  ~ThreadBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int threads() const override { return static_cast<int>(workers_.size()); }
  bool AddFile(int, int) override { return false; }
  void RemoveFile(int) override {}
  bool AddBuffer(int, void*, size_t) override { return false; }
  void RemoveBuffer(int) override {}

  void Submit(int, Piece* const* pieces, size_t count) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.insert(queue_.end(), pieces, pieces + count);
    }
    if (count == 1) {
      cv_.notify_one();
    } else {
      cv_.notify_all();
    }
  }

 private:
  void Main(int index) {
    char name[16];
    std::snprintf(name, sizeof(name), "strata-aio%d", index);
    NameThisThread(name);
    for (;;) {
      Piece* p;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        p = queue_.front();
        queue_.pop_front();
      }
      Run(p, *counters_[index]);
    }
  }

  IoStats stats() const override {
    IoStats s;
    for (const auto& c : counters_) c->AddTo(&s);
    return s;
  }

  // Transfers (or syncs) one piece to completion, resubmitting remainders
  // in place.
  static void Run(Piece* p, Counters& counters) {
    for (;;) {
      uint32_t len = 0;
      const int result = Transfer(p, counters, &len);
      if (!Settle(p, len, result)) return;
      Counters::Bump(counters.resubmits);
    }
  }

  // One pread, pwrite or fdatasync of `p`, with the bytes asked for in
  // `*len`; returns the kernel's result as io_uring would (bytes or -errno).
  static int Transfer(Piece* p, Counters& counters, uint32_t* len) {
    const int fd = p->op->file->fd();
    Counters::Bump(counters.batches);
    if (p->op->sync) {
      Counters::Bump(counters.syncs);
      return fdatasync(fd) == 0 ? 0 : -errno;
    }
    Counters::Bump(counters.transfers);
    *len = NextLength(*p);
    char* buf = p->buf + p->done;
    const auto off = static_cast<off_t>(p->offset + p->done);
    const ssize_t n =
        p->op->write ? pwrite(fd, buf, *len, off) : pread(fd, buf, *len, off);
    return n < 0 ? -errno : static_cast<int>(n);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Piece*> queue_;
  bool stop_ = false;
  std::vector<std::unique_ptr<Counters>> counters_;  // one per worker
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<Backend> CreateThreadBackend(const IoOptions& options,
                                             IoInfo* info) {
  info->ring_setup = "";
  info->fixed_files = false;
  info->fixed_buffers = false;
  const int threads =
      std::clamp(options.rings * options.queue_depth, 1, kMaxThreads);
  return std::make_unique<ThreadBackend>(threads);
}

}  // namespace strata::aio::internal
