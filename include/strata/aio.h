// strata/aio.h: asynchronous file I/O over io_uring, with a thread-pool
// fallback. Library strata_aio; it depends on nothing else in strata.
//
// What it does
// - An Engine owns one or more rings. Each ring has one thread that alone
//   submits to and reaps from it, so the kernel's SINGLE_ISSUER and
//   its completion mode apply. Requests from any thread are queued to a ring,
//   which hands them to the kernel as slots free, a few per system call so
//   that the device sees the requests as they were made.
// - A request larger than `block_size` is split into block-size pieces that
//   are spread over the rings; at most `queue_depth` pieces are in flight per
//   ring. Short transfers, EINTR and EAGAIN are completed by resubmitting the
//   remainder; the caller only ever sees a whole request succeed or fail.
// - Files are opened once, preallocated, kept open and registered with every
//   ring. They use O_DIRECT unless the file system refuses it, in which case
//   the file falls back to buffered I/O with a one-line warning and reports
//   direct() == false.
// - If io_uring cannot be set up (seccomp, io_uring_disabled, old kernel),
//   Backend::kAuto falls back to a pread/pwrite thread pool and says so once
//   on stderr. STRATA_AIO_BACKEND=threads|io_uring forces a backend and wins
//   over IoOptions::backend.
//
// Ownership
// - The Engine owns its Files. A File* stays valid until CloseFile() or the
//   Engine's destruction.
// - Buffers belong to the caller and must stay valid, and untouched by the
//   caller for writes' sake, until the request completes.
// - A Handle shares ownership of its request's completion record; dropping a
//   Handle does not cancel the request.
//
// Alignment
// - Direct files require the buffer address, offset and length to be
//   multiples of mem_align()/offset_align(), read from statx(STATX_DIOALIGN)
//   or 4096 where the kernel does not say. A misaligned request is rejected
//   with kInvalidArgument naming the requirement; it is never bounced.
//
// Thread safety
// - Every Engine method may be called from any thread concurrently.
// - Completion callbacks run on an engine thread. They may submit more
//   requests but must not block: no Wait(), WaitAll(), sleeping, nor
//   OpenFile/CloseFile/RegisterBuffer/UnregisterBuffer (these run on every
//   ring thread and wait for it).
// - Closing a file, or unregistering a buffer, while another thread submits
//   requests on it is a race in the caller, as with close(2).
//
// Durability
// - Engine::Sync() is an asynchronous fdatasync: a request like a read or a
//   write (a Handle, a callback, counted by WaitAll() and CloseFile()), that
//   makes durable the file's writes that had completed when it was
//   submitted. It is not ordered after writes still in flight, as in
//   io_uring: to sync a write, submit the sync once the write is back, for
//   instance from its callback, which no thread waits for:
//
//     Callback done = ...;  // the write is durable, or why not
//     Result<Handle> w =
//         engine->Write(file, buf, len, offset, [=](const Status& st) {
//           if (!st.ok()) return done(st);
//           Result<Handle> sync = engine->Sync(file, done);
//           if (!sync.ok()) done(sync.status());
//         });
//     if (!w.ok()) done(w.status());
//
// - File::Sync() is the blocking fdatasync, for callers that may block;
//   FileOptions::dsync makes every write durable before it completes.
//
// Failure
// - Errors are Status values that carry the errno, the file, the offset and
//   the length (a sync's: the file). Nothing throws.
// - ~Engine() waits for every outstanding request, syncs included, before
//   it returns.
#ifndef STRATA_AIO_H_
#define STRATA_AIO_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "strata/export.h"
#include "strata/status.h"

namespace strata::aio {

// errno -> Status: the one translation every strata component uses. The
// message is "<what>: ENOSPC (No space left on device)" plus advice where
// there is a known fix.
STRATA_EXPORT Status ErrnoStatus(int err, const std::string& what);

enum class Backend { kAuto, kIoUring, kThreads };

STRATA_EXPORT std::string_view BackendName(Backend backend);
// Accepts "auto", "io_uring" (or "uring") and "threads".
STRATA_EXPORT Result<Backend> ParseBackend(std::string_view name);

// Testing hook: lets a test shorten transfers and replace completion results
// so that the resubmission and error paths run for real. Must be thread-safe;
// it is called from engine threads. Not for production use.
class STRATA_EXPORT FaultInjector {
 public:
  virtual ~FaultInjector() = default;
  // Bytes to actually submit for a piece of `len` bytes (1..len).
  virtual uint32_t SubmitLength(bool write, uint64_t offset, uint32_t len) {
    (void)write, (void)offset;
    return len;
  }
  // Replaces the kernel's result (bytes or -errno) of a transfer.
  virtual int CompletionResult(bool write, uint64_t offset, uint32_t len,
                               int result) {
    (void)write, (void)offset, (void)len;
    return result;
  }
  // Sees (and may corrupt) the `bytes` a successful read just delivered.
  virtual void AfterRead(uint64_t offset, char* data, uint32_t bytes) {
    (void)offset, (void)data, (void)bytes;
  }
  // Replaces the kernel's result (0 or -errno) of an Engine::Sync, before
  // its callback runs. Syncs never reach the three hooks above.
  virtual int SyncResult(int result) { return result; }
};

struct IoOptions {
  Backend backend = Backend::kAuto;
  int rings = 1;                 // rings (threads backend: pool shards)
  int queue_depth = 32;          // pieces in flight per ring, 1..4096
  size_t block_size = 1u << 20;  // split size; multiple of 4096, <= 1 GiB
  // Most pieces a ring hands the kernel in one io_uring_enter, 0..4096; 0:
  // every piece that is ready. The default, one, is fio's. Batches of more
  // than two are plugged and their contiguous pieces merged into larger
  // requests, which devices may serve slower (Note [Submission batches] in
  // aio/uring_backend.cc).
  int submit_batch = 1;
  bool use_fixed_buffers = true;            // register buffers given to
                                            // RegisterBuffer() with every ring
  bool use_fixed_files = true;              // register files with every ring
  FaultInjector* fault_injector = nullptr;  // testing only; not owned
};

// What the engine actually runs with, after fallbacks.
struct IoInfo {
  Backend backend = Backend::kAuto;
  int rings = 0;
  int queue_depth = 0;
  size_t block_size = 0;
  int submit_batch = 0;         // 0: every piece that is ready
  int threads = 0;              // engine threads (ring threads or pool size)
  std::string ring_setup;       // accepted io_uring setup flags, e.g.
                                // "single_issuer,defer_taskrun"
  bool fixed_files = false;     // files are registered with the rings
  bool fixed_buffers = false;   // RegisterBuffer() registers with the rings
  std::string fallback_reason;  // why io_uring is not in use; empty if it is
};

// Counters since the engine opened, summed over its threads.
struct IoStats {
  uint64_t transfers = 0;     // reads/writes handed to the kernel
  uint64_t resubmits = 0;     // of those and the syncs, remainders after
                              // short transfers, EINTR or EAGAIN
  uint64_t fixed_buffer = 0;  // transfers that used a registered buffer
  uint64_t fixed_file = 0;    // transfers that used a registered file
  uint64_t batches = 0;       // submissions (io_uring_enter calls that
                              // submitted; one per transfer or sync for
                              // threads)
  uint64_t syncs = 0;         // fdatasyncs of Engine::Sync handed to the
                              // kernel (not transfers)
};

// Every open refuses a symbolic link as the file itself (O_NOFOLLOW) and
// anything but a regular file, so a link planted in a shared directory
// cannot send strata's writes elsewhere.
//
// Block devices (FileOptions::block_device, for benchmarks of a raw drive):
// - Without the opt-in a block device is refused like any other non-regular
//   file. With it, a path that is a block device (itself, not a link to one)
//   is opened as it is: never created, truncated or preallocated, whatever
//   `create` and `size` say. A path that is a regular file, or does not
//   exist, is treated as without the opt-in.
// - size() is the device's (BLKGETSIZE64); `size` larger than that is
//   kInvalidArgument naming both, read-only or not. Requests past its end,
//   writes included, are kInvalidArgument.
// - Direct-I/O alignment comes from statx(STATX_DIOALIGN), else the
//   device's logical block size (BLKSSZGET).
// - Deciding that the device may be written (it holds no data anyone
//   wants, nothing has it mounted) is the caller's job. The device is not
//   claimed (O_EXCL): a caller that writes holds the claim itself for as
//   long as it writes (Note [Opening block devices] in aio/file.cc says
//   why strata cannot).
struct FileOptions {
  uint64_t size = 0;   // preallocate (fallocate) to at least this size
  bool create = true;  // create the file if it does not exist
  bool direct = true;  // O_DIRECT; falls back to buffered if refused
  bool dsync = false;  // O_DSYNC: each write returns once its data is durable
  bool read_only = false;
  // Only a new file: a path that exists already (a link included) is
  // kFailedPrecondition naming it (O_CREAT | O_EXCL).
  bool exclusive = false;
  uint32_t mode = 0600;       // of a created file, before the umask: private
  bool block_device = false;  // also open a block device (above)
};

// An open file. Obtained from Engine::OpenFile; owned by the Engine.
class STRATA_EXPORT File {
 public:
  virtual ~File() = default;
  virtual const std::string& path() const = 0;
  virtual uint64_t size() const = 0;
  virtual bool direct() const = 0;
  virtual bool read_only() const = 0;
  virtual uint32_t mem_align() const = 0;     // 1 for buffered files
  virtual uint32_t offset_align() const = 0;  // 1 for buffered files
  // fdatasync(), blocking the caller: makes completed writes durable.
  // Engine::Sync() is the asynchronous one.
  virtual Status Sync() = 0;
  // Drops the file's clean pages from the page cache (buffered files only;
  // a no-op for direct files).
  virtual Status DropCache() = 0;
};

// Called once, on an engine thread, when a request completes.
using Callback = std::function<void(const Status&)>;

struct Request {
  File* file = nullptr;
  void* buf = nullptr;
  size_t len = 0;
  uint64_t offset = 0;
  bool write = false;
  int ring = -1;         // pin every piece to this ring; -1 spreads them
  Callback on_complete;  // optional
};

class Handle;
namespace internal {
struct Op;
Handle MakeHandle(Op* op);
}  // namespace internal

// One submitted request. Copyable; copies refer to the same request.
class STRATA_EXPORT Handle {
 public:
  Handle() = default;
  Handle(const Handle& other);
  Handle& operator=(const Handle& other);
  Handle(Handle&& other) noexcept;
  Handle& operator=(Handle&& other) noexcept;
  ~Handle();

  bool valid() const { return op_ != nullptr; }
  // True once the request has completed (successfully or not).
  bool Poll() const;
  // Blocks until the request completes; returns its outcome. Repeatable.
  Status Wait() const;

 private:
  friend Handle internal::MakeHandle(internal::Op* op);
  explicit Handle(internal::Op* op) : op_(op) {}
  internal::Op* op_ = nullptr;
};

// Memory allocated once and locked in RAM (pinned), on a chosen NUMA node
// where libnuma can place it. Move-only; frees on destruction.
struct PinOptions {
  bool lock = true;        // mlock(); failure is an error naming the fix
  int numa_node = -1;      // -1: the calling thread's node
  bool huge_pages = true;  // ask for transparent huge pages (best effort)
};

class STRATA_EXPORT PinnedBuffer {
 public:
  // Size is rounded up to a multiple of 4096; memory is zero-filled and
  // 4096-aligned (2 MiB-aligned when huge pages are requested).
  static Result<PinnedBuffer> Allocate(size_t bytes,
                                       const PinOptions& options = {});
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  bool locked() const { return locked_; }
  int numa_node() const { return numa_node_; }  // -1 when unknown

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  bool locked_ = false;
  int numa_node_ = -1;
};

class STRATA_EXPORT Engine {
 public:
  static Result<std::unique_ptr<Engine>> Open(const IoOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const IoInfo& info() const;
  IoStats stats() const;

  // Opens (and creates, preallocates) `path`. Errors name the path and the
  // fix: a missing directory, a read-only file system, a full disk.
  Result<File*> OpenFile(const std::string& path,
                         const FileOptions& options = {});
  // Fails with kFailedPrecondition while requests on the file, syncs
  // included, are in flight (including while their completion callbacks
  // run).
  Status CloseFile(File* file);

  // Registers [data, data+bytes) as fixed buffers on every ring, so requests
  // inside it skip per-I/O page pinning. Best effort: returns OK and serves
  // requests unregistered if the kernel refuses. Unregister before freeing;
  // UnregisterBuffer fails with kFailedPrecondition while requests using the
  // buffer are in flight.
  Status RegisterBuffer(void* data, size_t bytes);
  Status UnregisterBuffer(void* data);

  Result<Handle> Submit(Request request);
  Result<Handle> Read(File* file, void* buf, size_t len, uint64_t offset,
                      Callback on_complete = {});
  Result<Handle> Write(File* file, const void* buf, size_t len, uint64_t offset,
                       Callback on_complete = {});

  // Asynchronous fdatasync of `file` (Durability, above): IORING_OP_FSYNC
  // with IORING_FSYNC_DATASYNC, or fdatasync() on a pool thread with the
  // threads backend. Durable when it completes OK: the writes to `file`
  // that had completed before this call, not those still in flight. It
  // waits, polls and counts as an outstanding request like a read or a
  // write, and `ring` pins it as Request::ring does (-1: the next ring in
  // turn). A failure is "fdatasync of '<path>' failed: <errno>" with the
  // errno's StatusCode. Read-only files are allowed: fdatasync flushes the
  // file's data whichever descriptor wrote it, as File::Sync() does.
  // A method rather than a Request: a Request is a transfer (buffer,
  // length, offset, direction), and a sync has none of them.
  Result<Handle> Sync(File* file, Callback on_complete = {}, int ring = -1);

  // Waits until no request is outstanding. Returns the first error of the
  // requests that completed since the previous WaitAll(), or OK.
  Status WaitAll();

 private:
  class Impl;
  friend struct internal::Op;  // a request refers back to its engine
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::aio

#endif  // STRATA_AIO_H_
