#include "tools/nvme_bench/device_stat.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "strata/aio.h"

namespace strata::bench {

Result<DiskCounters> ParseDiskStat(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::vector<uint64_t> fields;
  for (uint64_t v; in >> v;) fields.push_back(v);
  if (!in.eof() ||
      (fields.size() != 11 && fields.size() != 15 && fields.size() != 17)) {
    return Status::InvalidArgument(
        "not a block device stat line (11, 15 or 17 numbers expected): '" +
        std::string(text.substr(0, 200)) + "'");
  }
  DiskCounters c;
  c.reads = fields[0];
  c.read_merges = fields[1];
  c.read_sectors = fields[2];
  c.writes = fields[4];
  c.write_merges = fields[5];
  c.write_sectors = fields[6];
  return c;
}

DeviceFigures Delta(const DiskCounters& before, const DiskCounters& after) {
  // The counters are unsigned longs that only grow; a wrap shows as a huge
  // delta rather than a negative one, so clamp it away.
  auto d = [](uint64_t a, uint64_t b) { return b >= a ? b - a : 0; };
  DeviceFigures f;
  f.requests = d(before.reads, after.reads) + d(before.writes, after.writes);
  f.merges = d(before.read_merges, after.read_merges) +
             d(before.write_merges, after.write_merges);
  f.bytes = 512 * (d(before.read_sectors, after.read_sectors) +
                   d(before.write_sectors, after.write_sectors));
  return f;
}

Result<DiskStat> DiskStat::ForPath(const std::string& path,
                                   const std::string& sys_root) {
  namespace fs = std::filesystem;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return aio::ErrnoStatus(errno, "stat '" + path + "'");
  }
  // A raw device is counted on itself, a file on its file system's device.
  const dev_t dev_id = S_ISBLK(st.st_mode) ? st.st_rdev : st.st_dev;
  const unsigned maj = major(dev_id), min = minor(dev_id);
  const std::string id = std::to_string(maj) + ":" + std::to_string(min);
  std::error_code ec;
  fs::path dev = fs::canonical(fs::path(sys_root) / "dev/block" / id, ec);
  if (maj == 0 || ec) {
    return Status::NotFound("'" + path + "' is on no block device (device " +
                            id + " has no " + sys_root + "/dev/block entry)");
  }
  if (fs::exists(dev / "partition", ec)) dev = dev.parent_path();
  DiskStat disk(dev.filename().string(), (dev / "stat").string());
  STRATA_RETURN_IF_ERROR(disk.Read().status());
  return disk;
}

Result<DiskCounters> DiskStat::Read() const {
  std::ifstream in(stat_path_);
  if (!in.is_open()) return Status::NotFound("cannot read " + stat_path_);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  Result<DiskCounters> c = ParseDiskStat(text);
  if (!c.ok()) {
    return Status::InvalidArgument(stat_path_ + ": " + c.status().message());
  }
  return c;
}

DiskSet DiskSet::ForPaths(const std::vector<std::string>& paths,
                          std::string* missing) {
  DiskSet set;
  missing->clear();
  for (const std::string& path : paths) {
    Result<DiskStat> disk = DiskStat::ForPath(path);
    if (!disk.ok()) {
      *missing += (missing->empty() ? "" : "; ") + disk.status().message();
      continue;
    }
    const bool known = std::any_of(
        set.disks_.begin(), set.disks_.end(),
        [&](const DiskStat& d) { return d.name() == disk->name(); });
    if (!known) set.disks_.push_back(*disk);
  }
  return set;
}

std::string DiskSet::name() const {
  std::string out;
  for (const DiskStat& d : disks_) out += (out.empty() ? "" : "+") + d.name();
  return out;
}

Result<DiskCounters> DiskSet::Read() const {
  DiskCounters sum;
  for (const DiskStat& d : disks_) {
    STRATA_ASSIGN_OR_RETURN(const DiskCounters c, d.Read());
    sum.reads += c.reads;
    sum.read_merges += c.read_merges;
    sum.read_sectors += c.read_sectors;
    sum.writes += c.writes;
    sum.write_merges += c.write_merges;
    sum.write_sectors += c.write_sectors;
  }
  return sum;
}

}  // namespace strata::bench
