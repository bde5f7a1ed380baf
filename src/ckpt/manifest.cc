#include "src/ckpt/manifest.h"

#include <xxhash.h>

#include <charconv>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "src/ckpt/checkpoint.h"

namespace strata::ckpt {
namespace {

// Ordered, so that the manifest reads in the order it is written.
using Json = nlohmann::ordered_json;

constexpr char kFormatName[] = "strata-checkpoint";
constexpr char kChecksumKey[] = "manifest_xxh3";
// A tensor's state format; absent for fp32 (and in checkpoints from before
// the field).
constexpr char kStateKey[] = "state_dtype";

std::string Hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx",
                static_cast<unsigned long long>(value));
  return text;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    out += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  }
  return out + "]";
}

std::string RolesText(RoleMask roles) {
  std::string out;
  for (int r = 0; r < kNumRoles; ++r) {
    if ((roles & RoleBit(static_cast<Role>(r))) == 0) continue;
    out += (out.empty() ? "" : ",") + std::string(RoleName(Role(r)));
  }
  return out;
}

Json PlacementJson(const std::array<Tier, kNumRoles>& home, RoleMask roles) {
  Json out = Json::object();
  for (int r = 0; r < kNumRoles; ++r) {
    if ((roles & RoleBit(static_cast<Role>(r))) == 0) continue;
    out[std::string(RoleName(Role(r)))] = std::string(TierName(home[r]));
  }
  return out;
}

Json GroupJson(const GroupEntry& g) {
  Json tensors = Json::array();
  for (const TensorEntry& t : g.tensors) {
    Json roles = Json::object();
    for (Role role : kRoles) {
      if ((t.roles & RoleBit(role)) == 0) continue;
      roles[std::string(RoleName(role))] = t.offset[role];
    }
    Json tensor = {{"name", t.name},
                   {"shape", t.shape},
                   {"dtype", std::string(DTypeName(t.dtype))},
                   {"roles", std::move(roles)}};
    if (t.state != StateFormat::kF32) {
      tensor[kStateKey] = std::string(StateFormatName(t.state));
    }
    tensors.push_back(std::move(tensor));
  }
  return {{"name", g.name},
          {"file", g.file},
          {"bytes", g.bytes},
          {"xxh3", Hex(g.xxh3)},
          {"placement", PlacementJson(g.home, g.roles)},
          {"tensors", std::move(tensors)}};
}

Status Malformed(const std::string& path, const std::string& where,
                 const std::string& what) {
  return Damaged("manifest '" + path + "' is malformed at " + where + ": " +
                 what);
}

// A field that json's own checks let through but the format refuses.
struct FieldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `v` as T. Every integer of the format is a count, a size or an offset, so
// it must be a whole number from 0 to T's maximum: json's get<T>() would
// truncate 1.7 to 1 and wrap -1 to 2^64 - 1.
template <typename T>
T Integer(const Json& v) {
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() <=
          static_cast<uint64_t>(std::numeric_limits<T>::max())) {
    return static_cast<T>(v.get<uint64_t>());
  }
  throw FieldError("must be a whole number from 0 to " +
                   std::to_string(std::numeric_limits<T>::max()) + ", not " +
                   v.dump());
}

// Field `key` of `j` as T. `where` is set to the field's path first, so a
// json exception (missing field, other type) or a FieldError can name it.
template <typename T>
T Get(const Json& j, const std::string& parent, const char* key,
      std::string& where) {
  where = parent.empty() ? key : parent + "." + key;
  if constexpr (std::is_integral_v<T>) {
    return Integer<T>(j.at(key));
  } else {
    return j.at(key).get<T>();
  }
}

// 16 hex digits, as Hex writes them.
Result<uint64_t> ParseHex(const std::string& hex) {
  uint64_t value = 0;
  const auto [end, err] =
      std::from_chars(hex.data(), hex.data() + hex.size(), value, 16);
  if (hex.size() != 16 || err != std::errc() || end != hex.data() + 16) {
    return Status::DataLoss("not 16 hex digits");
  }
  return value;
}

// manifest_xxh3 of a manifest without that field (Note [Checkpoint format]).
uint64_t ManifestHash(const Json& without) {
  const std::string text = without.dump(2) + "\n";
  return XXH3_64bits(text.data(), text.size());
}

Result<Role> ParseRole(const std::string& name) {
  for (int r = 0; r < kNumRoles; ++r) {
    if (name == RoleName(Role(r))) return Role(r);
  }
  return Status::InvalidArgument("unknown role '" + name + "'");
}

// One tensor of a group whose file has `file_bytes` bytes. Throws json
// exceptions for missing fields; returns what else is wrong.
Result<TensorEntry> ParseTensor(const Json& j, const std::string& at,
                                uint64_t file_bytes, std::string& where) {
  TensorEntry t;
  t.name = Get<std::string>(j, at, "name", where);
  const Json shape = Get<Json>(j, at, "shape", where);
  if (!shape.is_array()) throw FieldError("must be an array");
  for (const Json& dim : shape) t.shape.push_back(Integer<int64_t>(dim));
  t.elements = store::ShapeElements(t.shape);
  if (t.elements == 0) return Status::DataLoss("empty shape");
  STRATA_ASSIGN_OR_RETURN(t.dtype,
                          ParseDType(Get<std::string>(j, at, "dtype", where)));
  if (j.contains(kStateKey)) {
    STRATA_ASSIGN_OR_RETURN(
        t.state, ParseStateFormat(Get<std::string>(j, at, kStateKey, where)));
  }
  const Json roles = Get<Json>(j, at, "roles", where);
  for (const auto& [name, offset] : roles.items()) {
    where = at + ".roles." + name;
    STRATA_ASSIGN_OR_RETURN(Role role, ParseRole(name));
    t.roles |= RoleBit(role);
    const uint64_t at_byte = Integer<uint64_t>(offset);
    t.offset[role] = at_byte;
    const uint64_t bytes = store::TensorBytes(t, role);
    if (bytes > file_bytes || at_byte > file_bytes - bytes) {
      return Status::DataLoss("the tensor lies beyond the file");
    }
  }
  if (t.roles == 0) return Status::DataLoss("no roles");
  return t;
}

// Note [Checkpoint format]'s packing: gives every role of every tensor its
// offset in the file, role-major and in the order listed; returns the
// file's bytes.
uint64_t Pack(std::vector<TensorEntry>& tensors) {
  uint64_t bytes = 0;
  for (Role role : kRoles) {
    for (TensorEntry& t : tensors) {
      if ((t.roles & RoleBit(role)) == 0) continue;
      t.offset[role] = bytes;
      bytes += store::TensorBytes(t, role);
    }
  }
  return bytes;
}

// The format fixes every offset and the size Pack. manifest_xxh3 finds
// damage after Save; this finds a writer that packed otherwise, whose
// offsets inside the file would load shifted bytes without an error.
Status CheckPacking(const GroupEntry& g, const std::string& at,
                    std::string& where) {
  std::vector<TensorEntry> packed = g.tensors;
  const uint64_t bytes = Pack(packed);
  for (Role role : kRoles) {
    for (size_t k = 0; k < g.tensors.size(); ++k) {
      const uint64_t offset = g.tensors[k].offset[role];
      if ((g.tensors[k].roles & RoleBit(role)) == 0 ||
          offset == packed[k].offset[role]) {
        continue;
      }
      where = at + ".tensors[" + std::to_string(k) + "].roles." +
              std::string(RoleName(role));
      return Status::DataLoss("offset " + std::to_string(offset) +
                              ", but the tensors packed in order put it at " +
                              std::to_string(packed[k].offset[role]));
    }
  }
  if (bytes != g.bytes) {
    where = at + ".bytes";
    return Status::DataLoss(std::to_string(g.bytes) +
                            " bytes, but the tensors add up to " +
                            std::to_string(bytes));
  }
  return Status();
}

Result<GroupEntry> ParseGroup(const Json& j, const std::string& at,
                              std::string& where) {
  GroupEntry g;
  g.name = Get<std::string>(j, at, "name", where);
  g.file = Get<std::string>(j, at, "file", where);
  if (g.file.empty() || g.file[0] == '.' ||
      g.file.find('/') != std::string::npos) {
    return Status::DataLoss("not a file name in the checkpoint");
  }
  g.bytes = Get<uint64_t>(j, at, "bytes", where);
  STRATA_ASSIGN_OR_RETURN(g.xxh3,
                          ParseHex(Get<std::string>(j, at, "xxh3", where)));
  const Json tensors = Get<Json>(j, at, "tensors", where);
  std::set<std::string> names;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const std::string tensor_at = at + ".tensors[" + std::to_string(k) + "]";
    STRATA_ASSIGN_OR_RETURN(
        TensorEntry t, ParseTensor(tensors.at(k), tensor_at, g.bytes, where));
    if (!names.insert(t.name).second) {
      return Status::DataLoss("tensor listed twice");
    }
    g.roles |= t.roles;
    g.tensors.push_back(std::move(t));
  }
  if (g.tensors.empty()) return Status::DataLoss("no tensors");
  STRATA_RETURN_IF_ERROR(CheckPacking(g, at, where));
  return g;
}

Result<Manifest> ParseFields(const Json& j, const std::string& path,
                             std::string& where) {
  if (!j.is_object() || !j.contains("format") ||
      j["format"] != std::string(kFormatName)) {
    return Status::FailedPrecondition(
        "'" + path + "' is not a strata checkpoint manifest (no \"" +
        "format\": \"" + kFormatName + "\")");
  }
  Manifest m;
  m.format_version = Get<int>(j, "", "format_version", where);
  if (m.format_version < kOldestFormatVersion ||
      m.format_version > kFormatVersion) {
    return Status::FailedPrecondition(
        "'" + path + "' is checkpoint format version " +
        std::to_string(m.format_version) + "; this build reads versions " +
        std::to_string(kOldestFormatVersion) + " to " +
        std::to_string(kFormatVersion) +
        ": load it with the strata release that wrote it");
  }
  Result<uint64_t> recorded =
      ParseHex(Get<std::string>(j, "", kChecksumKey, where));
  if (!recorded.ok()) {
    return Malformed(path, where, recorded.status().message());
  }
  Json without = j;
  without.erase(kChecksumKey);
  if (const uint64_t actual = ManifestHash(without); actual != *recorded) {
    return Damaged("manifest '" + path + "' does not match its " +
                   kChecksumKey + " (" + Hex(actual) + ", recorded " +
                   Hex(*recorded) + "): it changed after Save wrote it");
  }
  m.steps = Get<uint64_t>(j, "", "steps", where);
  m.user_state = Get<std::string>(j, "", "user_state", where);
  const Json groups = Get<Json>(j, "", "groups", where);
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string at = "groups[" + std::to_string(i) + "]";
    Result<GroupEntry> g = ParseGroup(groups.at(i), at, where);
    if (!g.ok()) return Malformed(path, where, g.status().message());
    m.groups.push_back(std::move(*g));
  }
  return m;
}

Status Mismatch(const GroupEntry& g, const std::string& what) {
  return Status::FailedPrecondition("group '" + g.name + "': " + what);
}

Status MatchGroup(const GroupEntry& g, const store::GroupLayout& layout) {
  if (g.tensors.size() != layout.tensors.size()) {
    return Mismatch(g, "the checkpoint has " +
                           std::to_string(g.tensors.size()) +
                           " tensors, this engine has " +
                           std::to_string(layout.tensors.size()));
  }
  for (const TensorEntry& t : g.tensors) {
    const store::TensorLayout* mine = nullptr;
    for (const store::TensorLayout& l : layout.tensors) {
      if (l.name == t.name) mine = &l;
    }
    const std::string what = "tensor '" + t.name + "' ";
    if (mine == nullptr) {
      return Mismatch(g, what + "is in the checkpoint but not in this engine");
    }
    const std::string sep = " in the checkpoint but ";
    if (mine->shape != t.shape) {
      return Mismatch(g, what + "has shape " + ShapeText(t.shape) + sep +
                             ShapeText(mine->shape) + " in this engine");
    }
    if (mine->dtype != t.dtype) {
      return Mismatch(g, what + "has dtype " + std::string(DTypeName(t.dtype)) +
                             sep + std::string(DTypeName(mine->dtype)) +
                             " in this engine");
    }
    if (mine->state != t.state) {
      return Mismatch(g, what + "has optimizer state in " +
                             std::string(StateFormatName(t.state)) + sep +
                             std::string(StateFormatName(mine->state)) +
                             " in this engine: open the engine with the "
                             "checkpoint's state format");
    }
    if (mine->roles != t.roles) {
      return Mismatch(g, what + "has roles " + RolesText(t.roles) + sep +
                             RolesText(mine->roles) + " in this engine");
    }
  }
  return Status();
}

}  // namespace

Status Damaged(const std::string& what) {
  return Status::DataLoss(
      what +
      "; the checkpoint is damaged: restore it from a backup "
      "or save a new one");
}

const TensorEntry* GroupEntry::Find(std::string_view tensor) const {
  for (const TensorEntry& t : tensors) {
    if (t.name == tensor) return &t;
  }
  return nullptr;
}

GroupEntry DescribeGroup(int id, const store::GroupLayout& layout) {
  GroupEntry g;
  g.name = layout.name;
  char file[32];
  std::snprintf(file, sizeof(file), "group-%06d.bin", id);
  g.file = file;
  g.roles = layout.roles;
  for (const store::ChunkLayout& c : layout.chunks) {
    g.home[static_cast<int>(c.role)] = c.home;
  }
  g.tensors = layout.tensors;
  g.bytes = Pack(g.tensors);
  return g;
}

int WrittenFormatVersion(const std::vector<GroupEntry>& groups) {
  for (const GroupEntry& g : groups) {
    for (const TensorEntry& t : g.tensors) {
      if (t.state != StateFormat::kF32) return kFormatVersion;
    }
  }
  return kOldestFormatVersion;
}

bool IsGroupFileName(std::string_view name) {
  constexpr std::string_view kPrefix = "group-", kSuffix = ".bin";
  if (name.size() < kPrefix.size() + 6 + kSuffix.size() ||
      name.substr(0, kPrefix.size()) != kPrefix ||
      name.substr(name.size() - kSuffix.size()) != kSuffix) {
    return false;
  }
  const std::string_view digits = name.substr(
      kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  return digits.find_first_not_of("0123456789") == std::string_view::npos;
}

Result<std::string> ManifestText(const Manifest& manifest,
                                 const EngineOptions& options,
                                 const EngineInfo& info) {
  Json groups = Json::array();
  for (const GroupEntry& g : manifest.groups) groups.push_back(GroupJson(g));
  Json config = {
      {"device", info.device},
      {"device_name", info.device_name},
      {"device_budget", options.device_budget},
      {"host_budget", options.host_budget},
      {"nvme_budget", options.nvme_budget},
      {"placement", PlacementJson(options.placement.home, kAllRoles)}};
  Json m = {{"format", kFormatName},
            {"format_version", manifest.format_version},
            {"steps", manifest.steps},
            {"user_state", manifest.user_state},
            {"config", std::move(config)},
            {"groups", std::move(groups)}};
  try {
    m[kChecksumKey] = Hex(ManifestHash(m));
    return m.dump(2) + "\n";
  } catch (const Json::exception& e) {
    return Status::InvalidArgument(
        std::string("the manifest cannot be written: ") + e.what() +
        "; user_state and every name must be valid UTF-8");
  }
}

Result<Manifest> ParseManifest(const std::string& text,
                               const std::string& path) {
  std::string where = "the top level";
  try {
    const Json j = Json::parse(text);
    return ParseFields(j, path, where);
  } catch (const Json::parse_error& e) {
    return Damaged("manifest '" + path + "' is not valid JSON (byte " +
                   std::to_string(e.byte) + ")");
  } catch (const Json::exception& e) {
    return Malformed(path, where, e.what());
  } catch (const FieldError& e) {
    return Malformed(path, where, e.what());
  }
}

Status MatchEngine(const Manifest& manifest,
                   const store::Residency& residency) {
  const size_t groups = static_cast<size_t>(residency.group_count());
  if (manifest.groups.size() != groups) {
    return Status::FailedPrecondition(
        "the checkpoint has " + std::to_string(manifest.groups.size()) +
        " groups, this engine has " + std::to_string(groups));
  }
  for (size_t i = 0; i < groups; ++i) {
    const GroupEntry& g = manifest.groups[i];
    const store::GroupLayout& layout = residency.layout(static_cast<int>(i));
    if (g.name != layout.name) {
      return Status::FailedPrecondition("group " + std::to_string(i) + " is '" +
                                        g.name + "' in the checkpoint but '" +
                                        layout.name + "' in this engine");
    }
    STRATA_RETURN_IF_ERROR(MatchGroup(g, layout));
  }
  return Status();
}

}  // namespace strata::ckpt
