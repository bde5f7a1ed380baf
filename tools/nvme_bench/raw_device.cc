#include "tools/nvme_bench/raw_device.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "common/text.h"
#include "strata/aio.h"
#include "tools/nvme_bench/place.h"

namespace strata::bench {
namespace {

namespace stdfs = std::filesystem;

std::string ReadText(const stdfs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A member of the family, numbered from its "dev" file ("259:1").
BlockDev Member(const stdfs::path& block, const std::string& name,
                std::string via) {
  BlockDev d{name, 0, 0, std::move(via)};
  if (std::sscanf(ReadText(block / name / "dev").c_str(), "%u:%u", &d.major,
                  &d.minor) != 2) {
    d.major = d.minor = 0;
  }
  return d;
}

std::vector<std::string> EntryNames(const stdfs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(dir, ec)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string Who(const BlockDev& d) {
  return "/dev/" + d.name + (d.via.empty() ? "" : " (" + d.via + ")");
}

bool IsMember(const std::vector<BlockDev>& family, const std::string& name) {
  return std::any_of(family.begin(), family.end(),
                     [&](const BlockDev& d) { return d.name == name; });
}

std::optional<std::string> SwappedOn(const std::vector<BlockDev>& family,
                                     std::string_view swaps) {
  std::istringstream in{std::string(swaps)};
  for (std::string line; std::getline(in, line);) {
    std::string first;
    std::istringstream(line) >> first;
    for (const BlockDev& d : family) {
      if (first == "/dev/" + d.name) return Who(d) + " is a swap area";
    }
  }
  return std::nullopt;
}

// "--rw write,randrw" or "--verify": what makes the run write.
std::string Writers(const BenchOptions& o) {
  if (o.verify) return "--verify";
  std::string rw;
  for (Rw r : o.rw) {
    if (IsWrite(r)) rw += (rw.empty() ? "" : ",") + std::string(RwName(r));
  }
  return "--rw " + rw;
}

// --destroy-data-on must name the device --path does.
Status CheckNamesDevice(const std::vector<std::string>& flags,
                        const std::string& device, unsigned dev_major,
                        unsigned dev_minor) {
  std::string named;
  for (const std::string& flag : flags) {
    struct stat st = {};
    if (stat(flag.c_str(), &st) != 0 || !S_ISBLK(st.st_mode)) {
      return Status::InvalidArgument(fmt::format(
          "--destroy-data-on '{}' is not a block device; it must name the "
          "device --path names: --destroy-data-on {}",
          flag, device));
    }
    if (major(st.st_rdev) == dev_major && minor(st.st_rdev) == dev_minor) {
      return Status::Ok();
    }
    std::error_code ec;
    named += fmt::format("{}'{}' is {} ({}:{})", named.empty() ? "" : ", ",
                         flag, stdfs::canonical(flag, ec).string(),
                         major(st.st_rdev), minor(st.st_rdev));
  }
  return Status::InvalidArgument(fmt::format(
      "--destroy-data-on does not name {} ({}:{}), a device --path names "
      "({}); name each device the run writes: --destroy-data-on {}",
      device, dev_major, dev_minor, named, device));
}

// The kernel's name for a device number ("nvme0n1"), which /sys knows it
// by; the device file's own name where /sys does not say.
std::string SysName(const std::string& device, unsigned dev_major,
                    unsigned dev_minor) {
  std::error_code ec;
  const stdfs::path dev = stdfs::canonical(
      fmt::format("/sys/dev/block/{}:{}", dev_major, dev_minor), ec);
  return ec ? stdfs::path(device).filename().string() : dev.filename().string();
}

// --size must fit on the device, whose size /sys gives in 512-byte
// sectors (aio checks again as it opens it).
Status CheckFits(const BenchOptions& o, const std::string& id,
                 const std::string& name, uint64_t bytes) {
  uint64_t sectors = 0;
  std::istringstream(ReadText("/sys/class/block/" + name + "/size")) >> sectors;
  if (sectors == 0 || bytes <= sectors * 512) return Status::Ok();
  const std::string what =
      bytes == o.size ? "--size " + SizeText(o.size)
                      : fmt::format("{}, its share of --size {},",
                                    HumanBytes(bytes), SizeText(o.size));
  return Status::InvalidArgument(fmt::format(
      "{} does not fit on {}, which holds {} ({} bytes); pass a smaller "
      "--size",
      what, id, HumanBytes(sectors * 512), sectors * 512));
}

}  // namespace

std::vector<BlockDev> DeviceFamily(const std::string& name,
                                   const std::string& sys_root) {
  const stdfs::path block = stdfs::path(sys_root) / "class/block";
  std::vector<BlockDev> family = {Member(block, name, "")};
  std::error_code ec;
  for (const std::string& entry : EntryNames(block / name)) {
    if (stdfs::exists(block / name / entry / "partition", ec)) {
      family.push_back(Member(block, entry, "a partition of " + name));
    }
  }
  // The family grows as holders are found; each is searched in turn.
  for (size_t i = 0; i < family.size(); ++i) {
    const std::string member = family[i].name;
    for (const std::string& holder : EntryNames(block / member / "holders")) {
      if (!IsMember(family, holder)) {
        family.push_back(Member(block, holder, "built on " + member));
      }
    }
  }
  return family;
}

std::optional<std::string> DeviceInUse(const std::vector<BlockDev>& family,
                                       std::string_view mountinfo,
                                       std::string_view swaps) {
  const std::vector<MountEntry> mounts = ParseMountInfo(mountinfo);
  for (const BlockDev& d : family) {
    const std::string number = fmt::format("{}:{}", d.major, d.minor);
    for (const MountEntry& m : mounts) {
      if (m.device != number && m.source != "/dev/" + d.name) continue;
      return fmt::format("{} is mounted on {} ({}{})", Who(d), m.mount_point,
                         m.type,
                         m.mount_point == "/" ? ", the root file system" : "");
    }
  }
  if (auto swap = SwappedOn(family, swaps)) return swap;
  for (const BlockDev& d : family) {
    if (d.via.rfind("built on ", 0) == 0) {
      return fmt::format(
          "{} is in use by a device built on it (device mapper, LVM, "
          "dm-crypt or md RAID)",
          Who(d));
    }
  }
  return std::nullopt;
}

Status CheckRawDevice(const BenchOptions& o, const std::string& device,
                      unsigned dev_major, unsigned dev_minor, uint64_t bytes) {
  if (o.create || o.keep) {
    return Status::InvalidArgument(fmt::format(
        "--{} is about a file the run makes, and --path {} is a raw block "
        "device, which is never created or removed; drop --{}",
        o.create ? "create" : "keep", device, o.create ? "create" : "keep"));
  }
  if (!o.destroy_data_on.empty()) {
    STRATA_RETURN_IF_ERROR(
        CheckNamesDevice(o.destroy_data_on, device, dev_major, dev_minor));
  }
  const std::string id =
      fmt::format("{} ({}:{})", device, dev_major, dev_minor);
  const std::string name = SysName(device, dev_major, dev_minor);
  STRATA_RETURN_IF_ERROR(CheckFits(o, id, name, bytes));
  if (!RunWrites(o)) return Status::Ok();
  if (o.destroy_data_on.empty()) {
    return Status::FailedPrecondition(fmt::format(
        "{} writes to the raw block device {}, which destroys the data on "
        "it (its file system, partition table and files); if nothing on it "
        "is wanted, add --destroy-data-on {}{}",
        Writers(o), id, device,
        o.overwrite ? " (--overwrite is for files, not devices)" : ""));
  }
  if (auto why =
          DeviceInUse(DeviceFamily(name), ReadText("/proc/self/mountinfo"),
                      ReadText("/proc/swaps"))) {
    return Status::FailedPrecondition(fmt::format(
        "will not write to {}, even with --destroy-data-on: {}; unmount it "
        "or stop what uses it first",
        id, *why));
  }
  return Status::Ok();
}

Result<DeviceClaim> DeviceClaim::Take(const std::string& device) {
  const int fd = open(device.c_str(), O_RDONLY | O_EXCL | O_CLOEXEC);
  if (fd >= 0) return DeviceClaim(fd);
  const int err = errno;
  if (err == EBUSY) {
    return Status::FailedPrecondition(
        "will not write to " + device +
        ": the kernel says something holds it (a mount, perhaps in another "
        "mount namespace, swap, md RAID or device mapper); stop that use "
        "first");
  }
  return aio::ErrnoStatus(err, "cannot open " + device);
}

DeviceClaim::DeviceClaim(DeviceClaim&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)) {}

DeviceClaim& DeviceClaim::operator=(DeviceClaim&& other) noexcept {
  std::swap(fd_, other.fd_);
  return *this;
}

DeviceClaim::~DeviceClaim() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace strata::bench
