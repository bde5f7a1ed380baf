// Env::Default(): the checkpoint code's calls as POSIX calls.
#include "src/ckpt/env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <utility>

#include "strata/aio.h"

namespace strata::ckpt {
namespace {

// FileError of the errno of the call that just failed: reads errno before
// it allocates, so call it right after that call.
Status LastError(const char* verb, const std::string& path,
                 const std::string& to = "") {
  const int err = errno;
  return FileError(err, verb, path, to);
}

class PosixFile : public File {
 public:
  PosixFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;

  Status Write(uint64_t offset, const void* data, uint64_t bytes) override {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return LastError("write", path_);
      p += n;
      offset += static_cast<uint64_t>(n);
      bytes -= static_cast<uint64_t>(n);
    }
    return Status();
  }

  Status Read(uint64_t offset, void* data, uint64_t bytes) override {
    char* p = static_cast<char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd_, p, bytes, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return LastError("read", path_);
      if (n == 0) {
        return Status::DataLoss("'" + path_ + "' ended at byte " +
                                std::to_string(offset) +
                                ": it changed while being loaded");
      }
      p += n;
      offset += static_cast<uint64_t>(n);
      bytes -= static_cast<uint64_t>(n);
    }
    return Status();
  }

  Result<uint64_t> Size() override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return LastError("stat", path_);
    return static_cast<uint64_t>(st.st_size);
  }

  Status Sync() override {
    if (::fsync(fd_) != 0) return LastError("fsync", path_);
    return Status();
  }

  Status Close() override {
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return LastError("close", path_);
    return Status();
  }

 private:
  int fd_;
  const std::string path_;
};

class PosixEnv : public Env {
 public:
  Result<std::unique_ptr<File>> NewFile(const std::string& path) override {
    return Open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                "create");
  }

  Result<std::unique_ptr<File>> OpenFile(const std::string& path) override {
    return Open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW, "open");
  }

  Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) != 0) return LastError("create", path);
    return Status();
  }

  Status SyncDir(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return LastError("open directory", path);
    PosixFile dir(fd, path);
    STRATA_RETURN_IF_ERROR(dir.Sync());
    return dir.Close();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return LastError("rename", from, to);
    }
    return Status();
  }

  void RemoveTree(const std::string& path) override {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }

  bool Exists(const std::string& path) override {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0;
  }

  FileType Type(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return FileType::kNone;
    return S_ISDIR(st.st_mode) ? FileType::kDirectory : FileType::kOther;
  }

  Result<std::vector<DirEntry>> ListDir(const std::string& path) override {
    std::vector<DirEntry> entries;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(path, ec), end;
         !ec && it != end; it.increment(ec)) {
      std::error_code ignored;  // a file that cannot be told is not regular
      entries.push_back(
          {it->path().filename().string(), it->is_regular_file(ignored)});
    }
    if (ec) return FileError(ec.value(), "list", path);
    return entries;
  }

 private:
  static Result<std::unique_ptr<File>> Open(const std::string& path, int flags,
                                            const char* verb) {
    const int fd = ::open(path.c_str(), flags, 0666);  // the umask decides
    if (fd < 0) return LastError(verb, path);
    return std::unique_ptr<File>(new PosixFile(fd, path));
  }
};

}  // namespace

Env& Env::Default() {
  static PosixEnv* env = new PosixEnv;  // never destroyed: used at exit too
  return *env;
}

Status FileError(int err, const std::string& verb, const std::string& path,
                 const std::string& to) {
  std::string what = "cannot " + verb + " '" + path + "'";
  if (!to.empty()) what += " to '" + to + "'";
  return aio::ErrnoStatus(err, what);
}

}  // namespace strata::ckpt
