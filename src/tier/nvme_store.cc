#include "src/tier/nvme_store.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/text.h"
#include "src/tier/range_allocator.h"
#include "src/tier/swap_dir.h"

namespace strata::tier {
namespace {

constexpr uint64_t kMinAlignment = 4096;
constexpr int kMaxFiles = 64;

std::string Hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%016" PRIx64, value);
  return text;
}

Status ValidateOptions(const NvmeStoreOptions& options) {
  if (options.dir.empty()) {
    return Status::InvalidArgument(
        "NVMe tier: no swap directory given; name an existing "
        "directory on the NVMe device");
  }
  if (options.capacity == 0) {
    return Status::InvalidArgument(
        "NVMe tier: capacity is 0 bytes; set the NVMe budget "
        "(--nvme-budget) to a positive size");
  }
  if (options.files < 1 || options.files > kMaxFiles) {
    return Status::InvalidArgument(
        "NVMe tier: " + std::to_string(options.files) +
        " swap files asked for; use 1.." + std::to_string(kMaxFiles));
  }
  return Status::Ok();
}

// Note [Several swap directories]
// NvmeStoreOptions::dir may name several directories, separated by ':', one
// per drive, as DeepSpeed's DeepNVMe stripes over drives: swap file i lives
// in directory i mod D, so the allocations that rotate over the files
// rotate over the drives too. Each directory is checked and locked as a
// lone one is; the file count rounds up to a multiple of D (at most
// kMaxFiles), so every drive holds as many files.
Result<std::vector<std::string>> SwapDirectories(const std::string& given) {
  const std::vector<std::string> dirs = SplitList(given, ':');
  if (dirs.empty() || dirs.size() > kMaxFiles) {
    return Status::InvalidArgument("NVMe tier: swap directory list '" + given +
                                   "' names no directory, or more than " +
                                   std::to_string(kMaxFiles));
  }
  for (size_t i = 0; i < dirs.size(); ++i) {
    std::error_code ec;
    const auto same = [&](const std::string& other) {
      return std::filesystem::equivalent(dirs[i], other, ec);
    };
    if (std::any_of(dirs.begin(), dirs.begin() + i, same)) {
      return Status::InvalidArgument("NVMe tier: swap directory '" + dirs[i] +
                                     "' is named twice in '" + given +
                                     "'; name each directory once");
    }
  }
  return dirs;
}

// Checks and locks every directory, or none: on a failure the locks
// already taken are released.
Result<std::vector<int>> LockAll(const std::vector<std::string>& dirs) {
  std::vector<int> fds;
  Status st;
  for (const std::string& dir : dirs) {
    st = CheckSwapDirectory(dir);
    if (!st.ok()) break;
    Result<int> fd = LockSwapDirectory(dir);
    if (!fd.ok()) {
      st = fd.status();
      break;
    }
    fds.push_back(*fd);
  }
  if (st.ok()) return fds;
  for (size_t d = 0; d < fds.size(); ++d) UnlockSwapDirectory(dirs[d], fds[d]);
  return st;
}

int FileCount(int asked, int dirs) {
  const int per_dir = (asked + dirs - 1) / dirs;
  return std::min(per_dir * dirs, kMaxFiles / dirs * dirs);
}

struct ExtentMeta {
  uint64_t bytes = 0;
  bool has_data = false;  // the last write succeeded; `digest` holds
  std::shared_ptr<const Digest> digest;
};

struct SwapFile {
  SwapFile(aio::File* f, uint64_t capacity, uint64_t alignment)
      : file(f), ranges(capacity, alignment) {}
  aio::File* file;
  RangeAllocator ranges;
  std::unordered_map<uint64_t, ExtentMeta> extents;  // by offset
};

}  // namespace

class NvmeStore::Impl {
 public:
  // Swap file i lives in dirs[i % dirs.size()] (Note [Several swap
  // directories]); `lock_fds` holds each directory's lock.
  Impl(aio::Engine* engine, std::string dir, std::vector<std::string> dirs,
       std::vector<int> lock_fds, int files)
      : engine_(engine),
        dir_(std::move(dir)),
        dirs_(std::move(dirs)),
        lock_fds_(std::move(lock_fds)) {
    for (int i = 0; i < files; ++i) {
      paths_.push_back(SwapFilePath(dirs_[i % dirs_.size()], i));
    }
  }
  ~Impl();

  Status ProbeAlignment();
  Status CreateFiles(uint64_t capacity);

  Result<Extent> Allocate(uint64_t bytes);
  void Free(const Extent& extent);
  Result<PendingIo> StartWrite(const Extent& extent, const void* buf,
                               std::shared_ptr<const Digest> digest);
  Result<PendingIo> StartRead(const Extent& extent, void* buf, ReadCheck check);
  Status Mismatch(const Extent& extent, const Segment& bad, uint64_t got);
  Status FinishIo(PendingIo& io);
  std::string Describe(const Extent& extent) const;

  // Fixed after Open (ProbeAlignment and CreateFiles run before any use).
  aio::Engine* const engine_;
  const std::string dir_;  // as given: one directory, or several with ':'
  const std::vector<std::string> dirs_;
  std::vector<std::string> paths_;  // by file index
  size_t created_ = 0;  // paths_[0, created_) are files this store created
  uint64_t alignment_ = kMinAlignment;

  // Guarded by mu_ (a SwapFile's aio::File* is fixed once created).
  mutable std::mutex mu_;
  std::vector<SwapFile> files_;
  int next_file_ = 0;
  NvmeStoreStats stats_;

 private:
  ExtentMeta& Lookup(const Extent& extent);
  Status CheckBuffer(const void* buf, const char* what) const;
  Status NoSpace(uint64_t bytes) const;
  Status FinishWrite(PendingIo& io, const Status& done);
  Status FinishRead(PendingIo& io, const Status& done);
  Status NoValidData(const Extent& extent) const;

  const std::vector<int> lock_fds_;  // by directory
};

NvmeStore::Impl::~Impl() {
  for (SwapFile& f : files_) {
    // A failure here means I/O is still in flight on the file, which the
    // contract forbids: the buffers it touches may already be gone.
    STRATA_CHECK(engine_->CloseFile(f.file).ok());
  }
  for (size_t i = 0; i < created_; ++i) unlink(paths_[i].c_str());
  for (size_t d = 0; d < dirs_.size(); ++d) {
    UnlockSwapDirectory(dirs_[d], lock_fds_[d]);
  }
}

// The alignment has to be known before the files are sized, and only an
// open file can tell it, so the first file of each directory is opened
// once empty to ask; the largest alignment serves them all.
Status NvmeStore::Impl::ProbeAlignment() {
  for (size_t d = 0; d < dirs_.size(); ++d) {
    // Note [Files strata creates]: every swap file is new (the stale ones
    // are gone), private, and not a link.
    Result<aio::File*> probe =
        engine_->OpenFile(paths_[d], {.size = 0, .exclusive = true});
    if (!probe.ok()) {
      return Status(probe.status().code(),
                    "NVMe tier: " + probe.status().message());
    }
    created_ = d + 1;
    const uint64_t dio =
        std::max((*probe)->mem_align(), (*probe)->offset_align());
    STRATA_CHECK(engine_->CloseFile(*probe).ok());
    if ((dio & (dio - 1)) != 0) {
      return Status::Unavailable(
          "NVMe tier: '" + dirs_[d] + "' reports a direct-I/O alignment of " +
          std::to_string(dio) +
          " bytes, which is not a power of two; choose a swap "
          "directory on another file system");
    }
    alignment_ = std::max(alignment_, dio);
  }
  return Status::Ok();
}

Status NvmeStore::Impl::CreateFiles(uint64_t capacity) {
  const uint64_t n = paths_.size();
  const uint64_t per_file =
      ((capacity + n - 1) / n + alignment_ - 1) / alignment_ * alignment_;
  files_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // The first of each directory's files are the ones ProbeAlignment
    // created.
    Result<aio::File*> file = engine_->OpenFile(
        paths_[i], {.size = per_file, .exclusive = i >= dirs_.size()});
    if (!file.ok()) {
      const Status& st = file.status();
      std::string msg = "NVMe tier: cannot create " + std::to_string(n) +
                        " swap files of " + HumanBytes(per_file) + " (" +
                        HumanBytes(per_file * n) + " in all) in '" + dir_ +
                        "': " + st.message();
      if (st.code() == StatusCode::kNoSpace) {
        msg += "; or lower the NVMe budget (--nvme-budget)";
      }
      return Status(st.code(), std::move(msg));
    }
    created_ = std::max(created_, files_.size() + 1);
    files_.emplace_back(*file, per_file, alignment_);
  }
  stats_.capacity = per_file * n;
  return Status::Ok();
}

ExtentMeta& NvmeStore::Impl::Lookup(const Extent& extent) {
  STRATA_CHECK(extent.file >= 0 &&
               extent.file < static_cast<int>(files_.size()));
  auto& extents = files_[extent.file].extents;
  auto it = extents.find(extent.offset);
  STRATA_CHECK(it != extents.end());
  STRATA_CHECK(it->second.bytes == extent.bytes);
  return it->second;
}

Status NvmeStore::Impl::NoSpace(uint64_t bytes) const {
  uint64_t free_bytes = 0;
  uint64_t largest = 0;
  for (const SwapFile& f : files_) {
    free_bytes += f.ranges.free_bytes();
    largest = std::max(largest, f.ranges.largest_free());
  }
  std::string msg = "NVMe tier: cannot allocate " + HumanBytes(bytes) + " (" +
                    std::to_string(bytes) +
                    " bytes): " + HumanBytes(free_bytes) + " free of " +
                    HumanBytes(stats_.capacity) +
                    " capacity, largest free extent " + HumanBytes(largest);
  const uint64_t per_file = files_[0].ranges.capacity();
  if (bytes > per_file) {
    msg += "; an extent must fit in one swap file (" + HumanBytes(per_file) +
           " each), so use fewer swap files or";
  } else {
    msg += ";";
  }
  msg += " raise the NVMe budget (--nvme-budget) or free extents first";
  return Status::NoSpace(std::move(msg));
}

Result<Extent> NvmeStore::Impl::Allocate(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int n = static_cast<int>(files_.size());
  for (int k = 0; k < n; ++k) {
    const int i = (next_file_ + k) % n;
    std::optional<uint64_t> offset = files_[i].ranges.Allocate(bytes);
    if (!offset) continue;
    const uint64_t size = files_[i].ranges.SizeOf(*offset);
    files_[i].extents[*offset].bytes = size;
    next_file_ = (i + 1) % n;
    stats_.used += size;
    stats_.peak = std::max(stats_.peak, stats_.used);
    return Extent{.file = i, .offset = *offset, .bytes = size};
  }
  return NoSpace(bytes);
}

void NvmeStore::Impl::Free(const Extent& extent) {
  std::lock_guard<std::mutex> lock(mu_);
  Lookup(extent);
  files_[extent.file].extents.erase(extent.offset);
  files_[extent.file].ranges.Free(extent.offset);
  stats_.used -= extent.bytes;
}

Status NvmeStore::Impl::CheckBuffer(const void* buf, const char* what) const {
  if (buf != nullptr && reinterpret_cast<uintptr_t>(buf) % alignment_ == 0) {
    return Status::Ok();
  }
  char text[96];
  std::snprintf(text, sizeof(text), "%p", buf);
  return Status::InvalidArgument(
      std::string("NVMe tier: ") + what + " buffer " + text +
      (buf == nullptr ? " is null" : " is misaligned") +
      "; swap I/O needs a buffer aligned to " + std::to_string(alignment_) +
      " bytes (the swap files' O_DIRECT alignment): allocate "
      "it with aio::PinnedBuffer or aligned_alloc");
}

std::string NvmeStore::Impl::Describe(const Extent& extent) const {
  if (!extent.valid()) return "invalid extent";
  STRATA_CHECK(extent.file < static_cast<int>(paths_.size()));
  char offset[24];
  std::snprintf(offset, sizeof(offset), "%" PRIx64, extent.offset);
  return "extent " + std::to_string(extent.file) + ":+0x" + offset + " (" +
         HumanBytes(extent.bytes) + ") of '" + paths_[extent.file] + "'";
}

Status NvmeStore::Impl::NoValidData(const Extent& extent) const {
  return Status::DataLoss(
      "NVMe tier: " + Describe(extent) +
      " holds no valid data: it was never written or its last "
      "write failed; write it again from the in-memory copy "
      "before reading it");
}

Result<PendingIo> NvmeStore::Impl::StartWrite(
    const Extent& extent, const void* buf,
    std::shared_ptr<const Digest> digest) {
  STRATA_RETURN_IF_ERROR(CheckBuffer(buf, "write"));
  if (digest == nullptr) {
    digest = std::make_shared<const Digest>(DigestOf(buf, extent.bytes));
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_hashed += extent.bytes;
  } else if (!Tiles(*digest, extent.bytes)) {
    return Status::InvalidArgument(
        "NVMe tier: the digest handed in for a write of " + Describe(extent) +
        " does not tile it (its segments must cover bytes 0 to " +
        std::to_string(extent.bytes) +
        " in order); pass none to have the "
        "store hash the buffer");
  }
  {
    // Invalidate before any byte can change, so that a write that fails,
    // or is never finished, cannot be read back as good.
    std::lock_guard<std::mutex> lock(mu_);
    Lookup(extent).has_data = false;
  }
  STRATA_ASSIGN_OR_RETURN(aio::Handle handle,
                          engine_->Write(files_[extent.file].file, buf,
                                         extent.bytes, extent.offset));
  return PendingIo{.handle = std::move(handle),
                   .extent = extent,
                   .buf = const_cast<void*>(buf),
                   .write = true,
                   .digest = std::move(digest)};
}

Result<PendingIo> NvmeStore::Impl::StartRead(const Extent& extent, void* buf,
                                             ReadCheck check) {
  STRATA_RETURN_IF_ERROR(CheckBuffer(buf, "read"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!Lookup(extent).has_data) return NoValidData(extent);
  }
  STRATA_ASSIGN_OR_RETURN(aio::Handle handle,
                          engine_->Read(files_[extent.file].file, buf,
                                        extent.bytes, extent.offset));
  PendingIo io;
  io.handle = std::move(handle);
  io.extent = extent;
  io.buf = buf;
  io.verified = check == ReadCheck::kStore;
  return io;
}

Status NvmeStore::Impl::FinishIo(PendingIo& io) {
  STRATA_CHECK(io.handle.valid());
  const Status done = io.handle.Wait();
  io.handle = aio::Handle();  // a second FinishIo is a bug and aborts
  return io.write ? FinishWrite(io, done) : FinishRead(io, done);
}

Status NvmeStore::Impl::FinishWrite(PendingIo& io, const Status& done) {
  std::lock_guard<std::mutex> lock(mu_);
  ExtentMeta& meta = Lookup(io.extent);
  if (!done.ok()) {
    ++stats_.write_failures;
    return Status(done.code(),
                  "NVMe tier: write of " + Describe(io.extent) +
                      " failed, the extent holds no valid data and the "
                      "source buffer remains the valid copy: " +
                      done.message());
  }
  meta.has_data = true;
  meta.digest = std::move(io.digest);
  stats_.bytes_written += io.extent.bytes;
  return Status::Ok();
}

// Verified here rather than in the completion callback, which runs on the
// ring thread: hashing a large extent there would stall every other
// transfer on the ring.
Status NvmeStore::Impl::FinishRead(PendingIo& io, const Status& done) {
  if (!done.ok()) {
    return Status(done.code(), "NVMe tier: read of " + Describe(io.extent) +
                                   " failed: " + done.message());
  }
  std::shared_ptr<const Digest> digest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const ExtentMeta& meta = Lookup(io.extent);
    if (!meta.has_data) return NoValidData(io.extent);
    digest = meta.digest;
    if (!io.verified) {
      stats_.bytes_read += io.extent.bytes;
      io.digest = std::move(digest);
      return Status::Ok();
    }
  }
  const Segment* bad = FirstMismatch(*digest, io.buf);
  if (bad != nullptr) {
    return Mismatch(
        io.extent, *bad,
        Hash(static_cast<const char*>(io.buf) + bad->offset, bad->bytes));
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes_hashed += io.extent.bytes;
  stats_.bytes_read += io.extent.bytes;
  return Status::Ok();
}

Status NvmeStore::Impl::Mismatch(const Extent& extent, const Segment& bad,
                                 uint64_t got) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.checksum_failures;
  }
  return Status::DataLoss(
      "NVMe tier: checksum mismatch in " + Describe(extent) + " at offset " +
      std::to_string(extent.offset + bad.offset) + " (its " +
      HumanBytes(bad.bytes) + " from byte " + std::to_string(bad.offset) +
      " hash to " + Hex(got) + ", written as " + Hex(bad.hash) +
      "); the swap file was modified or the device returned bad data");
}

NvmeStore::NvmeStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NvmeStore::~NvmeStore() = default;

Result<std::unique_ptr<NvmeStore>> NvmeStore::Open(
    aio::Engine* engine, const NvmeStoreOptions& options) {
  STRATA_CHECK(engine != nullptr);
  STRATA_RETURN_IF_ERROR(ValidateOptions(options));
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> dirs,
                          SwapDirectories(options.dir));
  STRATA_ASSIGN_OR_RETURN(std::vector<int> lock_fds, LockAll(dirs));
  for (const std::string& dir : dirs) ReclaimStaleSwapFiles(dir);
  // From here on, Impl's destructor undoes whatever was set up when a step
  // fails: it closes and deletes the swap files and releases the locks.
  const int files = FileCount(options.files, static_cast<int>(dirs.size()));
  auto impl = std::make_unique<Impl>(engine, options.dir, std::move(dirs),
                                     std::move(lock_fds), files);
  STRATA_RETURN_IF_ERROR(impl->ProbeAlignment());
  STRATA_RETURN_IF_ERROR(impl->CreateFiles(options.capacity));
  return std::unique_ptr<NvmeStore>(new NvmeStore(std::move(impl)));
}

uint64_t NvmeStore::alignment() const { return impl_->alignment_; }

Result<Extent> NvmeStore::Allocate(uint64_t bytes) {
  return impl_->Allocate(bytes);
}

void NvmeStore::Free(const Extent& extent) { impl_->Free(extent); }

Result<PendingIo> NvmeStore::StartWrite(const Extent& extent, const void* buf,
                                        std::shared_ptr<const Digest> digest) {
  return impl_->StartWrite(extent, buf, std::move(digest));
}

Result<PendingIo> NvmeStore::StartRead(const Extent& extent, void* buf,
                                       ReadCheck check) {
  return impl_->StartRead(extent, buf, check);
}

Status NvmeStore::Mismatch(const Extent& extent, const Segment& bad,
                           uint64_t got) {
  return impl_->Mismatch(extent, bad, got);
}

Status NvmeStore::FinishIo(PendingIo& io) { return impl_->FinishIo(io); }

Status NvmeStore::Write(const Extent& extent, const void* buf,
                        std::shared_ptr<const Digest> digest) {
  STRATA_ASSIGN_OR_RETURN(PendingIo io,
                          StartWrite(extent, buf, std::move(digest)));
  return FinishIo(io);
}

Status NvmeStore::Read(const Extent& extent, void* buf) {
  STRATA_ASSIGN_OR_RETURN(PendingIo io, StartRead(extent, buf));
  return FinishIo(io);
}

std::string NvmeStore::Describe(const Extent& extent) const {
  return impl_->Describe(extent);
}

std::string NvmeStore::FilePath(int file) const {
  STRATA_CHECK(file >= 0 && file < static_cast<int>(impl_->paths_.size()));
  return impl_->paths_[file];
}

const std::string& NvmeStore::dir() const { return impl_->dir_; }

NvmeStoreStats NvmeStore::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  return impl_->stats_;
}

}  // namespace strata::tier
