// Engine::Save and Engine::Load: the protocol of Note [Checkpoint crash
// safety] around the streaming of Note [Checkpoint format].
#include "src/ckpt/checkpoint.h"

#include <signal.h>
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

namespace strata::ckpt {

using store::TensorBytes;

namespace {

std::atomic<SaveStageHook> stage_hook{nullptr};

void Reached(SaveStage stage) {
  if (SaveStageHook hook = stage_hook.load()) hook(stage);
}

// Load verifies files in reads of this size: the only buffer it holds.
constexpr size_t kVerifyBuffer = size_t{1} << 20;

using Hasher = std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)>;

Hasher NewHasher() {
  Hasher h(XXH3_createState(), &XXH3_freeState);
  STRATA_CHECK(h != nullptr && XXH3_64bits_reset(h.get()) == XXH_OK);
  return h;
}

// fsync, then close, of a file written by Save.
Status SyncAndClose(File& file) {
  STRATA_RETURN_IF_ERROR(file.Sync());
  return file.Close();
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
bool IsCheckpointFile(const DirEntry& entry) {
  return entry.regular_file &&
         (entry.name == kManifestName || IsGroupFileName(entry.name));
}

// Save replaces `dir` only when it is missing, empty or holds nothing but
// a checkpoint's own files: removing it must not take a user's files along.
Status CheckReplaceable(Env& env, const Paths& p) {
  const FileType type = env.Type(p.dir);
  if (type == FileType::kNone) return Status();
  const std::string refused = "; Save does not replace it: ";
  Result<std::vector<DirEntry>> entries = env.ListDir(p.dir);
  if (type != FileType::kDirectory ||
      (!env.Exists(p.dir + "/" + kManifestName) &&
       (!entries.ok() || !entries->empty()))) {
    return Status::FailedPrecondition(
        "'" + p.dir + "' exists and is not a strata checkpoint (no " +
        kManifestName + ")" + refused + "choose another path or remove it");
  }
  if (!entries.ok()) {
    return Status::FailedPrecondition(entries.status().message() + refused +
                                      "it checks what it holds first");
  }
  for (const DirEntry& entry : *entries) {
    if (IsCheckpointFile(entry)) continue;
    return Status::FailedPrecondition("the checkpoint '" + p.dir +
                                      "' also holds '" + entry.name +
                                      "', which Save did not write" + refused +
                                      "move it out or choose another path");
  }
  return Status();
}

// Whether the entry `name` of the parent is a temporary of this process
// or of a save whose process is gone.
bool IsStaleTemp(const std::string& name, const Paths& p) {
  if (name.rfind(p.tmp_name, 0) != 0) return false;
  pid_t pid = 0;
  const char* digits = name.data() + p.tmp_name.size();
  const auto [last, err] =
      std::from_chars(digits, name.data() + name.size(), pid);
  if (err != std::errc() || last != name.data() + name.size() || pid <= 0) {
    return false;
  }
  return pid == ::getpid() || (::kill(pid, 0) != 0 && errno == ESRCH);
}

// Makes way for the temporary directory: refuses a `dir` that Save may not
// replace, removes temporaries of saves that died, creates ours.
Status PrepareTemp(Env& env, const Paths& p) {
  if (env.Type(p.parent) != FileType::kDirectory) {
    return Status::NotFound("cannot save to '" + p.dir +
                            "': its parent directory '" + p.parent +
                            "' does not exist; create it first");
  }
  STRATA_RETURN_IF_ERROR(CheckReplaceable(env, p));
  // A parent that cannot be listed leaves stale temporaries, no more.
  if (Result<std::vector<DirEntry>> entries = env.ListDir(p.parent);
      entries.ok()) {
    for (const DirEntry& entry : *entries) {
      if (IsStaleTemp(entry.name, p)) {
        env.RemoveTree(p.parent + "/" + entry.name);
      }
    }
  }
  return env.CreateDir(p.tmp);
}

// How ForEachRole fetches: to read, or to overwrite every tensor byte (a
// discard fetch: nothing is read first).
enum class Access { kRead, kOverwrite };

// Fetches each of `roles` of group `g` to the host in turn, outside the
// trace, hands its view to `use` and releases it: so a checkpoint holds at
// most one role of one group at a time.
template <typename Use>
Status ForEachRole(Engine& engine, int g, RoleMask roles, Access access,
                   Use use) {
  const bool write = access == Access::kOverwrite;
  for (int r = 0; r < kNumRoles; ++r) {
    const Role role = static_cast<Role>(r);
    if ((roles & RoleBit(role)) == 0) continue;
    STRATA_ASSIGN_OR_RETURN(GroupView view,
                            engine.Fetch(g, Tier::kHost,
                                         {.roles = RoleBit(role),
                                          .write = write,
                                          .discard = write,
                                          .record = false}));
    const Status s = use(role, view);
    const Status released = view.pin.Release();
    if (!s.ok()) return s;
    if (!released.ok()) return released;
  }
  return Status();
}

// Streams group `g`'s roles, one at a time through the host tier, into
// `path`; sets entry.xxh3.
Status WriteGroup(Env& env, Engine& engine, int g, const std::string& path,
                  GroupEntry& entry) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env.NewFile(path));
  Hasher hasher = NewHasher();
  Status s = ForEachRole(
      engine, g, entry.roles, Access::kRead,
      [&](Role role, const GroupView& view) {
        for (const TensorEntry& t : entry.tensors) {
          if ((t.roles & RoleBit(role)) == 0) continue;
          const TensorView* data = view.Find(t.name, role);
          STRATA_CHECK(data != nullptr && data->bytes == TensorBytes(t, role));
          STRATA_RETURN_IF_ERROR(
              file->Write(t.offset[role], data->data, data->bytes));
          XXH3_64bits_update(hasher.get(), data->data, data->bytes);
        }
        return Status();
      });
  if (!s.ok()) return s;
  entry.xxh3 = XXH3_64bits_digest(hasher.get());
  return SyncAndClose(*file);
}

Status WriteManifest(Env& env, const std::string& path,
                     const std::string& text) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env.NewFile(path));
  STRATA_RETURN_IF_ERROR(file->Write(0, text.data(), text.size()));
  return SyncAndClose(*file);
}

// Everything of Note [Checkpoint format] into the temporary directory.
Status WriteTemp(Env& env, Engine& engine, const EngineOptions& options,
                 const Paths& p, Manifest& manifest) {
  for (size_t g = 0; g < manifest.groups.size(); ++g) {
    GroupEntry& entry = manifest.groups[g];
    STRATA_RETURN_IF_ERROR(WriteGroup(env, engine, static_cast<int>(g),
                                      p.tmp + "/" + entry.file, entry));
    Reached(SaveStage::kDataFileWritten);
  }
  STRATA_ASSIGN_OR_RETURN(std::string text,
                          ManifestText(manifest, options, engine.info()));
  STRATA_RETURN_IF_ERROR(WriteManifest(env, p.tmp + "/" + kManifestName, text));
  return env.SyncDir(p.tmp);
}

// The failure `s` of a save, saying what became of the previous one.
Status Kept(Env& env, const Status& s, const Paths& p) {
  std::string where = "; nothing was written at '" + p.dir + "'";
  if (env.Exists(p.dir)) {
    where = "; the previous checkpoint at '" + p.dir + "' is kept";
  } else if (env.Exists(p.old)) {
    where = "; the previous checkpoint at '" + p.old +
            "' is kept (Load restores it)";
  }
  return Status(s.code(), s.message() + where);
}

// Moves the complete temporary into place; see Note [Checkpoint crash
// safety] for the states a crash between the steps leaves.
Status Replace(Env& env, const Paths& p) {
  if (env.Exists(p.dir)) {
    env.RemoveTree(p.old);  // stale: `dir` exists, so it is the newest
    if (Status s = env.Rename(p.dir, p.old); !s.ok()) return Kept(env, s, p);
    Reached(SaveStage::kOldMovedAside);
  }
  if (Status s = env.Rename(p.tmp, p.dir); !s.ok()) {
    if (env.Exists(p.old)) (void)env.Rename(p.old, p.dir);
    return Kept(env, s, p);
  }
  if (Status s = env.SyncDir(p.parent); !s.ok()) {
    return Status(s.code(), s.message() + "; the new checkpoint is at '" +
                                p.dir +
                                "' but may not survive a crash of "
                                "the machine: save again");
  }
  env.RemoveTree(p.old);
  return Status();
}

// ---- Load ----------------------------------------------------------------

// A missing `dir` with "<dir>.old" beside it is a save cut off after
// moving the old checkpoint aside: rename it back.
Status RecoverInterrupted(Env& env, const Paths& p, bool* recovered) {
  if (env.Exists(p.dir)) return Status();
  if (!env.Exists(p.old)) {
    return Status::NotFound("checkpoint directory '" + p.dir +
                            "' does not exist; check the path");
  }
  STRATA_RETURN_IF_ERROR(env.Rename(p.old, p.dir));
  STRATA_RETURN_IF_ERROR(env.SyncDir(p.parent));
  std::fprintf(stderr,
               "strata: checkpoint '%s' was missing: a save was cut off; "
               "restored the previous one from '%s'\n",
               p.dir.c_str(), p.old.c_str());
  *recovered = true;
  return Status();
}

// Env::OpenFile, with a missing file the error `missing`.
Result<std::unique_ptr<File>> OpenOr(Env& env, const std::string& path,
                                     const Status& missing) {
  Result<std::unique_ptr<File>> file = env.OpenFile(path);
  if (!file.ok() && file.status().code() == StatusCode::kNotFound) {
    return missing;
  }
  return file;
}

Result<Manifest> ReadManifest(Env& env, const std::string& dir) {
  const std::string path = dir + "/" + kManifestName;
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<File> file,
      OpenOr(env, path,
             Status::NotFound("'" + dir +
                              "' is not a strata checkpoint: it has no " +
                              kManifestName + "; check the path")));
  STRATA_ASSIGN_OR_RETURN(const uint64_t size, file->Size());
  std::string text(static_cast<size_t>(size), '\0');
  STRATA_RETURN_IF_ERROR(file->Read(0, text.data(), text.size()));
  return ParseManifest(text, path);
}

// Size and XXH3 of one data file against the manifest.
Status VerifyFile(Env& env, const std::string& path, const GroupEntry& entry,
                  std::vector<char>& buffer) {
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<File> file,
      OpenOr(env, path, Damaged("data file '" + path + "' is missing")));
  STRATA_ASSIGN_OR_RETURN(const uint64_t size, file->Size());
  if (size != entry.bytes) {
    return Damaged("'" + path + "' is " +
                   (size < entry.bytes ? "truncated" : "too long") + " (has " +
                   std::to_string(size) + " bytes, manifest says " +
                   std::to_string(entry.bytes) + ")");
  }
  Hasher hasher = NewHasher();
  for (uint64_t at = 0; at < size; at += buffer.size()) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), size - at);
    STRATA_RETURN_IF_ERROR(file->Read(at, buffer.data(), n));
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

// VerifyFile of every group's file.
Status VerifyFiles(Env& env, const std::string& dir, const Manifest& manifest) {
  std::vector<char> buffer(kVerifyBuffer);
  for (const GroupEntry& g : manifest.groups) {
    STRATA_RETURN_IF_ERROR(VerifyFile(env, dir + "/" + g.file, g, buffer));
  }
  return Status();
}

// Reads group `g`'s file into the engine, one role at a time through the
// host tier; adds the bytes read to `*bytes`.
Status LoadGroup(Env& env, Engine& engine, int g, const std::string& path,
                 const GroupEntry& entry, uint64_t* bytes) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env.OpenFile(path));
  return ForEachRole(engine, g, entry.roles, Access::kOverwrite,
                     [&](Role role, const GroupView& view) {
                       for (const TensorView& t : view.tensors) {
                         const TensorEntry* saved = entry.Find(t.name);
                         STRATA_CHECK(saved != nullptr &&
                                      t.bytes == TensorBytes(*saved, role));
                         STRATA_RETURN_IF_ERROR(
                             file->Read(saved->offset[role], t.data, t.bytes));
                         *bytes += t.bytes;
                       }
                       return Status();
                     });
}

}  // namespace

void SetSaveStageHookForTesting(SaveStageHook hook) { stage_hook = hook; }

Status Save(Engine& engine, const store::Residency& residency,
            const EngineOptions& options, const std::string& dir,
            const SaveOptions& save, Env& env) {
  STRATA_ASSIGN_OR_RETURN(Paths paths, MakePaths(dir));
  STRATA_RETURN_IF_ERROR(CheckIdle(engine, residency, "Save"));
  Manifest manifest;
  manifest.steps = engine.stats().steps;
  manifest.user_state = save.user_state;
  for (int g = 0; g < residency.group_count(); ++g) {
    manifest.groups.push_back(DescribeGroup(g, residency.layout(g)));
  }
  manifest.format_version = WrittenFormatVersion(manifest.groups);
  // What JSON cannot hold fails now, before any data is written.
  if (auto text = ManifestText(manifest, options, engine.info()); !text.ok()) {
    return text.status();
  }
  STRATA_RETURN_IF_ERROR(PrepareTemp(env, paths));
  if (Status s = WriteTemp(env, engine, options, paths, manifest); !s.ok()) {
    env.RemoveTree(paths.tmp);
    return Kept(env, s, paths);
  }
  const Status s = Replace(env, paths);
  if (!s.ok()) env.RemoveTree(paths.tmp);
  return s;
}

Result<Manifest> Verify(const std::string& dir, Env& env) {
  STRATA_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(env, dir));
  STRATA_RETURN_IF_ERROR(VerifyFiles(env, dir, manifest));
  return manifest;
}

Status Load(Engine& engine, const store::Residency& residency,
            const std::string& dir, LoadResult* result,
            const UserStateCheck& check, Env& env) {
  STRATA_ASSIGN_OR_RETURN(Paths paths, MakePaths(dir));
  STRATA_RETURN_IF_ERROR(CheckIdle(engine, residency, "Load"));
  bool recovered = false;
  STRATA_RETURN_IF_ERROR(RecoverInterrupted(env, paths, &recovered));
  STRATA_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(env, paths.dir));
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
  STRATA_RETURN_IF_ERROR(VerifyFiles(env, paths.dir, manifest));
  uint64_t bytes = 0;
  for (size_t g = 0; g < manifest.groups.size(); ++g) {
    const GroupEntry& entry = manifest.groups[g];
    if (Status s = LoadGroup(env, engine, static_cast<int>(g),
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
