// Where strata-nvme-bench runs, checked before anything is created or
// written: the file --path names, the file system and device that hold it
// (or the raw block device it is), and whether the run may write it and
// has room for it.
//
// Failure: every check returns a Status that names the problem and the
// fix. Thread safety: pure functions and reads of the file system.
#ifndef STRATA_TOOLS_NVME_BENCH_PLACE_H_
#define STRATA_TOOLS_NVME_BENCH_PLACE_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"
#include "tools/nvme_bench/cli.h"

namespace strata::bench {

// The file the benchmark makes in a directory given as --path.
inline constexpr char kBenchFileName[] = "strata-nvme-bench.dat";

struct Placement {
  std::string file;
  std::string dir;    // the directory that holds `file`
  bool ours = false;  // created (or named) by the benchmark: may be written
                      // and is removed afterwards unless --keep
  // A raw block device: `file` is --path with links resolved. Never
  // created, grown or removed (Note [Writing a raw device] in
  // tools/nvme_bench/raw_device.h).
  bool device = false;
};

// A directory gets kBenchFileName in it; an existing regular file or block
// device is used as it is. A path that does not exist is kNotFound, with
// both fixes, unless --create makes it name a new file in an existing
// directory.
Result<Placement> Place(const BenchOptions& o, const std::string& path);

// Every one of o.paths, in order; a file named twice (two paths to one
// directory, say), or devices mixed with files, is kInvalidArgument.
Result<std::vector<Placement>> PlaceAll(const BenchOptions& o);

struct MountEntry {
  std::string mount_point;
  std::string type;    // "ext4", "tmpfs"
  std::string source;  // "/dev/vda", "tmpfs"
  std::string device;  // the mount's st_dev, "254:0"
};

// The lines of `mountinfo` (the text of /proc/self/mountinfo) that parse,
// in order.
std::vector<MountEntry> ParseMountInfo(std::string_view mountinfo);

// The mount that holds `path` (absolute, links resolved) according to
// `mountinfo`, the text of /proc/self/mountinfo: the longest mount point
// that contains it, and of several stacked on one point the last (the one
// on top). nullopt when no line parses.
std::optional<MountEntry> FindMount(std::string_view mountinfo,
                                    const std::string& path);

struct FileSystem {
  std::string type;    // "" when /proc/self/mountinfo could not tell
  std::string source;  // as mounted: "/dev/vda"
  unsigned major = 0;  // the block device, or st_dev when there is none
  unsigned minor = 0;
  bool block_device = false;  // st_dev is a block device's (major not 0),
                              // or the mount's source is one (btrfs)
  bool raw = false;  // `path` is a block device (source): no file system
};

// The file system and device that hold `path`, which must exist, or the
// device it is.
FileSystem FileSystemOf(const std::string& path);

// "ext4, /dev/vda (254:0)", or for a file system on no block device
// "tmpfs (not a block device: ...)" with why the figures mean nothing for
// a drive, or "raw block device /dev/nvme0n1 (259:0), no file system".
std::string FileSystemText(const FileSystem& fs);

// What one file of the run holds: its share of --size (FileShare in
// workload.h), and the bytes of all the run's files on its file system.
struct Share {
  uint64_t file_bytes = 0;
  uint64_t fs_bytes = 0;
};

// Someone else's file is neither written nor grown without --overwrite,
// and a read-only run needs it to hold its share; the files the run creates
// or grows must fit in the free space (counting what they hold already). A
// raw device gets the checks of Note [Writing a raw device] instead, its
// share held against its size.
Status CheckPlacement(const BenchOptions& o, const Placement& place,
                      const FileSystem& fs, const Share& share);

// Every --destroy-data-on names a raw device among `places` (CheckPlacement
// has seen that each device the run writes is named): a stray one is a
// mistyped device, refused rather than ignored.
Status CheckDestroyFlags(const BenchOptions& o,
                         const std::vector<Placement>& places);

// Whether the run may write the file, once CheckPlacement has passed: its
// own file, someone else's with --overwrite, a raw device when the run
// writes (a run that only reads never writes a device, even to prefill).
bool MayWrite(const BenchOptions& o, const Placement& place);

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_PLACE_H_
