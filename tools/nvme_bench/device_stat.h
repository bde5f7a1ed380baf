// What the block device under a file saw during a run: the deltas of its
// kernel counters (/sys/block/<disk>/stat, Documentation/block/stat.rst).
//
// The application's IOPS and the device's requests differ when the block
// layer merges contiguous requests (a plugged batch of sequential writes
// reaches the device as a few 4 MiB requests) or splits large ones
// (max_sectors_kb). A fio user reads "IOPS" as what the drive served, so
// strata-nvme-bench reports both, and says when they part.
//
// The counters are the whole disk's (a partition's I/O is counted on its
// disk too): anything else using the disk during a run is counted with it.
//
// Usage:
//   auto disk = DiskStat::ForPath("/mnt/nvme/file");   // kNotFound: tmpfs
//   DiskCounters before = disk->Read().value();
//   ... run ...
//   DeviceFigures seen = Delta(before, disk->Read().value());
#ifndef STRATA_TOOLS_NVME_BENCH_DEVICE_STAT_H_
#define STRATA_TOOLS_NVME_BENCH_DEVICE_STAT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata::bench {

// The first eight fields of a stat file: I/Os completed, merged into another
// request, 512-byte sectors moved, for reads and for writes.
struct DiskCounters {
  uint64_t reads = 0;
  uint64_t read_merges = 0;
  uint64_t read_sectors = 0;
  uint64_t writes = 0;
  uint64_t write_merges = 0;
  uint64_t write_sectors = 0;
};

// Parses the text of a stat file (11, 15 or 17 fields, as kernels since
// 2.6, 4.18 and 5.5 write it).
Result<DiskCounters> ParseDiskStat(std::string_view text);

// What the device served between two readings.
struct DeviceFigures {
  uint64_t requests = 0;  // reads + writes the device completed
  uint64_t merges = 0;    // requests merged into others before it saw them
  uint64_t bytes = 0;

  double mean_request_bytes() const {
    return requests > 0 ? static_cast<double>(bytes) / requests : 0;
  }
};

DeviceFigures Delta(const DiskCounters& before, const DiskCounters& after);

// The disk whose counters cover a path.
class DiskStat {
 public:
  // For the file system holding `path` (which must exist), or for the
  // block device `path` is: the device of st_dev (st_rdev) under
  // `sys_root`/dev/block, its whole disk when it is a partition. kNotFound when
  // the file system is on no block device (tmpfs, overlay, NFS), naming the
  // path.
  static Result<DiskStat> ForPath(const std::string& path,
                                  const std::string& sys_root = "/sys");

  const std::string& name() const { return name_; }  // e.g. "nvme0n1"
  Result<DiskCounters> Read() const;

 private:
  DiskStat(std::string name, std::string stat_path)
      : name_(std::move(name)), stat_path_(std::move(stat_path)) {}

  std::string name_;
  std::string stat_path_;
};

// The disks under a job's files, each once, read as one: a job striped
// over files on two drives counts both, and two files on one disk count it
// once.
class DiskSet {
 public:
  // The disk of each path; a path on no block device is left out, and the
  // reason joins *missing ("" when every path has a disk).
  static DiskSet ForPaths(const std::vector<std::string>& paths,
                          std::string* missing);

  bool empty() const { return disks_.empty(); }
  // "vda", or "vda+vdb" for several.
  std::string name() const;
  // The disks' counters, summed.
  Result<DiskCounters> Read() const;

 private:
  std::vector<DiskStat> disks_;
};

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_DEVICE_STAT_H_
