// The file system as the checkpoint code (src/ckpt/checkpoint.cc) sees it,
// as leveldb's Env: exactly the operations Save and Load make, behind an
// interface. Env::Default() is the real one (POSIX); a test passes its own
// (tests/ckpt/fault_env.h) to fail or cut off one operation directly.
//
// Contract
// - Paths are used as spelled: nothing is resolved or created on the way.
// - Every failure is a Status worded "cannot <verb> '<path>'[ to '<to>']:
//   <errno text>[; advice]", its code from the errno (FileError builds it,
//   so that a test's Env words its failures as the real one does). Nothing
//   throws.
// - Ownership: a File closes itself when destroyed, and a failure of that
//   close is lost: call Close() to see it. Env::Default() lives as long as
//   the process.
// - Thread safety: Env::Default() may be called from any thread; a File is
//   used by one thread at a time.
//
// Example (the shape of a save: write, fsync, then rename into place)
//   Env& env = Env::Default();
//   STRATA_RETURN_IF_ERROR(env.CreateDir(tmp));
//   STRATA_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
//                           env.NewFile(tmp + "/data.bin"));
//   STRATA_RETURN_IF_ERROR(file->Write(0, bytes.data(), bytes.size()));
//   STRATA_RETURN_IF_ERROR(file->Sync());
//   STRATA_RETURN_IF_ERROR(file->Close());
//   STRATA_RETURN_IF_ERROR(env.SyncDir(tmp));
//   STRATA_RETURN_IF_ERROR(env.Rename(tmp, dir));
#ifndef STRATA_SRC_CKPT_ENV_H_
#define STRATA_SRC_CKPT_ENV_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::ckpt {

// An open file.
class File {
 public:
  virtual ~File() = default;
  // Writes all `bytes` at `offset`, going on after a short write.
  virtual Status Write(uint64_t offset, const void* data, uint64_t bytes) = 0;
  // Reads exactly `bytes` at `offset`; a file that ends first is kDataLoss.
  virtual Status Read(uint64_t offset, void* data, uint64_t bytes) = 0;
  virtual Result<uint64_t> Size() = 0;
  // fsync: what was written survives a crash of the machine.
  virtual Status Sync() = 0;
  // No call may follow, whatever it returns.
  virtual Status Close() = 0;
};

// What a path names, following symbolic links.
enum class FileType { kNone, kDirectory, kOther };

struct DirEntry {
  std::string name;           // without the directory
  bool regular_file = false;  // following a symbolic link
};

class Env {
 public:
  virtual ~Env() = default;
  // The real file system.
  static Env& Default();

  // A new file, for writing; fails (EEXIST) when `path` exists.
  virtual Result<std::unique_ptr<File>> NewFile(const std::string& path) = 0;
  // An existing file, for reading; kNotFound when `path` does not exist.
  virtual Result<std::unique_ptr<File>> OpenFile(const std::string& path) = 0;
  // A new directory (mode 0755) in an existing parent.
  virtual Status CreateDir(const std::string& path) = 0;
  // fsync of a directory: the entries created or renamed in it survive a
  // crash of the machine.
  virtual Status SyncDir(const std::string& path) = 0;
  // rename(2).
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Removes `path` and all below it as far as it can, ignoring errors: the
  // checkpoint code removes only what is stale.
  virtual void RemoveTree(const std::string& path) = 0;
  // Whether an entry of that name exists (a symbolic link does, even one
  // to nothing).
  virtual bool Exists(const std::string& path) = 0;
  // What `path` names; kNone also when it cannot be told (stat(2) fails).
  virtual FileType Type(const std::string& path) = 0;
  // The entries of a directory, without "." and "..", in no set order.
  virtual Result<std::vector<DirEntry>> ListDir(const std::string& path) = 0;
};

// The failure of the call `verb` on `path` (and `to`) with `err`, worded
// as the contract says.
Status FileError(int err, const std::string& verb, const std::string& path,
                 const std::string& to = "");

}  // namespace strata::ckpt

#endif  // STRATA_SRC_CKPT_ENV_H_
