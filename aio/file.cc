// Opening files for strata_aio: create, O_DIRECT with a buffered fallback,
// the real direct-I/O alignment, preallocation, and block devices for the
// callers that ask for them.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string>

#include "aio/internal.h"

namespace strata::aio::internal {
namespace {

constexpr uint32_t kDefaultDioAlign = 4096;

std::string ParentDir(const std::string& path) {
  std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

Status OpenError(int err, const std::string& path) {
  const std::string dir = ParentDir(path);
  std::error_code ec;
  if (err == ENOENT && std::filesystem::is_directory(dir, ec)) {
    return Status::NotFound("cannot open '" + path +
                            "': no such file (was it removed meanwhile?); "
                            "check the path, or let strata create it");
  }
  if (err == ENOENT) {
    return Status::NotFound("cannot open '" + path + "': directory '" + dir +
                            "' does not exist; create it (mkdir -p " + dir +
                            ") or choose another path");
  }
  if (err == ENOTDIR) {
    return Status::InvalidArgument(
        "cannot open '" + path +
        "': a component of the path is not a directory");
  }
  if (err == ELOOP) {
    return Status::InvalidArgument(
        "cannot open '" + path +
        "': it is a symbolic link (or its path has too many), and strata "
        "does not follow links to the files it opens; remove it or give the "
        "path it points to");
  }
  if (err == EEXIST) {
    return Status::FailedPrecondition(
        "cannot create '" + path +
        "': something by that name exists already (a file or a link); "
        "remove it or choose another directory");
  }
  if (err == EISDIR) {
    return Status::InvalidArgument(
        "cannot open '" + path + "': it is a directory; name a file inside it");
  }
  return ErrnoStatus(err, "cannot open '" + path + "'");
}

// Direct-I/O alignment from statx(STATX_DIOALIGN), `fallback` where the
// kernel or the file system does not report it.
void DioAlignment(int fd, uint32_t fallback, uint32_t* mem_align,
                  uint32_t* offset_align) {
  *mem_align = fallback;
  *offset_align = fallback;
  struct statx stx = {};
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) != 0) return;
  if (!(stx.stx_mask & STATX_DIOALIGN)) return;
  if (stx.stx_dio_mem_align != 0) *mem_align = stx.stx_dio_mem_align;
  if (stx.stx_dio_offset_align != 0) {
    *offset_align = stx.stx_dio_offset_align;
  }
}

Status NoSpaceError(const std::string& path, uint64_t size) {
  std::string msg = "cannot preallocate " + HumanBytes(size) + " for '" + path +
                    "': no space left on the file system";
  struct statvfs vfs = {};
  if (statvfs(ParentDir(path).c_str(), &vfs) == 0) {
    msg += " (" + HumanBytes(uint64_t{vfs.f_bavail} * vfs.f_frsize) + " free)";
  }
  msg += "; free space there, choose a directory with room, or ask for less";
  return Status::NoSpace(std::move(msg));
}

// Grows the file to `size` bytes with real blocks where the file system
// supports fallocate, else by truncation.
Status Preallocate(int fd, const std::string& path, uint64_t size) {
  int rc;
  do {
    rc = fallocate(fd, 0, 0, static_cast<off_t>(size));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return Status::Ok();
  const int err = errno;
  if (err == ENOSPC || err == EDQUOT) return NoSpaceError(path, size);
  if (err != EOPNOTSUPP) {
    return ErrnoStatus(err, "cannot preallocate '" + path + "'");
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return ErrnoStatus(errno, "cannot extend '" + path + "'");
  }
  return Status::Ok();
}

// Opens without O_CREAT first so we know whether we created the file, and
// may remove it again if preallocation fails. Never follows a link.
int OpenFd(const std::string& path, int flags, const FileOptions& options,
           bool* created) {
  *created = false;
  flags |= O_NOFOLLOW;
  const int create = O_CREAT | O_EXCL;
  int fd = -1;
  if (!options.exclusive) {
    fd = open(path.c_str(), flags);
    if (fd >= 0 || errno != ENOENT || !options.create) return fd;
  }
  fd = open(path.c_str(), flags | create, options.mode);
  if (fd >= 0) *created = true;
  if (fd < 0 && errno == EEXIST && !options.exclusive) {
    fd = open(path.c_str(), flags);
  }
  return fd;
}

// Some file systems create the file before refusing O_DIRECT (tmpfs): an
// exclusive open then finds it. It is taken only if it is that file, empty,
// this user's and with one name; anything else is EEXIST.
int OpenRefusedCreation(const std::string& path, int flags) {
  const int fd = open(path.c_str(), flags | O_NOFOLLOW);
  if (fd < 0) return fd;
  struct stat st = {};
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
      st.st_nlink == 1 && st.st_size == 0) {
    return fd;
  }
  close(fd);
  errno = EEXIST;
  return -1;
}

// Opens with O_DIRECT where asked, falling back to buffered I/O (and
// clearing *direct) where the file system refuses it. -1 with errno set.
int OpenDirectOrBuffered(const std::string& path, int base,
                         const FileOptions& options, bool* created,
                         bool* direct) {
  if (!*direct) return OpenFd(path, base, options, created);
  int fd = OpenFd(path, base | O_DIRECT, options, created);
  if (fd >= 0 || errno != EINVAL) return fd;
  // The file system refuses O_DIRECT (ramfs, some FUSE and overlay
  // mounts). Serve the file buffered rather than failing, and say so.
  *direct = false;
  bool created_again = false;
  fd = OpenFd(path, base, options, &created_again);
  if (fd < 0 && errno == EEXIST && options.exclusive) {
    fd = OpenRefusedCreation(path, base);
    created_again = fd >= 0;
  }
  *created = *created || created_again;
  if (fd >= 0) {
    std::fprintf(stderr,
                 "strata aio: '%s': file system does not support "
                 "O_DIRECT; using buffered I/O (results are "
                 "'buffered')\n",
                 path.c_str());
  }
  return fd;
}

// Note [Opening block devices]
// A block device is opened only for a caller that opts in
// (FileOptions::block_device): the optimizer store never does, so a device
// node planted where it keeps its files is refused. Nothing that makes
// sense for a file applies: a device is never created, truncated or
// preallocated, and FileOptions::size must fit in it. The device is not
// claimed (O_EXCL): io_uring drops its registered files only once a ring's
// teardown has run, later than the engine's destruction, so a claim would
// outlive the engine and refuse the next engine's open. A caller that
// writes claims the device itself, once for all its engines.
// The device's size and logical block size, checked against what the
// caller asked for (Note [Opening block devices]).
Result<std::unique_ptr<FileImpl>> OpenBlockDevice(const std::string& path,
                                                  int fd, bool direct,
                                                  const FileOptions& options) {
  uint64_t size = 0;
  int sector = 0;
  if (ioctl(fd, BLKGETSIZE64, &size) != 0 ||
      ioctl(fd, BLKSSZGET, &sector) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err,
                       "cannot read the size of block device '" + path + "'");
  }
  if (options.size > size) {
    close(fd);
    return Status::InvalidArgument(
        "block device '" + path + "' holds " + HumanBytes(size) + " (" +
        std::to_string(size) + " bytes), less than the " +
        HumanBytes(options.size) + " (" + std::to_string(options.size) +
        " bytes) asked for; ask for at most its size");
  }
  uint32_t mem_align = 1;
  uint32_t offset_align = 1;
  if (direct) {
    DioAlignment(fd, static_cast<uint32_t>(sector), &mem_align, &offset_align);
  }
  return std::make_unique<FileImpl>(path, fd, size, direct, options.read_only,
                                    mem_align, offset_align,
                                    /*block_device=*/true);
}

}  // namespace

FileImpl::FileImpl(std::string path, int fd, uint64_t size, bool direct,
                   bool read_only, uint32_t mem_align, uint32_t offset_align,
                   bool block_device)
    : block_device(block_device),
      path_(std::move(path)),
      fd_(fd),
      size_(size),
      direct_(direct),
      read_only_(read_only),
      mem_align_(mem_align),
      offset_align_(offset_align) {}

FileImpl::~FileImpl() { close(fd_); }

void FileImpl::GrowTo(uint64_t end) {
  uint64_t cur = size_.load(std::memory_order_relaxed);
  while (cur < end && !size_.compare_exchange_weak(cur, end)) {
  }
}

Status FileImpl::Sync() {
  if (fdatasync(fd_) != 0) {
    return SyncStatus(errno, path_);
  }
  return Status::Ok();
}

Status FileImpl::DropCache() {
  if (direct_) return Status::Ok();
  STRATA_RETURN_IF_ERROR(Sync());
  const int rc = posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
  if (rc != 0) return ErrnoStatus(rc, "posix_fadvise of '" + path_ + "'");
  return Status::Ok();
}

Result<std::unique_ptr<FileImpl>> OpenFileImpl(const std::string& path,
                                               const FileOptions& options) {
  const int base = (options.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC |
                   (options.dsync ? O_DSYNC : 0);
  bool created = false;
  bool direct = options.direct;
  const int fd = OpenDirectOrBuffered(path, base, options, &created, &direct);
  if (fd < 0) return OpenError(errno, path);

  struct stat st = {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    if (created) unlink(path.c_str());
    return ErrnoStatus(err, "cannot stat '" + path + "'");
  }
  if (S_ISBLK(st.st_mode) && options.block_device) {
    return OpenBlockDevice(path, fd, direct, options);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return Status::InvalidArgument("'" + path + "' is not a regular file");
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (options.size > size && !options.read_only) {
    Status pre = Preallocate(fd, path, options.size);
    if (!pre.ok()) {
      close(fd);
      if (created) unlink(path.c_str());
      return pre;
    }
    size = options.size;
  }
  uint32_t mem_align = 1;
  uint32_t offset_align = 1;
  if (direct) DioAlignment(fd, kDefaultDioAlign, &mem_align, &offset_align);
  return std::make_unique<FileImpl>(path, fd, size, direct, options.read_only,
                                    mem_align, offset_align,
                                    /*block_device=*/false);
}

}  // namespace strata::aio::internal
