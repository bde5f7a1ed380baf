// The swap directory's checks, lock and file names (swap_dir.h).
#include "src/tier/swap_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <filesystem>

#include "common/text.h"
#include "strata/aio.h"

namespace strata::tier {
namespace {

constexpr char kLockName[] = "strata.lock";
constexpr char kSwapPrefix[] = "strata-swap-";
constexpr char kSwapSuffix[] = ".bin";
// Attempts at taking the lock while its previous holder unlinks the file
// under us; see Note [Lock file lifetime].
constexpr int kLockAttempts = 8;

bool IsSwapFileName(const std::string& name) {
  const std::string prefix = kSwapPrefix;
  const std::string suffix = kSwapSuffix;
  return name.size() > prefix.size() + suffix.size() &&
         name.compare(0, prefix.size(), prefix) == 0 &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

// Note [Files strata creates]
// Users run strata as root and point it at shared directories (/tmp, a
// scratch mount), where another user can plant a link under the name of a
// file strata is about to write: strata would then overwrite whatever the
// link names. So the lock file and every swap file are opened with
// O_NOFOLLOW and checked after opening (a regular file; the lock file also
// of this user and with no second name); swap files are created new
// (O_EXCL, after the stale ones are removed, so they are this user's), and
// all of them 0600, since they hold the model's weights and optimizer
// state. A directory that other users may write to is refused unless it
// has the sticky bit, which keeps them from renaming or removing strata's
// files. Checkpoint files (src/ckpt/env.cc) and strata-nvme-bench's file
// (aio::FileOptions) are opened without following links too; checkpoints
// follow the user's umask, like any output.
Status CheckSwapDirectory(const std::string& dir) {
  struct stat st = {};
  if (stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return Status::NotFound("NVMe tier: swap directory '" + dir +
                              "' does not exist; create it (mkdir -p " + dir +
                              ") or choose another swap directory");
    }
    return aio::ErrnoStatus(
        err, "NVMe tier: cannot stat swap directory '" + dir + "'");
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("NVMe tier: swap directory '" + dir +
                                   "' is not a directory; name a directory");
  }
  // Note [Files strata creates]: in a directory others may write to, only
  // the sticky bit stops them from replacing strata's files.
  const bool group_of_others =
      (st.st_mode & S_IWGRP) != 0 && st.st_gid != getegid();
  if (((st.st_mode & S_IWOTH) != 0 || group_of_others) &&
      (st.st_mode & S_ISVTX) == 0) {
    return Status::PermissionDenied(
        "NVMe tier: swap directory '" + dir +
        "' is writable by other users and has no sticky bit, so another "
        "user could replace strata's swap files (the model's weights and "
        "optimizer state); use a private directory (chmod 700 " +
        dir + ") or set the sticky bit (chmod +t " + dir + ")");
  }
  return Status::Ok();
}

namespace {

// The lock file must be a regular file of ours with no other name: not a
// link planted in a shared directory to make strata write elsewhere.
Status CheckLockFile(int fd, const std::string& path) {
  struct stat st = {};
  if (fstat(fd, &st) != 0) {
    return aio::ErrnoStatus(errno, "NVMe tier: cannot stat '" + path + "'");
  }
  if (S_ISREG(st.st_mode) && st.st_uid == geteuid() && st.st_nlink == 1) {
    return Status::Ok();
  }
  return Status::PermissionDenied(
      "NVMe tier: lock file '" + path +
      "' is not a regular file of this user with one name (another user's "
      "file, or a hard link); strata will not write to it: remove it, or "
      "use a swap directory only you can write to");
}

// The pid a lock holder wrote into its lock file, or "unknown" while it
// has not written it yet.
std::string HolderPid(int fd) {
  char text[32] = {};
  const ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  if (n <= 0) return "unknown";
  std::string pid(text, static_cast<size_t>(n));
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) {
    pid.pop_back();
  }
  return pid.empty() ? "unknown" : pid;
}

Status LockBusy(int fd, const std::string& dir, const std::string& path) {
  const std::string pid = HolderPid(fd);
  return Status::FailedPrecondition(
      "NVMe tier: swap directory '" + dir +
      "' is in use by another strata engine (pid " + pid + " holds '" + path +
      "'); use another swap directory for this one, or stop "
      "pid " +
      pid + " first");
}

}  // namespace

// Note [Lock file lifetime]
// The holder removes strata.lock when it closes, so the file we opened may
// be unlinked between our open() and our flock(): we would then hold a lock
// on an orphaned inode while a third engine creates a fresh file and locks
// that. After taking the lock we therefore check that the path still names
// the inode we locked, and start over if it does not. Unlinking happens
// only while the lock is held, so once the check passes the file stays.
Result<int> LockSwapDirectory(const std::string& dir) {
  const std::string path = dir + "/" + kLockName;
  for (int attempt = 0; attempt < kLockAttempts; ++attempt) {
    const int fd =
        open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      const int err = errno;
      if (err == ELOOP) {
        return Status::PermissionDenied(
            "NVMe tier: lock file '" + path +
            "' is a symbolic link; strata does not follow links to the files "
            "it writes: remove it, or use a swap directory only you can "
            "write to");
      }
      return aio::ErrnoStatus(
          err, "NVMe tier: cannot create lock file '" + path + "'");
    }
    if (Status ours = CheckLockFile(fd, path); !ours.ok()) {
      close(fd);
      return ours;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      Status busy =
          err == EWOULDBLOCK
              ? LockBusy(fd, dir, path)
              : aio::ErrnoStatus(err, "NVMe tier: cannot lock '" + path + "'");
      close(fd);
      return busy;
    }
    struct stat locked = {};
    struct stat named = {};
    if (fstat(fd, &locked) == 0 && stat(path.c_str(), &named) == 0 &&
        locked.st_ino == named.st_ino && locked.st_dev == named.st_dev) {
      const std::string pid = std::to_string(getpid()) + "\n";
      if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) !=
                                       static_cast<ssize_t>(pid.size())) {
        const int err = errno;
        unlink(path.c_str());
        close(fd);
        return aio::ErrnoStatus(
            err, "NVMe tier: cannot write pid to '" + path + "'");
      }
      return fd;
    }
    close(fd);
  }
  return Status::Unavailable(
      "NVMe tier: lock file '" + path +
      "' keeps being replaced by other processes; make sure "
      "only one strata engine uses this swap directory");
}

void ReclaimStaleSwapFiles(const std::string& dir) {
  std::error_code ec;
  uint64_t count = 0;
  uint64_t bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!IsSwapFileName(name)) continue;
    // A link by that name is not ours to follow or remove: creating the
    // swap file then fails, naming it (Note [Files strata creates]).
    std::error_code entry_ec;
    if (entry.symlink_status(entry_ec).type() !=
        std::filesystem::file_type::regular) {
      continue;
    }
    const uint64_t size = entry.file_size(entry_ec);
    if (unlink(entry.path().c_str()) != 0) continue;
    ++count;
    if (!entry_ec) bytes += size;
  }
  if (count == 0) return;
  std::fprintf(stderr,
               "strata: reclaimed %" PRIu64
               " swap files (%s) left by a previous run in %s\n",
               count, HumanBytes(bytes).c_str(), dir.c_str());
}

void UnlockSwapDirectory(const std::string& dir, int lock_fd) {
  unlink((dir + "/" + kLockName).c_str());
  close(lock_fd);
}

std::string SwapFilePath(const std::string& dir, int file) {
  return dir + "/" + kSwapPrefix + std::to_string(file) + kSwapSuffix;
}

}  // namespace strata::tier
