#include "tests/ckpt/fault_env.h"

#include <iterator>
#include <utility>

namespace strata::ckpt_test {
namespace {

// The verb of FileError's wording for each Op, in the order of Op, as the
// real Env says it.
constexpr const char* kVerbs[] = {
    "create", "open",  "write",  "read",   "stat", "fsync", "close",
    "create", "fsync", "rename", "remove", "stat", "stat",  "list"};
static_assert(std::size(kVerbs) == kNumOps);

const char* Verb(Op op) { return kVerbs[static_cast<int>(op)]; }

// "rename '<from>' to '<to>'", as FileError words the call.
std::string Call(Op op, const std::string& path, const std::string& to) {
  std::string call = std::string(Verb(op)) + " '" + path + "'";
  if (!to.empty()) call += " to '" + to + "'";
  return call;
}

// A file of a FaultEnv: each call enters the Env first.
class FaultFile : public ckpt::File {
 public:
  FaultFile(FaultEnv& env, std::unique_ptr<ckpt::File> base, std::string path)
      : env_(env), base_(std::move(base)), path_(std::move(path)) {}

  Status Write(uint64_t offset, const void* data, uint64_t bytes) override {
    STRATA_RETURN_IF_ERROR(env_.Enter(Op::kWrite, path_));
    return base_->Write(offset, data, bytes);
  }
  Status Read(uint64_t offset, void* data, uint64_t bytes) override {
    STRATA_RETURN_IF_ERROR(env_.Enter(Op::kRead, path_));
    return base_->Read(offset, data, bytes);
  }
  Result<uint64_t> Size() override {
    STRATA_RETURN_IF_ERROR(env_.Enter(Op::kSize, path_));
    return base_->Size();
  }
  Status Sync() override {
    STRATA_RETURN_IF_ERROR(env_.Enter(Op::kSync, path_));
    return base_->Sync();
  }
  Status Close() override {
    STRATA_RETURN_IF_ERROR(env_.Enter(Op::kClose, path_));
    return base_->Close();
  }

 private:
  FaultEnv& env_;
  std::unique_ptr<ckpt::File> base_;
  std::string path_;
};

}  // namespace

void FaultEnv::FailAt(Op op, int nth, int err) {
  faults_.push_back({op, nth, err, {}});
}

void FaultEnv::CrashAt(Op op, int nth, std::function<void()> then) {
  faults_.push_back({op, nth, 0, std::move(then)});
}

Status FaultEnv::Enter(Op op, const std::string& path, const std::string& to) {
  const int nth = ++calls_[static_cast<int>(op)];
  for (const Fault& f : faults_) {
    if (crashed_ || f.op != op || f.nth != nth) continue;
    hit_ = Call(op, path, to);
    if (f.err != 0) return ckpt::FileError(f.err, Verb(op), path, to);
    crashed_ = true;
    if (f.then) f.then();
  }
  if (crashed_) {
    return Status::IoError("cut off: " + Call(op, path, to) +
                           " (the test's Env crashed)");
  }
  return Status();
}

Result<std::unique_ptr<ckpt::File>> FaultEnv::NewFile(const std::string& path) {
  STRATA_RETURN_IF_ERROR(Enter(Op::kNewFile, path));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ckpt::File> file,
                          base_.NewFile(path));
  return std::unique_ptr<ckpt::File>(
      new FaultFile(*this, std::move(file), path));
}

Result<std::unique_ptr<ckpt::File>> FaultEnv::OpenFile(
    const std::string& path) {
  STRATA_RETURN_IF_ERROR(Enter(Op::kOpenFile, path));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ckpt::File> file,
                          base_.OpenFile(path));
  return std::unique_ptr<ckpt::File>(
      new FaultFile(*this, std::move(file), path));
}

Status FaultEnv::CreateDir(const std::string& path) {
  STRATA_RETURN_IF_ERROR(Enter(Op::kCreateDir, path));
  return base_.CreateDir(path);
}

Status FaultEnv::SyncDir(const std::string& path) {
  STRATA_RETURN_IF_ERROR(Enter(Op::kSyncDir, path));
  return base_.SyncDir(path);
}

Status FaultEnv::Rename(const std::string& from, const std::string& to) {
  STRATA_RETURN_IF_ERROR(Enter(Op::kRename, from, to));
  return base_.Rename(from, to);
}

void FaultEnv::RemoveTree(const std::string& path) {
  if (Enter(Op::kRemoveTree, path).ok()) base_.RemoveTree(path);
}

bool FaultEnv::Exists(const std::string& path) {
  return Enter(Op::kExists, path).ok() && base_.Exists(path);
}

ckpt::FileType FaultEnv::Type(const std::string& path) {
  if (!Enter(Op::kType, path).ok()) return ckpt::FileType::kNone;
  return base_.Type(path);
}

Result<std::vector<ckpt::DirEntry>> FaultEnv::ListDir(const std::string& path) {
  STRATA_RETURN_IF_ERROR(Enter(Op::kListDir, path));
  return base_.ListDir(path);
}

}  // namespace strata::ckpt_test
