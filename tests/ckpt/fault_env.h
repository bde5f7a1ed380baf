// A ckpt::Env (src/ckpt/env.h) for crash tests: it passes every call to
// another Env (the real one by default), counting the calls of each
// operation, and can fail the nth call of an operation with an errno or
// "crash" there: from that call on it performs nothing, as if the process
// had died, so the files stay as that point left them.
//
// A failed or cut-off call is not performed. It returns FileError's
// wording ("cannot rename '<from>' to '<to>': EIO (...)"), or after a
// crash kIoError saying so; Exists answers false, Type kNone, and
// RemoveTree does nothing. Not thread-safe: the checkpoint code calls it
// from the thread that saves or loads.
//
// Example: a save cut off after moving the previous checkpoint aside.
//   ckpt_test::FaultEnv env;
//   env.CrashAt(ckpt_test::Op::kRename, 2);  // the temporary into place
//   (void)ckpt::Save(engine, residency, options, dir, {}, env);
//   // now: "<dir>.old" and "<dir>.tmp-<pid>", no <dir>
#ifndef STRATA_TESTS_CKPT_FAULT_ENV_H_
#define STRATA_TESTS_CKPT_FAULT_ENV_H_

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/ckpt/env.h"

namespace strata::ckpt_test {

// The operations of ckpt::Env and ckpt::File, each counted on its own.
enum class Op {
  kNewFile,
  kOpenFile,
  kWrite,
  kRead,
  kSize,
  kSync,
  kClose,
  kCreateDir,
  kSyncDir,
  kRename,
  kRemoveTree,
  kExists,
  kType,
  kListDir,
};
inline constexpr int kNumOps = static_cast<int>(Op::kListDir) + 1;

class FaultEnv : public ckpt::Env {
 public:
  explicit FaultEnv(ckpt::Env& base = ckpt::Env::Default()) : base_(base) {}

  // The `nth` call (1 for the first) of `op` fails with `err`.
  void FailAt(Op op, int nth, int err);
  // The `nth` call of `op` and every call after it are cut off; `then`,
  // when set, runs once at that point (a kill test raises SIGKILL there).
  void CrashAt(Op op, int nth, std::function<void()> then = {});

  bool crashed() const { return crashed_; }
  // The call a fault hit, as "rename '<from>' to '<to>'" (the last one).
  const std::string& hit() const { return hit_; }

  // Counts a call of `op` on `path` (and `to`): an error when a fault cuts
  // it off, else OK. For the File of this Env too.
  Status Enter(Op op, const std::string& path, const std::string& to = "");

  Result<std::unique_ptr<ckpt::File>> NewFile(const std::string& path) override;
  Result<std::unique_ptr<ckpt::File>> OpenFile(
      const std::string& path) override;
  Status CreateDir(const std::string& path) override;
  Status SyncDir(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  void RemoveTree(const std::string& path) override;
  bool Exists(const std::string& path) override;
  ckpt::FileType Type(const std::string& path) override;
  Result<std::vector<ckpt::DirEntry>> ListDir(const std::string& path) override;

 private:
  struct Fault {
    Op op;
    int nth;
    int err;  // 0: a crash
    std::function<void()> then;
  };

  ckpt::Env& base_;
  std::vector<Fault> faults_;
  std::array<int, kNumOps> calls_ = {};
  bool crashed_ = false;
  std::string hit_;
};

}  // namespace strata::ckpt_test

#endif  // STRATA_TESTS_CKPT_FAULT_ENV_H_
