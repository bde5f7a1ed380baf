// The io_uring backend: one ring per thread, that thread alone submits and
// reaps.
//
// Note [Ring ownership]
// Each ring is created, registered, submitted to and reaped by its own
// thread. That is what lets the kernel accept SINGLE_ISSUER and
// DEFER_TASKRUN (completions are posted only when the ring thread enters
// the kernel to reap, GETEVENTS, which every Enter() does; nothing
// interrupts it), fio's own setup, and it means the hot path takes no lock
// on the ring. Kernels without DEFER_TASKRUN (before 6.1) get COOP_TASKRUN.
// DEFER_TASKRUN was 5-10% slower than COOP_TASKRUN at 4 KiB random I/O on a
// virtio disk while a reaped burst's callbacks all ran before any
// replacement was prepped; since they are prepped between callbacks (Note
// [Submission batches]) the two are level there: alternating runs of each
// gave DEFER 1.003 of COOP's IOPS on 4 KiB random reads, 1.023 on random
// writes, 0.998 on 1 MiB writes and 0.994 and 1.014 in two sets of 128 KiB
// writes (docs/PERF.md, "Callbacks' submissions between callbacks").
//
// Other threads hand work over through `incoming_` under a mutex and
// wake the ring thread through an eventfd that the ring itself polls; the
// eventfd is only written when the ring thread has said it is about to
// sleep, so a busy ring pays no syscall per hand-over. Work submitted from
// the ring thread itself (completion callbacks) skips the hand-over.
//
// Note [Submission batches]
// The ring thread hands the kernel at most IoOptions::submit_batch pieces
// per io_uring_enter (default 1), as completions free slots, so that the
// device sees the requests the caller made, as under fio's defaults.
// io_uring plugs a submission of more than two requests, and inside the
// plug contiguous requests merge up to max_sectors_kb. Whether merging
// helps depends on the device: on one virtio disk 32 sequential 1 MiB
// writes went out as eight of 4 MiB and were served 11% slower than one
// request per enter; on another, merged 1 MiB writes ran 8% faster.
// Random 4 KiB requests never merge, yet 31 at once raised the device's
// per-request latency (0.26 to 0.33 ms at the same depth), and there small
// batches gain 25% (0.77 to 0.99 of fio). submit_batch 0 hands the kernel
// every ready piece at once, as before. One piece an enter rather than two:
// where the disk completes 4 KiB random writes fast, it won six of ten
// rounds run side by side, by a median of 5% of fio's IOPS; random reads
// and sequential jobs stayed level. It costs more CPU than two, still less
// than fio (docs/PERF.md, "4 KiB random where completions come fast").
// What completion callbacks submit is prepped as each callback returns, and
// goes to the kernel with the next batch, not after the whole reaped burst:
// a virtio disk completes 4 KiB random requests about 32 at a time, and the
// first replacements then reach it a burst's callbacks sooner. That took
// random reads from 0.97 to 1.01 of fio and random writes from 0.98 to
// 1.00 there, and from 0.90 and 0.94 to 1.00 and 1.03 on a loop device in
// RAM (docs/PERF.md, "Callbacks' submissions between callbacks").
#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "aio/internal.h"
#include "common/thread_name.h"

namespace strata::aio::internal {
namespace {

struct SetupFlags {
  unsigned flags;
  const char* text;
};

// Tried in order; the kernel answers EINVAL to flags it does not know.
constexpr SetupFlags kSetupFlags[] = {
    {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
     "single_issuer,defer_taskrun"},
    {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN,
     "single_issuer,coop_taskrun"},
    {IORING_SETUP_COOP_TASKRUN, "coop_taskrun"},
    {0, "none"},
};

class Ring;
thread_local Ring* tls_ring = nullptr;

class Ring {
 public:
  Ring(int index, int queue_depth, int submit_batch)
      : index_(index),
        qd_(queue_depth),
        batch_(submit_batch > 0 ? submit_batch : queue_depth) {}
  ~Ring() {
    Stop();
    // Closed only here, after the ring thread is gone (or never started): a
    // Wake() racing with the thread's exit must never write to a closed (or
    // reused) fd.
    if (efd_ >= 0) close(efd_);
  }

  // Starts the ring thread and waits until its ring is set up.
  Status Start() {
    std::promise<Status> ready;
    std::future<Status> result = ready.get_future();
    thread_ = std::thread([this, &ready] { Main(ready); });
    Status st = result.get();
    if (st.ok()) {
      started_ = true;
    } else {
      thread_.join();
    }
    return st;
  }

  const char* setup_text() const { return setup_text_; }
  bool fixed_files() const { return fixed_files_; }
  bool fixed_buffers() const { return fixed_buffers_; }
  const Counters& counters() const { return counters_; }

  void Enqueue(Piece* const* pieces, size_t count) {
    if (tls_ring == this) {
      pending_.insert(pending_.end(), pieces, pieces + count);
      return;
    }
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      incoming_.insert(incoming_.end(), pieces, pieces + count);
      wake = std::exchange(sleeping_, false);
    }
    if (wake) Wake();
  }

  // Runs `fn` on the ring thread (registration must come from the issuer).
  bool Control(const std::function<bool(io_uring*)>& fn) {
    if (tls_ring == this) return fn(&ring_);
    std::promise<bool> done;
    std::future<bool> result = done.get_future();
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      controls_.push_back([&] { done.set_value(fn(&ring_)); });
      wake = std::exchange(sleeping_, false);
    }
    if (wake) Wake();
    return result.get();
  }

 private:
  void Main(std::promise<Status>& ready) {
    char name[16];
    std::snprintf(name, sizeof(name), "strata-ring%d", index_);
    NameThisThread(name);
    Status st = Setup();
    const bool ok = st.ok();
    ready.set_value(std::move(st));
    if (!ok) return;
    tls_ring = this;
    Loop();
    io_uring_queue_exit(&ring_);
  }

  Status Setup() {
    efd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd_ < 0) return ErrnoStatus(errno, "eventfd");
    // One extra entry for the eventfd poll.
    const unsigned entries = static_cast<unsigned>(qd_) + 1;
    int rc = -EINVAL;
    for (const SetupFlags& f : kSetupFlags) {
      io_uring_params params = {};
      params.flags = f.flags;
      rc = io_uring_queue_init_params(entries, &ring_, &params);
      if (rc == 0) {
        setup_text_ = f.text;
        break;
      }
      if (rc != -EINVAL) break;
    }
    if (rc != 0) {
      return Status::Unavailable(
          "io_uring_queue_init failed with " + ErrnoText(-rc) +
          " (blocked by seccomp, the kernel.io_uring_disabled "
          "sysctl, or an old kernel); set "
          "STRATA_AIO_BACKEND=threads to use the thread-pool "
          "backend");
    }
    // A sandbox may allow io_uring_setup yet deny io_uring_enter: prove the
    // ring works with a no-op before anything depends on it.
    if (Status st = ProbeNop(); !st.ok()) {
      io_uring_queue_exit(&ring_);
      return st;
    }
    fixed_files_ = io_uring_register_files_sparse(&ring_, kMaxFixedFiles) == 0;
    fixed_buffers_ =
        io_uring_register_buffers_sparse(&ring_, kMaxFixedBuffers) == 0;
    return Status::Ok();
  }

  Status ProbeNop() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    STRATA_CHECK(sqe != nullptr);
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, nullptr);
    int rc;
    do {
      rc = io_uring_submit_and_wait(&ring_, 1);
    } while (rc == -EINTR);
    io_uring_cqe* cqe = nullptr;
    if (rc >= 0) rc = io_uring_peek_cqe(&ring_, &cqe);
    if (rc >= 0) io_uring_cqe_seen(&ring_, cqe);
    if (rc >= 0) return Status::Ok();
    return Status::Unavailable(
        "io_uring_enter failed with " + ErrnoText(-rc) +
        " (blocked by seccomp?); set STRATA_AIO_BACKEND=threads "
        "to use the thread-pool backend");
  }

  // Submits what is prepped and, when `wait`, blocks for one completion.
  // Without waiting it still runs deferred completions (GETEVENTS), so a
  // ring kept busy by other threads never starves its own completions.
  void Enter(bool wait) {
    prepped_ = 0;
    const int rc = wait ? io_uring_submit_and_wait(&ring_, 1)
                        : io_uring_submit_and_get_events(&ring_);
    if (rc >= 0 || rc == -EINTR || rc == -EAGAIN || rc == -EBUSY ||
        rc == -ETIME) {
      return;
    }
    if (rc == -ENOMEM) {
      // The kernel is short of memory for the submission: back off, retry.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    std::fprintf(stderr, "strata aio: io_uring_enter failed with %s\n",
                 ErrnoText(-rc).c_str());
    std::abort();
  }

  void Stop() {
    if (!started_) return;
    started_ = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    Wake();
    thread_.join();
  }

  void Wake() { eventfd_write(efd_, 1); }

  void ArmPoll() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    STRATA_CHECK(sqe != nullptr);
    io_uring_prep_poll_add(sqe, efd_, POLLIN);
    io_uring_sqe_set_data(sqe, nullptr);
  }

  void Prep(Piece* p) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    STRATA_CHECK(sqe != nullptr);
    const FileImpl* f = p->op->file;
    const int fd = f->fixed ? f->slot : f->fd();
    if (p->op->sync) {
      // Not ordered after the ring's other requests (no IOSQE_IO_DRAIN):
      // Engine::Sync covers the writes that completed before it.
      Counters::Bump(counters_.syncs);
      p->submitted = 0;
      io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
    } else {
      PrepTransfer(sqe, p, fd);
    }
    if (f->fixed) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, p);
  }

  // A read or a write of `p`'s remainder on `fd` (a fixed-file slot for a
  // registered file).
  void PrepTransfer(io_uring_sqe* sqe, Piece* p, int fd) {
    const uint32_t len = NextLength(*p);
    p->submitted = len;
    char* buf = p->buf + p->done;
    const uint64_t off = p->offset + p->done;
    const bool write = p->op->write;
    Counters::Bump(counters_.transfers);
    if (p->op->file->fixed) Counters::Bump(counters_.fixed_file);
    if (p->buf_index >= 0 && fixed_buffers_) {
      Counters::Bump(counters_.fixed_buffer);
      if (write) {
        io_uring_prep_write_fixed(sqe, fd, buf, len, off, p->buf_index);
      } else {
        io_uring_prep_read_fixed(sqe, fd, buf, len, off, p->buf_index);
      }
    } else if (write) {
      io_uring_prep_write(sqe, fd, buf, len, off);
    } else {
      io_uring_prep_read(sqe, fd, buf, len, off);
    }
  }

  // Takes what other threads handed over. Returns false once the ring is
  // stopping and has nothing left to do.
  bool Drain() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      scratch_.swap(incoming_);
      controls_scratch_.swap(controls_);
      stop_seen_ = stop_;
      sleeping_ = false;
    }
    for (auto& fn : controls_scratch_) fn();
    controls_scratch_.clear();
    pending_.insert(pending_.end(), scratch_.begin(), scratch_.end());
    scratch_.clear();
    return !(stop_seen_ && pending_.empty() && inflight_ == 0);
  }

  // Whether the ring thread may block in io_uring_enter. When the queue is
  // full it must (only a completion frees a slot); otherwise only if nothing
  // new arrived since Drain(), and then it announces that it sleeps.
  bool MaySleep() {
    if (!pending_.empty()) return true;
    std::lock_guard<std::mutex> lock(mu_);
    if (!incoming_.empty() || !controls_.empty() || stop_ != stop_seen_) {
      return false;
    }
    sleeping_ = true;
    return true;
  }

  void Loop() {
    bool poll_armed = false;
    while (Drain()) {
      if (!poll_armed) {
        ArmPoll();
        poll_armed = true;
      }
      Submit();
      Enter(MaySleep());
      poll_armed = Reap() && poll_armed;
    }
  }

  // Preps pending pieces while slots are free, entering the kernel whenever
  // `batch_` prepped ones wait for it and another is to follow; the last
  // batch waits for the next Enter (Note [Submission batches]).
  void Submit() {
    while (inflight_ < qd_ && !pending_.empty()) {
      if (prepped_ == batch_) Enter(false);
      Prep(pending_.front());
      pending_.pop_front();
      ++inflight_;
      if (prepped_++ == 0) Counters::Bump(counters_.batches);
    }
  }

  // Processes every available completion. Returns false if the eventfd poll
  // fired and must be re-armed.
  bool Reap() {
    bool poll_live = true;
    unsigned head;
    io_uring_cqe* cqe;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      reaped_.push_back({io_uring_cqe_get_data(cqe), cqe->res});
    }
    io_uring_cq_advance(&ring_, seen);
    // Callbacks run after the CQ is advanced: they may submit again, and
    // what each submits is prepped before the next one runs.
    for (const Reaped& r : reaped_) {
      if (r.data == nullptr) {
        eventfd_t value;
        eventfd_read(efd_, &value);
        poll_live = false;
        continue;
      }
      auto* p = static_cast<Piece*>(r.data);
      --inflight_;
      if (Settle(p, p->submitted, r.res)) {
        Counters::Bump(counters_.resubmits);
        pending_.push_front(p);
      }
      Submit();
    }
    reaped_.clear();
    return poll_live;
  }

  struct Reaped {
    void* data;
    int res;
  };

  const int index_;
  const int qd_;
  const int batch_;
  io_uring ring_ = {};
  int efd_ = -1;
  const char* setup_text_ = "";
  bool fixed_files_ = false;
  bool fixed_buffers_ = false;
  bool started_ = false;
  std::thread thread_;

  std::mutex mu_;
  std::vector<Piece*> incoming_;
  std::vector<std::function<void()>> controls_;
  bool sleeping_ = false;
  bool stop_ = false;

  // Ring thread only.
  bool stop_seen_ = false;
  std::deque<Piece*> pending_;
  std::vector<Piece*> scratch_;
  std::vector<std::function<void()>> controls_scratch_;
  std::vector<Reaped> reaped_;
  int inflight_ = 0;
  int prepped_ = 0;  // SQEs of pieces not yet handed to the kernel
  Counters counters_;
};

class UringBackend final : public Backend {
 public:
  Status Start(const IoOptions& options, IoInfo* info) {
    for (int i = 0; i < options.rings; ++i) {
      rings_.push_back(
          std::make_unique<Ring>(i, options.queue_depth, options.submit_batch));
      Status st = rings_.back()->Start();
      if (!st.ok()) {
        rings_.pop_back();
        return st;
      }
    }
    info->ring_setup = rings_[0]->setup_text();
    info->fixed_files = options.use_fixed_files;
    info->fixed_buffers = options.use_fixed_buffers;
    for (const auto& r : rings_) {
      info->fixed_files = info->fixed_files && r->fixed_files();
      info->fixed_buffers = info->fixed_buffers && r->fixed_buffers();
    }
    return Status::Ok();
  }

  int threads() const override { return static_cast<int>(rings_.size()); }

  bool AddFile(int slot, int fd) override {
    return ForEachRing(
        [&](io_uring* r) {
          return io_uring_register_files_update(r, slot, &fd, 1) == 1;
        },
        [&] { RemoveFile(slot); });
  }

  void RemoveFile(int slot) override {
    const int none = -1;
    for (auto& ring : rings_) {
      ring->Control([&](io_uring* r) {
        io_uring_register_files_update(r, slot, &none, 1);
        return true;
      });
    }
  }

  bool AddBuffer(int index, void* data, size_t bytes) override {
    const iovec iov = {data, bytes};
    return ForEachRing(
        [&](io_uring* r) {
          return io_uring_register_buffers_update_tag(r, index, &iov, nullptr,
                                                      1) == 1;
        },
        [&] { RemoveBuffer(index); });
  }

  void RemoveBuffer(int index) override {
    const iovec none = {nullptr, 0};
    for (auto& ring : rings_) {
      ring->Control([&](io_uring* r) {
        io_uring_register_buffers_update_tag(r, index, &none, nullptr, 1);
        return true;
      });
    }
  }

  void Submit(int ring, Piece* const* pieces, size_t count) override {
    rings_[ring]->Enqueue(pieces, count);
  }

  IoStats stats() const override {
    IoStats s;
    for (const auto& r : rings_) r->counters().AddTo(&s);
    return s;
  }

 private:
  // Applies `fn` on every ring; if one refuses, undoes with `undo`.
  bool ForEachRing(const std::function<bool(io_uring*)>& fn,
                   const std::function<void()>& undo) {
    for (auto& ring : rings_) {
      if (!ring->Control(fn)) {
        undo();
        return false;
      }
    }
    return true;
  }

  std::vector<std::unique_ptr<Ring>> rings_;
};

}  // namespace

Result<std::unique_ptr<Backend>> CreateUringBackend(const IoOptions& options,
                                                    IoInfo* info) {
  auto backend = std::make_unique<UringBackend>();
  STRATA_RETURN_IF_ERROR(backend->Start(options, info));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace strata::aio::internal
