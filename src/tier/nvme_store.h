// The NVMe tier: an extent store over a few preallocated swap files in one
// directory, or spread over several (one per drive). Never one file per
// tensor.
//
// Layout
// - Open() creates `files` swap files, strata-swap-<i>.bin, of
//   capacity/files bytes each (rounded up to the alignment), preallocated
//   with fallocate so a full disk fails at setup, not mid-step.
// - An extent is an aligned range of one file, allocated best-fit from that
//   file's free list (RangeAllocator) and coalesced on Free(). Allocations
//   rotate over the files so concurrent transfers spread over them.
// - Several directories (`dir` = "/nvme0/swap:/nvme1/swap"): swap file i
//   lives in directory i mod D, and the file count rounds up to a multiple
//   of D, so the rotation spreads transfers over the drives too; each
//   directory is checked, locked and cleaned as a lone one (Note [Several
//   swap directories] in nvme_store.cc).
//
// Integrity
// - Every successful write records a digest of the extent's bytes
//   (src/tier/digest.h: the XXH3-64 of each segment): the writer's, handed
//   to StartWrite, or one the store makes of 1 MiB segments. Every read is
//   verified against it in FinishIo(); a mismatch is kDataLoss naming the
//   extent, the file and the offset of the first bad segment, counts in
//   stats().checksum_failures, and the caller must not use the buffer.
//   A read started with ReadCheck::kCaller is not: FinishIo hands the
//   caller the digest instead (PendingIo::digest), and the caller verifies
//   every byte before it uses it (the optimizer's pass: Note [Checksums in
//   the optimizer's pass] in src/optim/step_digest.h) and reports a
//   mismatch through Mismatch().
//   The digests live in memory only: swap data does not outlive the store.
// - StartWrite() marks the extent as holding no valid data before any byte
//   moves; only FinishIo() of a successful write marks it valid again. An
//   extent whose last write failed or was never finished, and one never
//   written since it was allocated (Free() drops the checksum), fail
//   StartRead() with kDataLoss saying it holds no valid data.
// - A failed write (EIO, ENOSPC, short I/O that cannot complete) is
//   returned by FinishIo(); the source buffer is untouched, so the caller's
//   copy stays the valid one until a write succeeds.
//
// Ownership of the directory
// - Open() takes an exclusive flock on <dir>/strata.lock (and writes its
//   pid there), so two engines cannot share a directory, even within one
//   process; the second one gets kFailedPrecondition naming the holder's
//   pid. A missing directory is kNotFound; a file system too small for the
//   swap files is kNoSpace naming the directory and the bytes needed, and
//   leaves no swap file behind.
// - Swap files found at Open() belong to a run that died (its lock is gone
//   with it): they are deleted and recreated, and the reclaim is reported
//   once on stderr with their count and size. Nothing else in the
//   directory is touched.
// - The destructor deletes the swap files and releases the lock. Swap data
//   is scratch: it does not survive the store.
//
// Thread safety: every method may be called from any thread; one mutex
// guards the metadata and no I/O runs under it. A caller must not read an
// extent while a write to it is in flight, start two writes to one extent
// at once, free an extent with I/O in flight, nor destroy the store with
// I/O in flight.
//
// Programming bugs abort (STRATA_CHECK): an extent this store did not
// allocate (or already freed), a PendingIo finished twice.
#ifndef STRATA_SRC_TIER_NVME_STORE_H_
#define STRATA_SRC_TIER_NVME_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "src/tier/digest.h"
#include "strata/aio.h"
#include "strata/status.h"

namespace strata::tier {

struct NvmeStoreOptions {
  std::string dir;        // must exist; several are separated by ":"
  uint64_t capacity = 0;  // total bytes over all swap files; > 0
  int files = 4;          // swap files, 1..64
};

struct Extent {
  int file = -1;
  uint64_t offset = 0;
  uint64_t bytes = 0;  // reserved length, a multiple of alignment()
  bool valid() const { return file >= 0; }
};

// One asynchronous read or write; complete it with FinishIo().
struct PendingIo {
  aio::Handle handle;
  Extent extent;
  void* buf = nullptr;
  bool write = false;
  // Of the written bytes (writes); after FinishIo of a kCaller read, what
  // the bytes read must hash to.
  std::shared_ptr<const Digest> digest;
  bool verified = true;  // reads: FinishIo verifies them
};

// Who verifies a read's bytes against the extent's digest.
enum class ReadCheck { kStore, kCaller };

struct NvmeStoreStats {
  uint64_t capacity = 0;
  uint64_t used = 0;
  uint64_t peak = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  uint64_t checksum_failures = 0;
  uint64_t write_failures = 0;
  // Bytes the store hashed itself: every read, and the writes that came
  // without a digest.
  uint64_t bytes_hashed = 0;
};

class NvmeStore {
 public:
  // `engine` must outlive the store.
  static Result<std::unique_ptr<NvmeStore>> Open(
      aio::Engine* engine, const NvmeStoreOptions& options);
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Offsets, lengths and buffers must be multiples of this (the swap
  // files' O_DIRECT requirement, at least 4096).
  uint64_t alignment() const;

  // An extent of at least `bytes` bytes (rounded up to alignment()), from
  // the first file that fits, starting after the file used last. Or
  // kNoSpace naming the tier, the bytes asked for, the bytes free, the
  // largest free extent and the capacity. An extent never spans files.
  Result<Extent> Allocate(uint64_t bytes);
  void Free(const Extent& extent);

  // Start an asynchronous transfer of the whole extent to or from `buf`
  // (extent.bytes bytes, aligned to alignment()). A null or misaligned
  // buffer is kInvalidArgument naming the requirement. A write's digest is
  // `digest` when given (kInvalidArgument unless its segments tile the
  // extent; the caller vouches that it is the buffer's), else taken here;
  // either way the buffer must not change until FinishIo().
  Result<PendingIo> StartWrite(const Extent& extent, const void* buf,
                               std::shared_ptr<const Digest> digest = {});
  Result<PendingIo> StartRead(const Extent& extent, void* buf,
                              ReadCheck check = ReadCheck::kStore);
  // Waits for the transfer. Writes: records the digest on success; on
  // failure returns the aio error (kIoError, kNoSpace, ...) and counts it
  // in stats().write_failures. Reads: the aio error, or kDataLoss on a
  // checksum mismatch. Call exactly once per PendingIo.
  Status FinishIo(PendingIo& io);

  // A caller's verification of a kCaller read failed: segment `bad` of
  // `extent` hashed to `got`. Counts it in stats().checksum_failures and
  // returns the kDataLoss a store-verified read gives.
  Status Mismatch(const Extent& extent, const Segment& bad, uint64_t got);

  // Synchronous conveniences: Start + Finish.
  Status Write(const Extent& extent, const void* buf,
               std::shared_ptr<const Digest> digest = {});
  Status Read(const Extent& extent, void* buf);

  // "extent 2:+0x4000000 (32.0 MiB) of '/swap/strata-swap-2.bin'";
  // "invalid extent" for a default-constructed one.
  std::string Describe(const Extent& extent) const;
  std::string FilePath(int file) const;
  const std::string& dir() const;
  NvmeStoreStats stats() const;

  class Impl;

 private:
  explicit NvmeStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::tier

#endif  // STRATA_SRC_TIER_NVME_STORE_H_
