// The checkpoint manifest (Note [Checkpoint format] in src/ckpt/checkpoint.h)
// as a value: described from the engine's layouts and written by Save; parsed,
// checked and matched against the engine by Load. Pure: no file I/O.
//
// Failure: ParseManifest returns kFailedPrecondition for a file without
// the strata format marker or of another format_version (naming both
// versions); then kDataLoss when manifest_xxh3 does not match, and
// kDataLoss naming the manifest and the field at fault: missing, of another
// type, a fraction or a negative number where an integer count is due, or
// an offset or size that differs from the packing of Note [Checkpoint
// format];
// MatchEngine returns kFailedPrecondition naming the first group or tensor
// that differs. Nothing throws.
#ifndef STRATA_SRC_CKPT_MANIFEST_H_
#define STRATA_SRC_CKPT_MANIFEST_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/store/layout.h"
#include "src/store/residency.h"
#include "strata/engine.h"

namespace strata::ckpt {

inline constexpr char kManifestName[] = "manifest.json";

// A tensor of a group's file: its layout, with `offset` the byte offset of
// each role in the file (not in a chunk).
using TensorEntry = store::TensorLayout;

struct GroupEntry {
  std::string name;
  std::string file;  // a name inside the checkpoint directory
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
  std::array<Tier, kNumRoles> home = {};  // informational; for roles held
  RoleMask roles = 0;
  std::vector<TensorEntry> tensors;
  const TensorEntry* Find(std::string_view tensor) const;  // or nullptr
};

struct Manifest {
  int format_version = 0;
  uint64_t steps = 0;
  std::string user_state;
  std::vector<GroupEntry> groups;
};

// kDataLoss: `what` is wrong with a checkpoint, and the way out.
Status Damaged(const std::string& what);

// Group `id`'s entry: its file name ("group-000003.bin") and every tensor's
// offset in it, packed as Note [Checkpoint format] says; xxh3 is left 0.
GroupEntry DescribeGroup(int id, const store::GroupLayout& layout);
// The format_version Save writes for `groups` (checkpoint.h).
int WrittenFormatVersion(const std::vector<GroupEntry>& groups);
// Whether `name` has the form of DescribeGroup's file names: "group-", at
// least 6 digits, ".bin".
bool IsGroupFileName(std::string_view name);

// manifest.json's text. `options` and `info` give the informational
// "config" object. kInvalidArgument when user_state or a name is not UTF-8.
Result<std::string> ManifestText(const Manifest& manifest,
                                 const EngineOptions& options,
                                 const EngineInfo& info);
// Parses manifest.json's text; `path` names it in errors.
Result<Manifest> ParseManifest(const std::string& text,
                               const std::string& path);

// Checks that the engine registered the manifest's groups (same order and
// names) and tensors (names, shapes, dtypes, roles; any order).
Status MatchEngine(const Manifest& manifest, const store::Residency& residency);

}  // namespace strata::ckpt

#endif  // STRATA_SRC_CKPT_MANIFEST_H_
