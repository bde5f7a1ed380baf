// Checkpoint and resume: Engine::Save and Engine::Load (strata/engine.h
// states the contract callers see; this file the format and the protocol).
//
// Note [Checkpoint format]
// A checkpoint is a directory:
// - manifest.json: {"format": "strata-checkpoint", "format_version": 2 or 3,
//   "steps", "user_state", "config" (budgets, default placement, device:
//   informational, never checked), "groups": [{"name", "file", "bytes",
//   "xxh3" (16 hex digits), "placement" (informational), "tensors":
//   [{"name", "shape", "dtype", "roles": {role name: byte offset in the
//   file}, "state_dtype" (version 3, only where not fp32)}]}],
//   "manifest_xxh3"}. Groups are listed in registration order.
//   manifest_xxh3 (16 hex digits) is the XXH3-64 of the manifest without
//   that field, written as JSON indented by 2 spaces with its keys in the
//   file's order, plus a final newline (as Save writes it). A damaged digit
//   of an offset or of the step count would otherwise load wrong values
//   without an error: the data files' hashes cannot see it.
// - group-NNNNNN.bin, one per group (NNNNNN its id): every role's tensors
//   back to back, role-major (compute, master, state1, state2, grad) and in
//   registration order within a role, only the real elements (no chunk or
//   alignment padding), in the role's dtype as the tier holds it
//   (little-endian fp32, bf16, fp16). So the bytes do not depend on the
//   chunk layout or the placement of the engine that wrote them.
// A manifest of a format_version this build does not read is refused,
// naming both versions.
//
// Note [Checkpoint crash safety]
// Save writes into the sibling "<dir>.tmp-<pid>", fsyncs every file and
// that directory, then moves it into place: rename <dir> to "<dir>.old",
// rename the temporary to <dir>, fsync the parent, remove "<dir>.old".
// Invariant: whenever <dir> exists it is complete and the newest; "<dir>.old"
// matters only while <dir> is missing. A crash therefore leaves one of:
// - <dir> (old) and a partial "<dir>.tmp-<pid>": Load ignores the
//   temporary; the next Save removes it once its pid is gone.
// - no <dir>, "<dir>.old" complete: Load renames it back (and says so on
//   stderr and in LoadResult::recovered); the next Save keeps it until the
//   new checkpoint is in place.
// - <dir> (new) and "<dir>.old": the old one is stale; the next Save
//   removes it.
// Every file-system call goes through an Env (src/ckpt/env.h), so that
// tests cut a save off before any one of them
// (tests/ckpt/checkpoint_crash_test.cc).
// Save replaces a directory only if it is empty or holds nothing but a
// checkpoint's own files (manifest.json, group-*.bin), so neither a wrong
// path nor a file put into a checkpoint gets deleted. Two Saves or a Save
// and a Load of one <dir> at the same time are not supported.
//
// Streaming: Save fetches one role of one group at a time to the host
// (Fetch(kHost), which brings NVMe-homed chunks up within the host budget),
// pwrites its tensors straight from the tier and releases it, so it holds
// no buffer of its own. Load verifies every file through one 1 MiB buffer,
// then fetches the same way with write = true and preads into the tier.
#ifndef STRATA_SRC_CKPT_CHECKPOINT_H_
#define STRATA_SRC_CKPT_CHECKPOINT_H_

#include <functional>
#include <string>

#include "src/ckpt/env.h"
#include "src/ckpt/manifest.h"
#include "src/store/residency.h"
#include "strata/engine.h"

namespace strata::ckpt {

// The manifest's format_version: 2 added manifest_xxh3; 3 added a tensor's
// "state_dtype" (bf16 or int8 optimizer state). Save writes 3 only where
// some tensor has one, so a checkpoint of fp32 state stays version 2, and
// a build that reads only 2 refuses a 3 by its version, not as damaged.
// This build reads both.
inline constexpr int kFormatVersion = 3;
inline constexpr int kOldestFormatVersion = 2;

// Engine::Save: `engine` and `residency` are the same engine's; `options`
// are the options it was opened with (written as its configuration).
// Every file-system call goes through `env` (tests pass one that fails).
Status Save(Engine& engine, const store::Residency& residency,
            const EngineOptions& options, const std::string& dir,
            const SaveOptions& save, Env& env = Env::Default());
// Reads `dir`'s manifest and checks it and every data file (size, XXH3)
// as Load does before it changes anything; touches nothing (no recovery
// of "<dir>.old"). Errors are Load's.
Result<Manifest> Verify(const std::string& dir, Env& env = Env::Default());
// Checks a checkpoint's user_state before Load changes any data (the
// optimizer's: its step count and algorithm); an error stops the load.
using UserStateCheck = std::function<Status(const std::string& user_state)>;
// Engine::Load. `result` may be null; `check`, when set, runs once the
// manifest matches the engine and before the files are verified. Every
// file-system call goes through `env`.
Status Load(Engine& engine, const store::Residency& residency,
            const std::string& dir, LoadResult* result,
            const UserStateCheck& check = {}, Env& env = Env::Default());

// Testing hook, for a crash test that cannot pass Save an Env (one that
// saves through OffloadOptimizer::Save): points of Note [Checkpoint crash
// safety] to kill the process at. kDataFileWritten is reached once per
// group. A test that can should fail or cut off a call of the Env instead.
enum class SaveStage {
  kDataFileWritten,
  kOldMovedAside,
};
using SaveStageHook = void (*)(SaveStage stage);
// Every Save in the process calls `hook` at each stage; null (the default)
// for none. Tests only: set it before saving, not while a Save runs.
void SetSaveStageHookForTesting(SaveStageHook hook);

}  // namespace strata::ckpt

#endif  // STRATA_SRC_CKPT_CHECKPOINT_H_
