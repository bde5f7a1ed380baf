// errno -> Status translation for strata_aio. Every failure that carries an
// errno passes through here, so the wording and the advice stay consistent.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "aio/internal.h"
#include "common/text.h"

namespace strata::aio::internal {
namespace {

StatusCode CodeFor(int err) {
  switch (err) {
    case ENOENT:
      return StatusCode::kNotFound;
    case EACCES:
    case EPERM:
    case EROFS:
      return StatusCode::kPermissionDenied;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return StatusCode::kNoSpace;
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return StatusCode::kResourceExhausted;
    case EINVAL:
    case EFAULT:
    case EBADF:
    case EISDIR:
    case ENOTDIR:
      return StatusCode::kInvalidArgument;
    case ENODATA:
      return StatusCode::kDataLoss;
    case ENOSYS:
    case EOPNOTSUPP:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kIoError;
  }
}

// What the user can do about `err`, or "" when there is nothing specific.
std::string AdviceFor(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return "the file system is full (or over quota): free space there or "
             "point strata at a directory with room";
    case EFBIG:
      return "the file is larger than this file system (or RLIMIT_FSIZE) "
             "allows: spread the swap over more, smaller files (swap_files) "
             "or use a file system that takes larger files";
    case EROFS:
      return "the file system is mounted read-only: choose a writable "
             "directory";
    case EACCES:
    case EPERM:
      return "make the directory writable by this user or choose another one";
    case EIO:
      return "the device reported a failure: check `dmesg` and the drive's "
             "health (smartctl / nvme smart-log)";
    case EINVAL:
      return "for O_DIRECT files the buffer address, offset and length must "
             "be aligned to the file system's direct-I/O alignment";
    case ENODATA:
      return "the read reached the end of the file: the file is shorter "
             "than the request";
    default:
      return "";
  }
}

}  // namespace

}  // namespace strata::aio::internal

namespace strata::aio {

Status ErrnoStatus(int err, const std::string& what) {
  std::string msg = what + ": " + ErrnoText(err);
  const std::string advice = internal::AdviceFor(err);
  if (!advice.empty()) msg += "; " + advice;
  return Status(internal::CodeFor(err), std::move(msg));
}

}  // namespace strata::aio

namespace strata::aio::internal {

Status IoStatus(int err, bool write, const std::string& path, uint64_t offset,
                uint64_t len) {
  std::string msg = write ? "write of " : "read of ";
  msg += std::to_string(len) + " bytes at offset " + std::to_string(offset) +
         (write ? " to '" : " from '") + path + "' failed: " + ErrnoText(err);
  const std::string advice = AdviceFor(err);
  if (!advice.empty()) msg += "; " + advice;
  return Status(CodeFor(err), std::move(msg));
}

Status SyncStatus(int err, const std::string& path) {
  return ErrnoStatus(err, "fdatasync of '" + path + "' failed");
}

}  // namespace strata::aio::internal
