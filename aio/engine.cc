// The strata_aio front end: validates requests, splits them into pieces,
// spreads the pieces over the rings and tracks their completion. The
// backends (uring_backend.cc, thread_backend.cc) only move pieces.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "aio/internal.h"

namespace strata::aio {

using internal::FileImpl;
using internal::Op;
using internal::Piece;

std::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kIoUring:
      return "io_uring";
    case Backend::kThreads:
      return "threads";
  }
  return "unknown";
}

Result<Backend> ParseBackend(std::string_view name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "io_uring" || name == "uring") return Backend::kIoUring;
  if (name == "threads") return Backend::kThreads;
  return Status::InvalidArgument("unknown aio backend '" + std::string(name) +
                                 "'; use auto, io_uring or threads");
}

namespace internal {

Handle MakeHandle(Op* op) { return Handle(op); }

void RefOp(Op* op) { op->refs.fetch_add(1, std::memory_order_relaxed); }

void UnrefOp(Op* op) {
  if (op->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete op;
}

void Counters::AddTo(IoStats* s) const {
  s->transfers += transfers.load(std::memory_order_relaxed);
  s->resubmits += resubmits.load(std::memory_order_relaxed);
  s->fixed_buffer += fixed_buffer.load(std::memory_order_relaxed);
  s->fixed_file += fixed_file.load(std::memory_order_relaxed);
  s->batches += batches.load(std::memory_order_relaxed);
  s->syncs += syncs.load(std::memory_order_relaxed);
}

}  // namespace internal

class Engine::Impl {
 public:
  explicit Impl(const IoOptions& options) : options_(options) {}
  ~Impl();

  Status Init();
  Result<File*> OpenFile(const std::string& path, const FileOptions& options);
  Status CloseFile(File* file);
  Result<Handle> Submit(Request request);
  Result<Handle> Sync(File* file, Callback on_complete, int ring);
  Status WaitAll();
  void Finish(Op* op);
  internal::BufferRegistry& buffers() { return *buffers_; }
  IoStats stats() const { return backend_->stats(); }

  IoOptions options_;
  IoInfo info_;

 private:
  Status Validate(const Request& r, FileImpl* file) const;
  // The passes of Submit() after Validate(): split the request into
  // `count` pieces, then launch it: count it as outstanding and hand its
  // pieces to the rings. Sync() launches an op of one empty piece.
  Op* NewOp(FileImpl* file, Callback on_complete, uint32_t count);
  Op* NewTransfer(Request& r, FileImpl* file, uint32_t count);
  Handle Launch(Op* op, uint32_t count, int ring);
  void Spread(Op* op, uint32_t count, int ring);

  std::unique_ptr<internal::Backend> backend_;
  std::mutex files_mu_;
  std::vector<std::unique_ptr<FileImpl>> files_;  // by slot
  std::unique_ptr<internal::BufferRegistry> buffers_;
  std::atomic<uint32_t> next_ring_{0};
  std::atomic<uint64_t> outstanding_{0};
  std::mutex error_mu_;
  Status first_error_;
  friend class Engine;
};

namespace {

// Applies STRATA_AIO_BACKEND, which wins over the options.
Result<Backend> EffectiveBackend(Backend requested) {
  const char* env = std::getenv("STRATA_AIO_BACKEND");
  if (env == nullptr || *env == '\0') return requested;
  Result<Backend> forced = ParseBackend(env);
  if (!forced.ok()) {
    return Status::InvalidArgument("STRATA_AIO_BACKEND: " +
                                   forced.status().message());
  }
  return *forced;
}

Status ValidateOptions(const IoOptions& o) {
  if (o.rings < 1 || o.rings > 64) {
    return Status::InvalidArgument("aio rings must be 1..64, got " +
                                   std::to_string(o.rings));
  }
  if (o.queue_depth < 1 || o.queue_depth > 4096) {
    return Status::InvalidArgument("aio queue_depth must be 1..4096, got " +
                                   std::to_string(o.queue_depth));
  }
  if (o.submit_batch < 0 || o.submit_batch > 4096) {
    return Status::InvalidArgument(
        "aio submit_batch must be 0..4096 (0: every piece that is ready), "
        "got " +
        std::to_string(o.submit_batch));
  }
  if (o.block_size < 4096 || o.block_size % 4096 != 0 ||
      o.block_size > (size_t{1} << 30)) {
    return Status::InvalidArgument(
        "aio block_size must be a multiple of 4096 between 4 KiB "
        "and 1 GiB, got " +
        std::to_string(o.block_size));
  }
  return Status::Ok();
}

void WarnFallbackOnce(const std::string& reason) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(stderr,
                 "strata aio: io_uring unavailable (%s); using the "
                 "pread/pwrite thread-pool backend\n",
                 reason.c_str());
  });
}

}  // namespace

Status Engine::Impl::Init() {
  STRATA_RETURN_IF_ERROR(ValidateOptions(options_));
  STRATA_ASSIGN_OR_RETURN(Backend backend, EffectiveBackend(options_.backend));
  info_.rings = options_.rings;
  info_.queue_depth = options_.queue_depth;
  info_.block_size = options_.block_size;
  info_.submit_batch = options_.submit_batch;
  if (backend != Backend::kThreads) {
    auto uring = internal::CreateUringBackend(options_, &info_);
    if (uring.ok()) {
      backend_ = std::move(*uring);
      info_.backend = Backend::kIoUring;
    } else if (backend == Backend::kIoUring) {
      return uring.status();
    } else {
      info_.fallback_reason = uring.status().message();
      WarnFallbackOnce(info_.fallback_reason);
    }
  } else {
    info_.fallback_reason = "threads backend requested";
  }
  if (!backend_) {
    backend_ = internal::CreateThreadBackend(options_, &info_);
    info_.backend = Backend::kThreads;
    info_.submit_batch = 1;  // one pread/pwrite per transfer
  }
  info_.threads = backend_->threads();
  buffers_ = std::make_unique<internal::BufferRegistry>(
      backend_.get(), options_.use_fixed_buffers && info_.fixed_buffers);
  return Status::Ok();
}

Engine::Impl::~Impl() {
  (void)WaitAll();
  // Join the engine threads before the state they complete into goes away.
  backend_.reset();
}

Result<File*> Engine::Impl::OpenFile(const std::string& path,
                                     const FileOptions& options) {
  STRATA_ASSIGN_OR_RETURN(auto file, internal::OpenFileImpl(path, options));
  std::lock_guard<std::mutex> lock(files_mu_);
  int slot = 0;
  while (slot < static_cast<int>(files_.size()) && files_[slot]) ++slot;
  if (slot == static_cast<int>(files_.size())) files_.emplace_back();
  FileImpl* f = file.get();
  f->slot = slot;
  f->fixed = slot < internal::kMaxFixedFiles && options_.use_fixed_files &&
             backend_->AddFile(slot, f->fd());
  files_[slot] = std::move(file);
  return static_cast<File*>(f);
}

Status Engine::Impl::CloseFile(File* file) {
  std::lock_guard<std::mutex> lock(files_mu_);
  // Look the pointer up before touching it: it may be stale.
  auto it = std::find_if(files_.begin(), files_.end(),
                         [&](const auto& f) { return f.get() == file; });
  if (file == nullptr || it == files_.end()) {
    return Status::InvalidArgument(
        "CloseFile: not an open file of this engine");
  }
  FileImpl* f = it->get();
  if (f->inflight.load(std::memory_order_acquire) != 0) {
    return Status::FailedPrecondition(
        "CloseFile('" + f->path() +
        "'): requests are still in flight; wait for them "
        "first");
  }
  if (f->fixed) backend_->RemoveFile(f->slot);
  it->reset();
  return Status::Ok();
}

Status Engine::Impl::Validate(const Request& r, FileImpl* f) const {
  const char* what = r.write ? "write" : "read";
  if (f == nullptr || r.buf == nullptr) {
    return Status::InvalidArgument(std::string(what) + ": null file or buffer");
  }
  if (r.len == 0) {
    return Status::InvalidArgument(std::string(what) + " of 0 bytes on '" +
                                   f->path() + "'");
  }
  // A length near 2^64 (a negative size) would wrap the piece count to
  // zero, and the request would never complete: refuse what cannot be
  // split into at most UINT32_MAX pieces.
  if ((r.len - 1) / options_.block_size >= UINT32_MAX) {
    return Status::InvalidArgument(
        std::string(what) + " of " + std::to_string(r.len) + " bytes on '" +
        f->path() + "': the length is too large (a negative size?)");
  }
  if (r.write && f->read_only()) {
    return Status::FailedPrecondition("write to '" + f->path() +
                                      "', which was opened read-only");
  }
  const uintptr_t addr = reinterpret_cast<uintptr_t>(r.buf);
  const uint32_t ma = f->mem_align();
  const uint32_t oa = f->offset_align();
  if (addr % ma != 0 || r.offset % oa != 0 || r.len % oa != 0) {
    char text[512];
    std::snprintf(
        text, sizeof(text),
        "misaligned %s on '%s' (buffer %p, offset %llu, length %zu): "
        "O_DIRECT on this file system needs the buffer aligned to %u bytes "
        "and the offset and length to multiples of %u; allocate with "
        "PinnedBuffer or aligned_alloc and round sizes up",
        what, f->path().c_str(), r.buf,
        static_cast<unsigned long long>(r.offset), r.len, ma, oa);
    return Status::InvalidArgument(text);
  }
  if (r.len > UINT64_MAX - r.offset) {
    return Status::InvalidArgument(
        std::string(what) + " of " + std::to_string(r.len) +
        " bytes at offset " + std::to_string(r.offset) + " on '" + f->path() +
        "' runs past the largest file offset (a negative "
        "offset?)");
  }
  if ((!r.write || f->block_device) && r.offset + r.len > f->size()) {
    return Status::InvalidArgument(
        std::string(what) + " of [" + std::to_string(r.offset) + ", " +
        std::to_string(r.offset + r.len) + ") past the end of '" + f->path() +
        "' (" + std::to_string(f->size()) + " bytes)");
  }
  return Status::Ok();
}

Result<Handle> Engine::Impl::Submit(Request r) {
  auto* f = static_cast<FileImpl*>(r.file);
  STRATA_RETURN_IF_ERROR(Validate(r, f));
  if (r.write) f->GrowTo(r.offset + r.len);
  const auto count =
      static_cast<uint32_t>((r.len - 1) / options_.block_size + 1);
  return Launch(NewTransfer(r, f, count), count, r.ring);
}

Result<Handle> Engine::Impl::Sync(File* file, Callback on_complete, int ring) {
  // No read-only check: fdatasync needs no write access (strata/aio.h).
  if (file == nullptr) return Status::InvalidArgument("sync: null file");
  Op* op = NewOp(static_cast<FileImpl*>(file), std::move(on_complete), 1);
  op->sync = true;
  return Launch(op, 1, ring);
}

Op* Engine::Impl::NewOp(FileImpl* f, Callback on_complete, uint32_t count) {
  auto* op = new Op;
  op->engine = this;
  op->file = f;
  op->injector = options_.fault_injector;
  op->on_complete = std::move(on_complete);
  op->pieces = std::make_unique<Piece[]>(count);
  for (uint32_t i = 0; i < count; ++i) op->pieces[i].op = op;
  op->pending.store(count, std::memory_order_relaxed);
  return op;
}

// Pieces of block_size bytes (the last one shorter), each with its
// fixed-buffer slot: a request may straddle registrations.
Op* Engine::Impl::NewTransfer(Request& r, FileImpl* f, uint32_t count) {
  const size_t bs = options_.block_size;
  Op* op = NewOp(f, std::move(r.on_complete), count);
  op->write = r.write;
  op->len = r.len;
  op->offset = r.offset;
  char* base = static_cast<char*>(r.buf);
  for (uint32_t i = 0; i < count; ++i) {
    Piece& p = op->pieces[i];
    const size_t at = size_t{i} * bs;
    p.buf = base + at;
    p.offset = r.offset + at;
    p.len = static_cast<uint32_t>(std::min(bs, r.len - at));
  }
  for (uint32_t i = 0; i < count; ++i) {
    op->pieces[i].buf_index =
        buffers_->Acquire(op->pieces[i].buf, op->pieces[i].len);
  }
  return op;
}

Handle Engine::Impl::Launch(Op* op, uint32_t count, int ring) {
  Handle handle = internal::MakeHandle(op);
  internal::RefOp(op);  // the handle's reference; the engine holds the first
  op->file->inflight.fetch_add(1, std::memory_order_relaxed);
  outstanding_.fetch_add(1, std::memory_order_relaxed);
  Spread(op, count, ring);
  return handle;
}

// All pieces to one ring when the request names one, or when there is one
// ring or one piece; else round robin over the rings, one batch per ring.
void Engine::Impl::Spread(Op* op, uint32_t count, int ring) {
  const int rings = options_.rings;
  if (ring >= 0 || rings == 1 || count == 1) {
    const int to = ring >= 0
                       ? ring % rings
                       : static_cast<int>(next_ring_.fetch_add(1) % rings);
    std::vector<Piece*> all(count);
    for (uint32_t i = 0; i < count; ++i) all[i] = &op->pieces[i];
    backend_->Submit(to, all.data(), count);
    return;
  }
  const uint32_t first = next_ring_.fetch_add(count);
  std::vector<Piece*> batch;
  batch.reserve(count / rings + 1);
  for (int k = 0; k < rings; ++k) {
    batch.clear();
    for (uint32_t i = 0; i < count; ++i) {
      if (static_cast<int>((first + i) % rings) == k) {
        batch.push_back(&op->pieces[i]);
      }
    }
    if (!batch.empty()) backend_->Submit(k, batch.data(), batch.size());
  }
}

void Engine::Impl::Finish(Op* op) {
  if (!op->status.ok()) {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (first_error_.ok()) first_error_ = op->status;
  }
  if (op->on_complete) op->on_complete(op->status);
  // After the callback, so that work it submits keeps CloseFile() refusing
  // and WaitAll() waiting; before `complete`, so that a caller whose Wait()
  // returned can close the file.
  op->file->inflight.fetch_sub(1, std::memory_order_release);
  op->complete.store(1, std::memory_order_release);
  op->complete.notify_all();
  if (outstanding_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    outstanding_.notify_all();
  }
  internal::UnrefOp(op);
}

Status Engine::Impl::WaitAll() {
  for (uint64_t n = outstanding_.load(std::memory_order_acquire); n != 0;
       n = outstanding_.load(std::memory_order_acquire)) {
    outstanding_.wait(n, std::memory_order_acquire);
  }
  std::lock_guard<std::mutex> lock(error_mu_);
  return std::exchange(first_error_, Status::Ok());
}

void internal::CompletePiece(Piece* piece, int err) {
  Op* op = piece->op;
  if (piece->buf_index >= 0) op->engine->buffers().Release(piece->buf_index);
  if (err != 0 && !op->failed.exchange(true, std::memory_order_acq_rel)) {
    op->status = op->sync ? SyncStatus(err, op->file->path())
                          : IoStatus(err, op->write, op->file->path(),
                                     piece->offset + piece->done,
                                     piece->len - piece->done);
  }
  if (op->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    op->engine->Finish(op);
  }
}

Handle::Handle(const Handle& other) : op_(other.op_) {
  if (op_) internal::RefOp(op_);
}

Handle& Handle::operator=(const Handle& other) {
  if (this != &other) {
    if (other.op_) internal::RefOp(other.op_);
    if (op_) internal::UnrefOp(op_);
    op_ = other.op_;
  }
  return *this;
}

Handle::Handle(Handle&& other) noexcept
    : op_(std::exchange(other.op_, nullptr)) {}

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    if (op_) internal::UnrefOp(op_);
    op_ = std::exchange(other.op_, nullptr);
  }
  return *this;
}

Handle::~Handle() {
  if (op_) internal::UnrefOp(op_);
}

bool Handle::Poll() const {
  STRATA_CHECK(op_ != nullptr);
  return op_->complete.load(std::memory_order_acquire) != 0;
}

Status Handle::Wait() const {
  STRATA_CHECK(op_ != nullptr);
  op_->complete.wait(0, std::memory_order_acquire);
  return op_->status;
}

Result<std::unique_ptr<Engine>> Engine::Open(const IoOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  STRATA_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

const IoInfo& Engine::info() const { return impl_->info_; }

IoStats Engine::stats() const { return impl_->stats(); }

Result<File*> Engine::OpenFile(const std::string& path,
                               const FileOptions& options) {
  return impl_->OpenFile(path, options);
}

Status Engine::CloseFile(File* file) { return impl_->CloseFile(file); }

Status Engine::RegisterBuffer(void* data, size_t bytes) {
  return impl_->buffers().Register(data, bytes);
}

Status Engine::UnregisterBuffer(void* data) {
  return impl_->buffers().Unregister(data);
}

Result<Handle> Engine::Submit(Request request) {
  return impl_->Submit(std::move(request));
}

Result<Handle> Engine::Read(File* file, void* buf, size_t len, uint64_t offset,
                            Callback on_complete) {
  return impl_->Submit(
      Request{file, buf, len, offset, false, -1, std::move(on_complete)});
}

Result<Handle> Engine::Write(File* file, const void* buf, size_t len,
                             uint64_t offset, Callback on_complete) {
  return impl_->Submit(Request{file, const_cast<void*>(buf), len, offset, true,
                               -1, std::move(on_complete)});
}

Result<Handle> Engine::Sync(File* file, Callback on_complete, int ring) {
  return impl_->Sync(file, std::move(on_complete), ring);
}

Status Engine::WaitAll() { return impl_->WaitAll(); }

}  // namespace strata::aio
