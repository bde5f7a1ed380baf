// strata-nvme-bench on a raw block device (Note [Writing a raw device] in
// tools/nvme_bench/raw_device.h): the pure checks on mountinfo, swaps and a
// fake /sys, then the real binary on a loop device over a scratch file,
// which skips visibly where no loop device can be set up.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/testutil/testutil.h"
#include "tests/tools/nvme_bench_cli.h"
#include "tools/nvme_bench/raw_device.h"

namespace strata::bench {
namespace {

namespace stdfs = std::filesystem;

const std::vector<BlockDev> kNvme = {
    {"nvme0n1", 259, 0, ""},
    {"nvme0n1p1", 259, 1, "a partition of nvme0n1"},
    {"nvme0n1p2", 259, 2, "a partition of nvme0n1"},
};

constexpr char kOtherMounts[] =
    "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "30 22 0:25 / /tmp rw - tmpfs tmpfs rw\n"
    "a line that does not parse\n";

std::optional<std::string> InUse(const std::string& mounts,
                                 const std::string& swaps = "",
                                 const std::vector<BlockDev>& family = kNvme) {
  return DeviceInUse(family, kOtherMounts + mounts, swaps);
}

TEST(RawDeviceTest, AMountOfTheDeviceOrAPartitionOfItIsFound) {
  EXPECT_EQ(InUse(""), std::nullopt);
  EXPECT_EQ(InUse("31 22 259:1 / /boot rw - vfat /dev/nvme0n1p1 rw\n"),
            "/dev/nvme0n1p1 (a partition of nvme0n1) is mounted on /boot "
            "(vfat)");
  // The root file system, by number: its source may be /dev/root.
  EXPECT_EQ(InUse("32 1 259:2 / / rw - ext4 /dev/root rw\n"),
            "/dev/nvme0n1p2 (a partition of nvme0n1) is mounted on / (ext4, "
            "the root file system)");
  // btrfs gives its mounts an anonymous number: found by source.
  EXPECT_EQ(InUse("33 22 0:41 / /data\\040x rw - btrfs /dev/nvme0n1 rw\n"),
            "/dev/nvme0n1 is mounted on /data x (btrfs)");
  // Another disk's partition whose name starts the same is no match.
  EXPECT_EQ(InUse("34 22 259:9 / /b rw - xfs /dev/nvme0n1p10 rw\n"),
            std::nullopt);
}

TEST(RawDeviceTest, SwapAndDevicesBuiltOnItAreFound) {
  EXPECT_EQ(InUse("",
                  "Filename\tType\tSize\tUsed\tPriority\n"
                  "/dev/nvme0n1p2\tpartition\t1048572\t0\t-2\n"),
            "/dev/nvme0n1p2 (a partition of nvme0n1) is a swap area");
  std::vector<BlockDev> lvm = kNvme;
  lvm.push_back({"dm-0", 253, 0, "built on nvme0n1p2"});
  EXPECT_EQ(InUse("35 1 253:0 / / rw - ext4 /dev/mapper/vg-root rw\n", "", lvm),
            "/dev/dm-0 (built on nvme0n1p2) is mounted on / (ext4, the root "
            "file system)");
  EXPECT_EQ(InUse("", "", lvm),
            "/dev/dm-0 (built on nvme0n1p2) is in use by a device built on "
            "it (device mapper, LVM, dm-crypt or md RAID)");
}

void WriteText(const stdfs::path& path, const std::string& text) {
  stdfs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

// /sys/class/block as the kernel lays it out: a partition is a directory
// of its disk with a "partition" file, and has a link of its own.
TEST(RawDeviceTest, FamilyIsTheDeviceItsPartitionsAndWhatIsBuiltOnThem) {
  testutil::ScratchDir sys;
  const stdfs::path block = stdfs::path(sys.path()) / "class/block";
  WriteText(block / "loop7/dev", "7:7\n");
  WriteText(block / "loop7/queue/rotational", "0\n");
  WriteText(block / "loop7/loop7p1/dev", "259:4\n");
  WriteText(block / "loop7/loop7p1/partition", "1\n");
  stdfs::create_directory_symlink("loop7/loop7p1", block / "loop7p1");
  WriteText(block / "loop7p1/holders/dm-3", "");
  WriteText(block / "dm-3/dev", "253:3\n");
  WriteText(block / "dm-3/holders/dm-4", "");
  WriteText(block / "dm-4/dev", "253:4\n");
  const std::vector<BlockDev> family = DeviceFamily("loop7", sys.path());
  ASSERT_EQ(family.size(), 4u);
  EXPECT_EQ(family[0].name + " " + family[0].via, "loop7 ");
  EXPECT_EQ(family[0].major * 1000 + family[0].minor, 7007u);
  EXPECT_EQ(family[1].name + " " + family[1].via,
            "loop7p1 a partition of loop7");
  EXPECT_EQ(family[1].major * 1000 + family[1].minor, 259004u);
  EXPECT_EQ(family[2].name + " " + family[2].via, "dm-3 built on loop7p1");
  EXPECT_EQ(family[3].name + " " + family[3].via, "dm-4 built on dm-3");
  EXPECT_EQ(DeviceFamily("nvme9n9", sys.path()).size(), 1u);
}

// The real binary on a 16 MiB loop device over random bytes.
class RawDeviceCliTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kBytes = 16 << 20;

  void SetUp() override {
    loop_.emplace(kBytes, 5);
    if (!loop_->ok()) GTEST_SKIP() << loop_->error();
    before_ = ReadText(loop_->backing());
    ASSERT_EQ(before_.size(), kBytes);
  }
  void TearDown() override { loop_.reset(); }

  const std::string& dev() const { return loop_->path(); }
  std::string Data() const { return ReadText(loop_->backing()); }
  // A write refused before anything was written.
  void ExpectRefused(const std::string& args, const std::string& why) {
    SCOPED_TRACE(args);
    const Outcome o = Bench("--path " + dev() + " --size 8M " + args);
    EXPECT_EQ(o.status, 1) << o.output;
    EXPECT_TRUE(Contains(o.output, why)) << o.output;
    EXPECT_FALSE(Contains(o.output, "GB/s")) << o.output;
    EXPECT_TRUE(Data() == before_) << "the device was written";
  }

  std::optional<testutil::LoopDevice> loop_;
  std::string before_;
  testutil::ScratchDir dir_;
};

TEST_F(RawDeviceCliTest, ReadsNeedNoFlagAndReportTheDevicesOwnCounters) {
  const std::string json = dir_.File("out.json");
  const Outcome o =
      Bench("--path " + dev() +
            " --rw read,randread --bs 64K --size 8M --json " + json);
  ASSERT_EQ(o.status, 0) << o.output;
  const std::string name = stdfs::path(dev()).filename().string();
  EXPECT_TRUE(Contains(FirstLine(o.output),
                       "(16M, the jobs cover its first 8M) on raw block "
                       "device " +
                           dev() + " (7:"))
      << o.output;
  EXPECT_TRUE(Contains(FirstLine(o.output), "), no file system")) << o.output;
  std::ifstream in(json);
  const nlohmann::json records = nlohmann::json::parse(in, nullptr, false);
  ASSERT_EQ(records.size(), 2u) << o.output;
  for (const auto& r : records) {
    EXPECT_EQ(r["bytes"].get<uint64_t>(), 8u << 20) << r["rw"];
    EXPECT_EQ(r["device"]["disk"], name) << r["rw"];
    EXPECT_GE(r["device"]["bytes"].get<uint64_t>(), 8u << 20) << r["rw"];
  }
  EXPECT_TRUE(Data() == before_) << "a read-only run wrote the device";
  EXPECT_TRUE(stdfs::is_block_file(dev())) << "the device was removed";
}

TEST_F(RawDeviceCliTest, EveryWriteIsRefusedWithoutTheFlag) {
  const std::string fix =
      "destroys the data on it (its file system, "
      "partition table and files); if nothing on it is "
      "wanted, add --destroy-data-on " +
      dev();
  ExpectRefused("--rw read,write",
                "--rw write writes to the raw block "
                "device " +
                    dev());
  ExpectRefused("--rw randwrite,rw,randrw", fix);
  ExpectRefused("--verify", "--verify writes to the raw block device");
  ExpectRefused("--rw write --overwrite",
                fix + " (--overwrite is for files, not devices)");
}

TEST_F(RawDeviceCliTest, WithTheFlagAWriteRunsOnTheDeviceALinkNames) {
  const std::string link = dir_.File("by-id-disk");
  stdfs::create_symlink(dev(), link);
  const Outcome o = Bench("--path " + link +
                          " --rw write --size 8M --destroy-data-on " + dev());
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_TRUE(Contains(FirstLine(o.output),
                       dev() + " (16M, the jobs cover its first 8M) on raw"))
      << o.output;
  const std::string after = Data();
  ASSERT_EQ(after.size(), kBytes) << "the device's file was resized";
  EXPECT_NE(after.substr(0, 8 << 20), before_.substr(0, 8 << 20));
  EXPECT_EQ(after.substr(8 << 20), before_.substr(8 << 20))
      << "written past --size";
  EXPECT_TRUE(stdfs::is_block_file(dev())) << "the device was removed";
}

// A job striped over two devices (Note [Striping] in workload.h) writes
// each only when the flag names each, and then half of --size on each.
TEST_F(RawDeviceCliTest, AStripedJobWritesEveryDeviceTheFlagNames) {
  testutil::LoopDevice other(kBytes, 6);
  if (!other.ok()) GTEST_SKIP() << other.error();
  const std::string other_before = ReadText(other.backing());
  const std::string paths = dev() + ":" + other.path();
  ExpectRefused(
      "--path " + other.path() + " --rw write --destroy-data-on " + dev(),
      "--destroy-data-on does not name " + other.path());
  EXPECT_EQ(ReadText(other.backing()), other_before);
  const Outcome read = Bench("--path " + paths + " --rw read --size 8M");
  ASSERT_EQ(read.status, 0) << read.output;
  EXPECT_TRUE(Contains(read.output, "file 2: " + other.path())) << read.output;
  const Outcome o = Bench("--path " + paths +
                          " --rw write --size 8M --destroy-data-on " + paths);
  ASSERT_EQ(o.status, 0) << o.output;
  for (const auto& [after, before] :
       {std::pair{Data(), before_},
        std::pair{ReadText(other.backing()), other_before}}) {
    EXPECT_NE(after.substr(0, 4 << 20), before.substr(0, 4 << 20));
    EXPECT_EQ(after.substr(4 << 20), before.substr(4 << 20))
        << "written past the device's share";
  }
  const Outcome mixed = Bench("--path " + dev() + " --path " + dir_.path() +
                              " --rw read --size 8M");
  EXPECT_EQ(mixed.status, 1);
  EXPECT_TRUE(Contains(mixed.output, "mixes raw block devices and files"))
      << mixed.output;
}

TEST_F(RawDeviceCliTest, TheFlagMustNameThisDevice) {
  testutil::LoopDevice other(1 << 20, 6);
  if (other.ok()) {
    ExpectRefused("--rw write --destroy-data-on " + other.path(),
                  "--destroy-data-on does not name " + dev());
    ExpectRefused("--rw read --destroy-data-on " + other.path(),
                  "('" + other.path() + "' is " + other.path());
    // Naming this device and a stray one: the stray one is a mistake.
    ExpectRefused("--rw write --destroy-data-on " + dev() + ":" + other.path(),
                  "'" + other.path() + "' is no device that --path names");
  }
  ExpectRefused("--rw write --destroy-data-on " + loop_->backing(),
                "is not a block device; it must name the device --path "
                "names: --destroy-data-on " +
                    dev());
  const Outcome file = Bench("--path " + loop_->backing() +
                             " --rw read --size 8M --destroy-data-on " + dev());
  EXPECT_EQ(file.status, 1);
  EXPECT_TRUE(Contains(file.output, "is a file; drop it")) << file.output;
}

// What a mount in another namespace, md or device mapper does: an
// exclusive claim, which the run's own claim is refused by.
TEST_F(RawDeviceCliTest, ADeviceSomethingHoldsIsNotWritten) {
  const int held = open(dev().c_str(), O_RDONLY | O_EXCL | O_CLOEXEC);
  ASSERT_GE(held, 0) << std::strerror(errno);
  ExpectRefused("--rw write --destroy-data-on " + dev(),
                "the kernel says something holds it");
  EXPECT_EQ(Bench("--path " + dev() + " --rw read --size 8M").status, 0);
  close(held);
}

TEST_F(RawDeviceCliTest, FileOnlyOptionsAndTooLargeASizeAreRefused) {
  ExpectRefused("--rw read --create", "drop --create");
  ExpectRefused("--rw read --keep", "drop --keep");
  const Outcome big = Bench("--path " + dev() + " --rw read --size 32M");
  EXPECT_EQ(big.status, 1);
  EXPECT_TRUE(Contains(big.output, "--size 32M does not fit on " + dev()))
      << big.output;
}

TEST_F(RawDeviceCliTest, FioGetsTheDeviceAndWritesOnlyWithTheFlag) {
  if (std::system("fio --version >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "fio is not installed";
  }
  const std::string args = " --vs-fio --repeat 1 --fio-buffers malloc";
  ExpectRefused("--rw write" + args, "add --destroy-data-on " + dev());
  const Outcome o = Bench("--path " + dev() + " --size 8M --rw read,write" +
                          args + " --destroy-data-on " + dev());
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_TRUE(Contains(o.output, "strata/fio")) << o.output;
  EXPECT_NE(Data().substr(0, 8 << 20), before_.substr(0, 8 << 20));
}

}  // namespace
}  // namespace strata::bench
