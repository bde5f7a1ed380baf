// strata-nvme-bench on a raw block device (--path /dev/nvme0n1, or a link
// to one such as /dev/disk/by-id/...): whether the run may write it.
//
// Note [Writing a raw device]
// Reads need no flag: they change nothing, so a mounted device may be read.
// A run that writes (a write, randwrite, rw or randrw job, or --verify)
// destroys whatever the device holds: a file system, a partition table,
// someone's data. It needs --destroy-data-on naming the same device
// (links resolved; a job striped over several devices names each), and
// even then is refused while the device, a partition
// of it or a device built on them (device mapper, md) is mounted, swapped
// on or held. --overwrite, which is for files, is not enough. A device is
// never created, truncated or removed, so --create and --keep, which are
// about the file a run makes, are refused rather than silently ignored.
// A run that writes also claims the device exclusively (O_EXCL) for its
// whole length (DeviceClaim): the kernel refuses the claim while anything
// mounts or holds the device, even a mount this process cannot see (in
// another mount namespace), and refuses a mount while the run holds it.
//
// Failure: Status values that name the device, the rule and the fix.
// Thread safety: pure functions and reads of /proc and /sys.
#ifndef STRATA_TOOLS_NVME_BENCH_RAW_DEVICE_H_
#define STRATA_TOOLS_NVME_BENCH_RAW_DEVICE_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"
#include "tools/nvme_bench/cli.h"

namespace strata::bench {

struct BlockDev {
  std::string name;  // as in /sys/class/block: "nvme0n1p2", "dm-0"
  unsigned major = 0;
  unsigned minor = 0;
  // How it belongs to the device: "" (it is the device), "a partition of
  // nvme0n1", "built on nvme0n1p2".
  std::string via;
};

// The device `name` (as in `sys_root`/class/block), its partitions, and
// the devices built on any of them (their holders, recursively). Only the
// device itself when `sys_root` does not know it.
std::vector<BlockDev> DeviceFamily(const std::string& name,
                                   const std::string& sys_root = "/sys");

// Why `family` must not be written, or nullopt: a mount of any of them in
// `mountinfo` (the text of /proc/self/mountinfo), by device number or by
// source; a swap area on one in `swaps` (the text of /proc/swaps); a
// device built on them.
std::optional<std::string> DeviceInUse(const std::vector<BlockDev>& family,
                                       std::string_view mountinfo,
                                       std::string_view swaps);

// The rules of Note [Writing a raw device] for the run `o` on `device`
// (--path with links resolved), whose number is major:minor and which must
// hold `bytes` (its share of --size: Note [Striping] in workload.h).
Status CheckRawDevice(const BenchOptions& o, const std::string& device,
                      unsigned major, unsigned minor, uint64_t bytes);

// An exclusive claim on a block device (O_EXCL), held until destruction.
class DeviceClaim {
 public:
  // kFailedPrecondition naming the device when something holds it.
  static Result<DeviceClaim> Take(const std::string& device);
  DeviceClaim() = default;
  DeviceClaim(DeviceClaim&& other) noexcept;
  DeviceClaim& operator=(DeviceClaim&& other) noexcept;
  DeviceClaim(const DeviceClaim&) = delete;
  DeviceClaim& operator=(const DeviceClaim&) = delete;
  ~DeviceClaim();

 private:
  explicit DeviceClaim(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_RAW_DEVICE_H_
