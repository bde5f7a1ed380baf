#include "tools/nvme_bench/place.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/text.h"
#include "tools/nvme_bench/raw_device.h"

namespace strata::bench {
namespace {

namespace stdfs = std::filesystem;

// mountinfo writes a space, tab, newline or backslash in a path as \ooo.
std::string Unescape(std::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() &&
        std::all_of(field.begin() + i + 1, field.begin() + i + 4,
                    [](char c) { return c >= '0' && c <= '7'; })) {
      out += static_cast<char>((field[i + 1] - '0') * 64 +
                               (field[i + 2] - '0') * 8 + (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

// One line: "36 35 98:0 /root /mnt/point rw,noatime shared:1 - ext4
// /dev/vda rw": the mount point is the fifth field; after the "-" that
// ends the optional fields come the type and the source.
std::optional<MountEntry> ParseMountLine(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> fields;
  for (std::string f; in >> f;) fields.push_back(std::move(f));
  const auto dash = std::find(fields.begin(), fields.end(), "-");
  if (fields.size() < 6 || dash == fields.end() || fields.end() - dash < 3 ||
      dash - fields.begin() < 6) {
    return std::nullopt;
  }
  return MountEntry{Unescape(fields[4]), Unescape(*(dash + 1)),
                    Unescape(*(dash + 2)), fields[2]};
}

bool Contains(const std::string& mount_point, const std::string& path) {
  if (mount_point == "/") return !path.empty() && path[0] == '/';
  return path == mount_point ||
         (path.size() > mount_point.size() &&
          path.compare(0, mount_point.size(), mount_point) == 0 &&
          path[mount_point.size()] == '/');
}

std::string ReadAll(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Status NotThere(const std::string& path) {
  return Status::NotFound(
      "--path '" + path +
      "' does not exist: to measure a directory there, create it (mkdir -p " +
      path + "); to measure a new file at that path, add --create");
}

// The benchmark's own file in a directory, there before the run: another
// run's (two would write one file and the first to end remove it), or one
// a killed run left.
Status Leftover(const std::string& file) {
  return Status::FailedPrecondition(
      "'" + file +
      "' exists already: another strata-nvme-bench may be running on this "
      "directory, or one was killed before it removed its file; if none "
      "runs, remove it (rm '" +
      file +
      "'), or measure it as it is with "
      "--path '" +
      file + "' (and --overwrite to write it)");
}

// The files the run creates or grows on a file system must fit beside what
// it holds already.
Status CheckSpace(const BenchOptions& o, const Placement& place,
                  const FileSystem& fs, const Share& share, uint64_t held) {
  struct statvfs vfs = {};
  if (statvfs(place.dir.c_str(), &vfs) != 0) return Status::Ok();
  const uint64_t free = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  if (share.fs_bytes <= free + held) return Status::Ok();
  const std::string type = fs.type.empty() ? "?" : fs.type;
  if (vfs.f_blocks == 0) {  // proc, sysfs and the like hold no data
    return Status::InvalidArgument(fmt::format(
        "{} is on {}, a file system that holds no data; pass a --path on "
        "the drive to measure",
        place.dir, type));
  }
  std::string msg =
      o.paths.size() == 1
          ? fmt::format("--size {} does not fit: {} has {} free ({})",
                        SizeText(o.size), place.dir, HumanBytes(free), type)
          : fmt::format(
                "--size {} striped over {} files does not fit: {} of it goes "
                "to {}, which has {} free ({})",
                SizeText(o.size), o.paths.size(), HumanBytes(share.fs_bytes),
                place.dir, HumanBytes(free), type);
  if (held > 0) {
    msg += fmt::format(" besides the {} that '{}' holds", HumanBytes(held),
                       place.file);
  }
  return Status::NoSpace(msg + "; pass a smaller --size or another --path");
}

// Someone else's file, for a run without --overwrite.
Status CheckTheirs(const BenchOptions& o, const Placement& place,
                   const Share& share, uint64_t file_size) {
  if (RunWrites(o)) {
    return Status::FailedPrecondition(
        "'" + place.file +
        "' already exists and this run would write to it; pass --overwrite "
        "to allow that, or give --path a directory");
  }
  if (file_size >= share.file_bytes) return Status::Ok();
  const uint64_t files = o.paths.size();
  const uint64_t fits = file_size / 4096 * 4096 * files;
  return Status::FailedPrecondition(fmt::format(
      "'{}' is {}, smaller than {}; pass a smaller --size{}, or --overwrite "
      "to let the run grow it and fill it with its own data",
      place.file, HumanBytes(file_size),
      files == 1
          ? "--size " + SizeText(o.size)
          : fmt::format("its share ({}) of --size {} over {} files",
                        HumanBytes(share.file_bytes), SizeText(o.size), files),
      fits > 0 ? " (at most " + SizeText(fits) + ")" : ""));
}

}  // namespace

Result<Placement> Place(const BenchOptions& o, const std::string& given) {
  std::error_code ec;
  const stdfs::path path(given);
  if (stdfs::is_directory(path, ec)) {
    const std::string file = (path / kBenchFileName).string();
    if (stdfs::exists(stdfs::symlink_status(file, ec))) return Leftover(file);
    return Placement{file, given, true};
  }
  const stdfs::path parent =
      path.has_parent_path() ? path.parent_path() : stdfs::path(".");
  if (stdfs::is_block_file(path, ec)) {
    const stdfs::path device = stdfs::canonical(path, ec);
    return Placement{device.string(), device.parent_path().string(), false,
                     true};
  }
  if (stdfs::exists(path, ec)) {
    if (!stdfs::is_regular_file(path, ec)) {
      return Status::InvalidArgument(
          "--path '" + given +
          "' is neither a directory, a regular file nor a block device");
    }
    return Placement{given, parent.string(), false};
  }
  if (!o.create || !path.has_filename()) return NotThere(given);
  if (!stdfs::is_directory(parent, ec)) {
    return Status::NotFound(
        "--path '" + given + "': directory '" + parent.string() +
        "' does not exist; create it (mkdir -p " + parent.string() +
        ") or name an existing directory");
  }
  return Placement{given, parent.string(), true};
}

Result<std::vector<Placement>> PlaceAll(const BenchOptions& o) {
  std::vector<Placement> out;
  std::vector<std::string> seen;
  for (const std::string& given : o.paths) {
    STRATA_ASSIGN_OR_RETURN(Placement place, Place(o, given));
    std::error_code ec;
    std::string real = stdfs::weakly_canonical(place.file, ec).string();
    if (ec) real = place.file;
    if (std::find(seen.begin(), seen.end(), real) != seen.end()) {
      return Status::InvalidArgument("--path names the file '" + place.file +
                                     "' twice (a directory means its " +
                                     kBenchFileName +
                                     "): give each file or directory once");
    }
    seen.push_back(std::move(real));
    if (!out.empty() && place.device != out[0].device) {
      return Status::InvalidArgument(
          "--path mixes raw block devices and files ('" + out[0].file + "', '" +
          place.file + "'); stripe a job over devices or over files");
    }
    out.push_back(std::move(place));
  }
  return out;
}

std::vector<MountEntry> ParseMountInfo(std::string_view mountinfo) {
  std::vector<MountEntry> mounts;
  std::istringstream in{std::string(mountinfo)};
  for (std::string line; std::getline(in, line);) {
    if (std::optional<MountEntry> m = ParseMountLine(line)) {
      mounts.push_back(std::move(*m));
    }
  }
  return mounts;
}

std::optional<MountEntry> FindMount(std::string_view mountinfo,
                                    const std::string& path) {
  std::optional<MountEntry> best;
  for (MountEntry& m : ParseMountInfo(mountinfo)) {
    if (!Contains(m.mount_point, path)) continue;
    if (!best || m.mount_point.size() >= best->mount_point.size()) {
      best = std::move(m);
    }
  }
  return best;
}

FileSystem FileSystemOf(const std::string& path) {
  FileSystem out;
  struct stat dev = {};
  if (stat(path.c_str(), &dev) == 0 && S_ISBLK(dev.st_mode)) {
    out.source = path;
    out.major = major(dev.st_rdev);
    out.minor = minor(dev.st_rdev);
    out.block_device = out.raw = true;
    return out;
  }
  std::error_code ec;
  const std::string real = stdfs::canonical(path, ec).string();
  if (std::optional<MountEntry> m =
          FindMount(ReadAll("/proc/self/mountinfo"), real)) {
    out.type = m->type;
    out.source = m->source;
  }
  struct stat st = {};
  if (stat(path.c_str(), &st) == 0) {
    out.major = major(st.st_dev);
    out.minor = minor(st.st_dev);
    out.block_device = out.major != 0;
  }
  // btrfs gives its files an anonymous st_dev (major 0) on a real device.
  struct stat src = {};
  if (!out.block_device && stat(out.source.c_str(), &src) == 0 &&
      S_ISBLK(src.st_mode)) {
    out.major = major(src.st_rdev);
    out.minor = minor(src.st_rdev);
    out.block_device = true;
  }
  return out;
}

std::string FileSystemText(const FileSystem& fs) {
  if (fs.raw) {
    return fmt::format("raw block device {} ({}:{}), no file system", fs.source,
                       fs.major, fs.minor);
  }
  const std::string type = fs.type.empty() ? "an unknown file system" : fs.type;
  if (fs.block_device) {
    return fmt::format("{}, {} ({}:{})", type, fs.source, fs.major, fs.minor);
  }
  if (fs.type == "tmpfs" || fs.type == "ramfs") {
    return type +
           " (not a block device: figures are memory speed and mean nothing "
           "for a drive)";
  }
  return fmt::format(
      "{} (not a block device: figures are {}'s and may not be a drive's)",
      type, type);
}

Status CheckPlacement(const BenchOptions& o, const Placement& place,
                      const FileSystem& fs, const Share& share) {
  if (place.device) {
    return CheckRawDevice(o, place.file, fs.major, fs.minor, share.file_bytes);
  }
  if (!o.destroy_data_on.empty()) {
    return Status::InvalidArgument(
        "--destroy-data-on is for a raw block device --path, and '" +
        place.file + "' is a file; drop it (--overwrite lets a run write " +
        "someone else's file)");
  }
  struct stat st = {};
  const bool exists = stat(place.file.c_str(), &st) == 0;
  if (exists && !place.ours && !o.overwrite) {
    return CheckTheirs(o, place, share, static_cast<uint64_t>(st.st_size));
  }
  const uint64_t held = exists ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
  return CheckSpace(o, place, fs, share, held);
}

Status CheckDestroyFlags(const BenchOptions& o,
                         const std::vector<Placement>& places) {
  std::vector<dev_t> devices;
  for (const Placement& place : places) {
    struct stat st = {};
    if (place.device && stat(place.file.c_str(), &st) == 0) {
      devices.push_back(st.st_rdev);
    }
  }
  for (const std::string& flag : o.destroy_data_on) {
    struct stat st = {};
    const bool named =
        stat(flag.c_str(), &st) == 0 && S_ISBLK(st.st_mode) &&
        std::find(devices.begin(), devices.end(), st.st_rdev) != devices.end();
    if (!named) {
      return Status::InvalidArgument(
          "--destroy-data-on '" + flag +
          "' is no device that --path names; name only the devices the run "
          "writes");
    }
  }
  return Status::Ok();
}

bool MayWrite(const BenchOptions& o, const Placement& place) {
  return place.device ? RunWrites(o) : place.ours || o.overwrite;
}

}  // namespace strata::bench
