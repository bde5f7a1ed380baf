// Engine::Save and Engine::Load: the protocol of Note [Checkpoint crash
// safety] around the streaming of Note [Checkpoint format].
#include "src/ckpt/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include "src/ckpt/manifest.h"
#include "strata/aio.h"

namespace strata::ckpt {
namespace {

std::atomic<SaveStageHook> stage_hook{nullptr};

void Reached(SaveStage stage) {
  if (SaveStageHook hook = stage_hook.load()) hook(stage);
}

// Load verifies files in reads of this size: the only buffer it holds.
constexpr size_t kVerifyBuffer = size_t{1} << 20;

// A file descriptor closed on destruction (errors of an explicit Close()
// are reported; those of the destructor's close are moot).
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// "cannot <verb> '<path>'[ to '<to>']: <errno>". Reads errno before it
// allocates, so call it right after the failed call.
Status Errno(const char* verb, const std::string& path,
             const std::string& to = "") {
  const int err = errno;
  std::string what = std::string("cannot ") + verb + " '" + path + "'";
  if (!to.empty()) what += " to '" + to + "'";
  return aio::ErrnoStatus(err, what);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

using Hasher = std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)>;

Hasher NewHasher() {
  Hasher h(XXH3_createState(), &XXH3_freeState);
  STRATA_CHECK(h != nullptr && XXH3_64bits_reset(h.get()) == XXH_OK);
  return h;
}

Status WriteAt(int fd, const void* data, uint64_t bytes, uint64_t offset,
               const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("write", path);
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<uint64_t>(n);
  }
  return Status();
}

// Reads exactly `bytes`; a file that ends first is kDataLoss.
Status ReadAt(int fd, void* data, uint64_t bytes, uint64_t offset,
              const std::string& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("read", path);
    if (n == 0) {
      return Status::DataLoss("'" + path + "' ended at byte " +
                              std::to_string(offset) +
                              ": it changed while being loaded");
    }
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<uint64_t>(n);
  }
  return Status();
}

// fsync, then close, of a file or directory written by Save.
Status SyncAndClose(Fd& fd, const std::string& path) {
  if (::fsync(fd.get()) != 0) return Errno("fsync", path);
  if (fd.Close() != 0) return Errno("close", path);
  return Status();
}

Status SyncDir(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.ok()) return Errno("open directory", path);
  return SyncAndClose(fd, path);
}

void RemoveTree(const std::string& path) {
  std::error_code ignored;  // what is left is stale and removed next time
  std::filesystem::remove_all(path, ignored);
}

// The names of Note [Checkpoint crash safety].
struct Paths {
  std::string dir, parent, tmp, old;
  std::string tmp_name;  // "<name of dir>.tmp-", the temporaries' prefix
};

Result<Paths> MakePaths(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (dir.empty() || dir == "/") {
    return Status::InvalidArgument(
        "a checkpoint needs a directory path other than '" + dir + "'");
  }
  Paths p;
  p.parent = std::filesystem::path(dir).parent_path().string();
  if (p.parent.empty()) p.parent = ".";
  p.tmp_name = std::filesystem::path(dir).filename().string() + ".tmp-";
  p.tmp = dir + ".tmp-" + std::to_string(::getpid());
  p.old = dir + ".old";
  p.dir = std::move(dir);
  return p;
}

Status CheckIdle(Engine& engine, const store::Residency& residency,
                 const std::string& call) {
  if (residency.in_step()) {
    return Status::FailedPrecondition(
        call +
        " inside a step would put its fetches in the trace; "
        "call it after EndStep()");
  }
  if (const int g = residency.FirstPinnedGroup(); g >= 0) {
    return Status::FailedPrecondition("group '" + residency.layout(g).name +
                                      "' is fetched; " + call +
                                      " needs every group released first");
  }
  if (Status s = engine.Drain(); !s.ok()) {
    return Status(s.code(), "a background transfer failed before " + call +
                                ": " + s.message());
  }
  return Status();
}

// ---- Save ----------------------------------------------------------------

// Whether `entry` is a file that Save writes into a checkpoint.
bool IsCheckpointFile(const std::filesystem::directory_entry& entry) {
  const std::string name = entry.path().filename().string();
  std::error_code ec;
  return entry.is_regular_file(ec) &&
         (name == kManifestName || IsGroupFileName(name));
}

// Save replaces `dir` only when it is missing, empty or holds nothing but
// a checkpoint's own files: removing it must not take a user's files along.
Status CheckReplaceable(const Paths& p) {
  struct stat st;
  if (::stat(p.dir.c_str(), &st) != 0) return Status();
  const std::string refused = "; Save does not replace it: ";
  std::error_code ec;
  if (!S_ISDIR(st.st_mode) || (!Exists(p.dir + "/" + kManifestName) &&
                               !std::filesystem::is_empty(p.dir, ec))) {
    return Status::FailedPrecondition(
        "'" + p.dir + "' exists and is not a strata checkpoint (no " +
        kManifestName + ")" + refused + "choose another path or remove it");
  }
  std::filesystem::directory_iterator it(p.dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (IsCheckpointFile(*it)) continue;
    return Status::FailedPrecondition(
        "the checkpoint '" + p.dir + "' also holds '" +
        it->path().filename().string() + "', which Save did not write" +
        refused + "move it out or choose another path");
  }
  if (ec) {
    return Status::FailedPrecondition("cannot list '" + p.dir + "' (" +
                                      ec.message() + ")" + refused +
                                      "it checks what it holds first");
  }
  return Status();
}

// Makes way for the temporary directory: refuses a `dir` that Save may not
// replace, removes temporaries of saves that died, creates ours.
Status PrepareTemp(const Paths& p) {
  struct stat st;
  if (::stat(p.parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::NotFound("cannot save to '" + p.dir +
                            "': its parent directory '" + p.parent +
                            "' does not exist; create it first");
  }
  STRATA_RETURN_IF_ERROR(CheckReplaceable(p));
  std::error_code ec;
  for (std::filesystem::directory_iterator it(p.parent, ec), end;
       !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(p.tmp_name, 0) != 0) continue;
    pid_t pid = 0;
    const char* digits = name.data() + p.tmp_name.size();
    const auto [last, err] =
        std::from_chars(digits, name.data() + name.size(), pid);
    if (err != std::errc() || last != name.data() + name.size() || pid <= 0) {
      continue;
    }
    if (pid == ::getpid() || (::kill(pid, 0) != 0 && errno == ESRCH)) {
      RemoveTree(it->path().string());
    }
  }
  if (::mkdir(p.tmp.c_str(), 0755) != 0) {
    return Errno("create", p.tmp);
  }
  return Status();
}

// Fetches each of `roles` of group `g` to the host in turn (for writing
// when `write`), outside the trace, hands its view to `use` and releases
// it: so a checkpoint holds at most one role of one group at a time.
template <typename Use>
Status ForEachRole(Engine& engine, int g, RoleMask roles, bool write, Use use) {
  for (int r = 0; r < kNumRoles; ++r) {
    const Role role = static_cast<Role>(r);
    if ((roles & RoleBit(role)) == 0) continue;
    STRATA_ASSIGN_OR_RETURN(
        GroupView view,
        engine.Fetch(g, Tier::kHost, {RoleBit(role), write, false}));
    const Status s = use(role, view);
    const Status released = engine.Release(g);
    if (!s.ok()) return s;
    if (!released.ok()) return released;
  }
  return Status();
}

// Streams group `g`'s roles, one at a time through the host tier, into
// `path`; sets entry.xxh3.
Status WriteGroup(Engine& engine, int g, const std::string& path,
                  GroupEntry& entry) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.ok()) return Errno("create", path);
  Hasher hasher = NewHasher();
  Status s = ForEachRole(
      engine, g, entry.roles, false, [&](Role role, const GroupView& view) {
        for (const TensorEntry& t : entry.tensors) {
          if ((t.roles & RoleBit(role)) == 0) continue;
          const TensorView* data = view.Find(t.name, role);
          STRATA_CHECK(data != nullptr && data->bytes == RoleBytes(t, role));
          STRATA_RETURN_IF_ERROR(WriteAt(fd.get(), data->data, data->bytes,
                                         t.offset[static_cast<int>(role)],
                                         path));
          XXH3_64bits_update(hasher.get(), data->data, data->bytes);
        }
        return Status();
      });
  if (!s.ok()) return s;
  entry.xxh3 = XXH3_64bits_digest(hasher.get());
  return SyncAndClose(fd, path);
}

Status WriteManifest(const std::string& path, const std::string& text) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.ok()) return Errno("create", path);
  STRATA_RETURN_IF_ERROR(WriteAt(fd.get(), text.data(), text.size(), 0, path));
  return SyncAndClose(fd, path);
}

// Everything of Note [Checkpoint format] into the temporary directory.
Status WriteTemp(Engine& engine, const EngineOptions& options, const Paths& p,
                 Manifest& manifest) {
  for (size_t g = 0; g < manifest.groups.size(); ++g) {
    GroupEntry& entry = manifest.groups[g];
    STRATA_RETURN_IF_ERROR(WriteGroup(engine, static_cast<int>(g),
                                      p.tmp + "/" + entry.file, entry));
    Reached(SaveStage::kDataFileWritten);
  }
  STRATA_ASSIGN_OR_RETURN(std::string text,
                          ManifestText(manifest, options, engine.info()));
  STRATA_RETURN_IF_ERROR(WriteManifest(p.tmp + "/" + kManifestName, text));
  STRATA_RETURN_IF_ERROR(SyncDir(p.tmp));
  Reached(SaveStage::kTempComplete);
  return Status();
}

// The failure `s` of a save, saying what became of the previous one.
Status Kept(const Status& s, const Paths& p) {
  std::string where = "; nothing was written at '" + p.dir + "'";
  if (Exists(p.dir)) {
    where = "; the previous checkpoint at '" + p.dir + "' is kept";
  } else if (Exists(p.old)) {
    where = "; the previous checkpoint at '" + p.old +
            "' is kept (Load restores it)";
  }
  return Status(s.code(), s.message() + where);
}

// Moves the complete temporary into place; see Note [Checkpoint crash
// safety] for the states a crash between the steps leaves.
Status Replace(const Paths& p) {
  if (Exists(p.dir)) {
    RemoveTree(p.old);  // stale: `dir` exists, so it is the newest
    if (::rename(p.dir.c_str(), p.old.c_str()) != 0) {
      return Kept(Errno("rename", p.dir, p.old), p);
    }
    Reached(SaveStage::kOldMovedAside);
  }
  if (::rename(p.tmp.c_str(), p.dir.c_str()) != 0) {
    const Status s = Errno("rename", p.tmp, p.dir);
    if (Exists(p.old)) (void)::rename(p.old.c_str(), p.dir.c_str());
    return Kept(s, p);
  }
  Reached(SaveStage::kNewInPlace);
  if (Status s = SyncDir(p.parent); !s.ok()) {
    return Status(s.code(), s.message() + "; the new checkpoint is at '" +
                                p.dir +
                                "' but may not survive a crash of "
                                "the machine: save again");
  }
  RemoveTree(p.old);
  return Status();
}

// ---- Load ----------------------------------------------------------------

// A missing `dir` with "<dir>.old" beside it is a save cut off after
// moving the old checkpoint aside: rename it back.
Status RecoverInterrupted(const Paths& p, bool* recovered) {
  if (Exists(p.dir)) return Status();
  if (!Exists(p.old)) {
    return Status::NotFound("checkpoint directory '" + p.dir +
                            "' does not exist; check the path");
  }
  if (::rename(p.old.c_str(), p.dir.c_str()) != 0) {
    return Errno("rename", p.old, p.dir);
  }
  STRATA_RETURN_IF_ERROR(SyncDir(p.parent));
  std::fprintf(stderr,
               "strata: checkpoint '%s' was missing: a save was cut off; "
               "restored the previous one from '%s'\n",
               p.dir.c_str(), p.old.c_str());
  *recovered = true;
  return Status();
}

Result<Manifest> ReadManifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifestName;
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.ok() && errno == ENOENT) {
    return Status::NotFound("'" + dir +
                            "' is not a strata checkpoint: it has no " +
                            kManifestName + "; check the path");
  }
  if (!fd.ok()) return Errno("open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Errno("stat", path);
  std::string text(static_cast<size_t>(st.st_size), '\0');
  STRATA_RETURN_IF_ERROR(ReadAt(fd.get(), text.data(), text.size(), 0, path));
  return ParseManifest(text, path);
}

// Size and XXH3 of one data file against the manifest.
Status VerifyFile(const std::string& path, const GroupEntry& entry,
                  std::vector<char>& buffer) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.ok() && errno == ENOENT) {
    return Damaged("data file '" + path + "' is missing");
  }
  if (!fd.ok()) return Errno("open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Errno("stat", path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size != entry.bytes) {
    return Damaged("'" + path + "' is " +
                   (size < entry.bytes ? "truncated" : "too long") + " (has " +
                   std::to_string(size) + " bytes, manifest says " +
                   std::to_string(entry.bytes) + ")");
  }
  Hasher hasher = NewHasher();
  for (uint64_t at = 0; at < size; at += buffer.size()) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), size - at);
    STRATA_RETURN_IF_ERROR(ReadAt(fd.get(), buffer.data(), n, at, path));
    XXH3_64bits_update(hasher.get(), buffer.data(), n);
  }
  const uint64_t actual = XXH3_64bits_digest(hasher.get());
  if (actual != entry.xxh3) {
    char hex[64];
    std::snprintf(hex, sizeof(hex), "xxh3 %016llx, manifest says %016llx",
                  static_cast<unsigned long long>(actual),
                  static_cast<unsigned long long>(entry.xxh3));
    return Damaged("checksum mismatch in '" + path + "' (" + hex + ")");
  }
  return Status();
}

// Reads group `g`'s file into the engine, one role at a time through the
// host tier; adds the bytes read to `*bytes`.
Status LoadGroup(Engine& engine, int g, const std::string& path,
                 const GroupEntry& entry, uint64_t* bytes) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.ok()) return Errno("open", path);
  return ForEachRole(
      engine, g, entry.roles, true, [&](Role role, const GroupView& view) {
        for (const TensorView& t : view.tensors) {
          const TensorEntry* saved = entry.Find(t.name);
          STRATA_CHECK(saved != nullptr && t.bytes == RoleBytes(*saved, role));
          STRATA_RETURN_IF_ERROR(ReadAt(fd.get(), t.data, t.bytes,
                                        saved->offset[static_cast<int>(role)],
                                        path));
          *bytes += t.bytes;
        }
        return Status();
      });
}

}  // namespace

void SetSaveStageHookForTesting(SaveStageHook hook) { stage_hook = hook; }

Status Save(Engine& engine, const store::Residency& residency,
            const EngineOptions& options, const std::string& dir,
            const SaveOptions& save) {
  STRATA_ASSIGN_OR_RETURN(Paths paths, MakePaths(dir));
  STRATA_RETURN_IF_ERROR(CheckIdle(engine, residency, "Save"));
  Manifest manifest;
  manifest.format_version = kFormatVersion;
  manifest.steps = engine.stats().steps;
  manifest.user_state = save.user_state;
  for (int g = 0; g < residency.group_count(); ++g) {
    manifest.groups.push_back(DescribeGroup(g, residency.layout(g)));
  }
  // What JSON cannot hold fails now, before any data is written.
  if (auto text = ManifestText(manifest, options, engine.info()); !text.ok()) {
    return text.status();
  }
  STRATA_RETURN_IF_ERROR(PrepareTemp(paths));
  if (Status s = WriteTemp(engine, options, paths, manifest); !s.ok()) {
    RemoveTree(paths.tmp);
    return Kept(s, paths);
  }
  const Status s = Replace(paths);
  if (!s.ok()) RemoveTree(paths.tmp);
  return s;
}

Status Load(Engine& engine, const store::Residency& residency,
            const std::string& dir, LoadResult* result,
            const UserStateCheck& check) {
  STRATA_ASSIGN_OR_RETURN(Paths paths, MakePaths(dir));
  STRATA_RETURN_IF_ERROR(CheckIdle(engine, residency, "Load"));
  bool recovered = false;
  STRATA_RETURN_IF_ERROR(RecoverInterrupted(paths, &recovered));
  STRATA_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(paths.dir));
  if (Status s = MatchEngine(manifest, residency); !s.ok()) {
    return Status(s.code(), "checkpoint '" + paths.dir +
                                "' does not fit this engine: " + s.message() +
                                "; register the groups and tensors it was "
                                "saved from");
  }
  if (check) {
    if (Status s = check(manifest.user_state); !s.ok()) {
      return Status(s.code(), "checkpoint '" + paths.dir + "': " + s.message() +
                                  "; nothing was loaded");
    }
  }
  std::vector<char> buffer(kVerifyBuffer);
  for (const GroupEntry& g : manifest.groups) {
    STRATA_RETURN_IF_ERROR(VerifyFile(paths.dir + "/" + g.file, g, buffer));
  }
  uint64_t bytes = 0;
  for (size_t g = 0; g < manifest.groups.size(); ++g) {
    const GroupEntry& entry = manifest.groups[g];
    if (Status s = LoadGroup(engine, static_cast<int>(g),
                             paths.dir + "/" + entry.file, entry, &bytes);
        !s.ok()) {
      return Status(s.code(), s.message() +
                                  "; the engine's data is now partly "
                                  "loaded: load again before using it");
    }
  }
  if (result != nullptr) {
    *result = {std::move(manifest.user_state), manifest.format_version,
               manifest.steps, bytes, recovered};
  }
  return Status();
}

}  // namespace strata::ckpt
