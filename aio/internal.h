// Internal types shared by the aio front end (engine.cc) and its backends.
// Not installed; nothing outside aio/ includes this.
#ifndef STRATA_AIO_INTERNAL_H_
#define STRATA_AIO_INTERNAL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "common/text.h"
#include "strata/aio.h"

namespace strata::aio::internal {

class FileImpl final : public File {
 public:
  FileImpl(std::string path, int fd, uint64_t size, bool direct, bool read_only,
           uint32_t mem_align, uint32_t offset_align, bool block_device);
  ~FileImpl() override;

  const std::string& path() const override { return path_; }
  uint64_t size() const override {
    return size_.load(std::memory_order_acquire);
  }
  bool direct() const override { return direct_; }
  bool read_only() const override { return read_only_; }
  uint32_t mem_align() const override { return mem_align_; }
  uint32_t offset_align() const override { return offset_align_; }
  Status Sync() override;
  Status DropCache() override;

  int fd() const { return fd_; }
  // Slot in the engine's file table, which is also the index in every
  // ring's registered-file table (when registration succeeded).
  int slot = -1;
  bool fixed = false;
  std::atomic<int64_t> inflight{0};
  // A block device (FileOptions::block_device): its size is fixed, and
  // writes past it are refused instead of growing the file.
  const bool block_device;
  void GrowTo(uint64_t end);

 private:
  std::string path_;
  int fd_;
  std::atomic<uint64_t> size_;
  bool direct_;
  bool read_only_;
  uint32_t mem_align_;
  uint32_t offset_align_;
};

// Opens `path` as described in strata/aio.h, printing the one-line warning
// when the file system refuses O_DIRECT and the file falls back to buffered.
Result<std::unique_ptr<FileImpl>> OpenFileImpl(const std::string& path,
                                               const FileOptions& options);

struct Op;

// One block-size slice of a request: the unit a backend submits.
struct Piece {
  Op* op = nullptr;
  char* buf = nullptr;
  uint64_t offset = 0;
  uint32_t len = 0;
  uint32_t done = 0;       // bytes already transferred
  uint32_t submitted = 0;  // bytes of the transfer in flight
  uint32_t retries = 0;    // EAGAIN/EINTR resubmissions
  int buf_index = -1;      // registered-buffer index, or -1
};

struct Op {
  std::atomic<int> refs{1};
  std::atomic<uint32_t> pending{0};  // pieces not finished
  std::atomic<uint32_t> complete{0};
  std::atomic<bool> failed{false};
  Status status;  // written once, by the first failing piece
  Engine::Impl* engine = nullptr;
  FileImpl* file = nullptr;
  FaultInjector* injector = nullptr;
  bool write = false;
  bool sync = false;  // Engine::Sync: one piece of no bytes, an fdatasync
  size_t len = 0;
  uint64_t offset = 0;
  Callback on_complete;
  std::unique_ptr<Piece[]> pieces;
};

void RefOp(Op* op);
void UnrefOp(Op* op);

// Bytes to submit next for `piece`: the remainder, or less under a fault
// injector.
uint32_t NextLength(const Piece& piece);

// Called by a backend for every finished transfer of `submitted` bytes,
// on the thread that reaped it. Applies the fault injector, then Advance(),
// and completes the piece unless its remainder must be resubmitted, in
// which case it returns true and the backend submits the piece again.
// A sync's piece (`submitted` 0, `result` 0 or -errno) goes through the
// fault injector's SyncResult and is resubmitted after EINTR or EAGAIN.
bool Settle(Piece* piece, uint32_t submitted, int result);
// Finishes `piece` (0, or the positive errno it failed with) and, with the
// last piece of its request, the request. Defined in engine.cc.
void CompletePiece(Piece* piece, int err);

// errno -> Status, for every I/O failure. The one place this happens.
Status IoStatus(int err, bool write, const std::string& path, uint64_t offset,
                uint64_t len);
// errno -> Status for an fdatasync of `path`, blocking or not.
Status SyncStatus(int err, const std::string& path);
// ErrnoStatus is public (strata/aio.h); ErrnoText and HumanBytes are
// strata's (common/text.h).
using aio::ErrnoStatus;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual int threads() const = 0;
  // Registers an open file under `slot` where the backend can; returns
  // whether it did.
  virtual bool AddFile(int slot, int fd) = 0;
  virtual void RemoveFile(int slot) = 0;
  // Registers [data, data+bytes) at fixed-buffer index `index`; returns
  // whether every ring accepted it.
  virtual bool AddBuffer(int index, void* data, size_t bytes) = 0;
  virtual void RemoveBuffer(int index) = 0;
  // Queues pieces for `ring`. Thread-safe; never blocks on I/O.
  virtual void Submit(int ring, Piece* const* pieces, size_t count) = 0;
  virtual IoStats stats() const = 0;
};

// Per-thread counters: one writer (the thread that owns them), any reader.
struct Counters {
  std::atomic<uint64_t> transfers{0};
  std::atomic<uint64_t> resubmits{0};
  std::atomic<uint64_t> fixed_buffer{0};
  std::atomic<uint64_t> fixed_file{0};
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> syncs{0};

  static void Bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  void AddTo(IoStats* s) const;
};

// Buffers given to Engine::RegisterBuffer and the fixed-buffer slots they
// occupy on every ring. Thread-safe. See Note [Buffer registration].
class BufferRegistry {
 public:
  // `fixed`: whether the backend's rings accept registered buffers.
  BufferRegistry(Backend* backend, bool fixed);
  Status Register(void* data, size_t bytes);
  // Fails with kFailedPrecondition while pieces hold one of its slots.
  Status Unregister(void* data);
  // The slot of a live registration holding [buf, buf+len), held until
  // Release(); -1 if there is none.
  int Acquire(const void* buf, size_t len);
  void Release(int slot);

 private:
  // A registered range, at most 1 GiB (the kernel's limit per buffer).
  struct Registered {
    uintptr_t owner;  // the address Register() was given
    uintptr_t start;
    size_t bytes;
    int slot;   // fixed-buffer slot, or -1 when served unregistered
    bool live;  // registration finished; requests may use it
  };

  // The passes of Register() (Note [Buffer registration]): reserve the
  // chunks and their slots under the lock, hand them to the backend without
  // it, publish them under it again. Publish returns whether the backend
  // refused any chunk, which is then served unregistered.
  Result<std::vector<Registered>> Reserve(uintptr_t owner, size_t bytes);
  std::vector<bool> AddToBackend(const std::vector<Registered>& chunks);
  bool Publish(uintptr_t owner, const std::vector<bool>& accepted);

  Backend* backend_;
  bool fixed_;
  std::shared_mutex mu_;
  std::vector<Registered> ranges_;  // sorted by start
  std::vector<bool> slot_taken_;
  std::unique_ptr<std::atomic<int64_t>[]> slot_users_;
};

// Most files and buffer slots the rings register.
inline constexpr int kMaxFixedFiles = 1024;
inline constexpr int kMaxFixedBuffers = 1024;

// Creates the io_uring backend, filling info->ring_setup, fixed_files and
// fixed_buffers. Fails with kUnavailable when io_uring cannot be set up.
Result<std::unique_ptr<Backend>> CreateUringBackend(const IoOptions& options,
                                                    IoInfo* info);
std::unique_ptr<Backend> CreateThreadBackend(const IoOptions& options,
                                             IoInfo* info);

}  // namespace strata::aio::internal

#endif  // STRATA_AIO_INTERNAL_H_
