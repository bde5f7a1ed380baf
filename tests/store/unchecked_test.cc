// Host copies whose NVMe reads a pass verifies (Note [Unchecked host
// copies] in src/store/residency_checks.cc): no byte of one reaches a
// view or the device unverified, the fetch that takes the check over gets
// the digest, and the chunks of a pass that found corrupt bytes are lost
// until overwritten or restored.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "tests/store/speculation_fixture.h"

namespace strata::store_test {
namespace {

constexpr RoleMask kCompute = RoleBit(Role::kCompute);

// The speculation fixture's group, with its master and compute copy read
// unchecked from NVMe, to be checked in a pass.
class UncheckedTest : public SpeculationTest {
 protected:
  void SetUp() override {
    SpeculationTest::SetUp();
    residency_->CheckInPass(group_, kMaster | kCompute);
  }

  // Writes seeded bytes into `roles` and sends them to NVMe.
  void WriteDown(RoleMask roles, uint64_t seed) {
    auto view =
        engine_->Fetch(group_, Tier::kHost, {.roles = roles, .write = true});
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    Fill(*view, seed);
    ASSERT_TRUE(view->pin.Release().ok());
    ASSERT_TRUE(engine_->Evict(group_, Tier::kDevice).ok());
    ASSERT_TRUE(engine_->Evict(group_, Tier::kHost).ok());
  }
  // Flips a bit of every 4 KiB of the swap files.
  void CorruptSwapFiles() {
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
      if (entry.path().extension() != ".bin") continue;
      const int fd = ::open(entry.path().c_str(), O_RDWR);
      ASSERT_GE(fd, 0) << entry.path();
      for (off_t at = 100; at < static_cast<off_t>(entry.file_size());
           at += 4096) {
        char byte = 0;
        ASSERT_EQ(::pread(fd, &byte, 1, at), 1);
        byte ^= 0x20;
        ASSERT_EQ(::pwrite(fd, &byte, 1, at), 1);
      }
      ::close(fd);
      ++files;
    }
    ASSERT_GT(files, 0);
  }
  // The group's `role` prefetched to the host: read, and left unchecked.
  void Prefetch(RoleMask roles) {
    ASSERT_TRUE(residency_->Prefetch(group_, Tier::kHost, roles, -1).ok());
  }
  static void ExpectMismatch(const Status& s, const std::string& role) {
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("'layer.0' (" + role + ")"), std::string::npos)
        << s.message();
  }
};

// The store leaves the read to the residency, which verifies the copy at
// its first use: a view gets the right bytes, and the store hashed none.
TEST_F(UncheckedTest, AViewOfAnUncheckedCopyGetsItsBytesVerified) {
  WriteDown(kMaster, 1);
  const uint64_t hashed = engine_->stats().nvme_bytes_hashed;
  Prefetch(kMaster);
  auto view = engine_->Fetch(group_, Tier::kHost, {.roles = kMaster});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Check(*view, 1);
  ASSERT_TRUE(view->pin.Release().ok());
  EXPECT_EQ(engine_->stats().nvme_bytes_hashed, hashed);
  EXPECT_GT(engine_->stats().bytes[2][1], 0u);
}

// A prefetch reads corrupt bytes without a word; the view that would use
// them fails, and so does every later one (the copy went stale: the next
// read fails again), and so does a fetch to the device through the host.
TEST_F(UncheckedTest, CorruptBytesReachNoViewAndNoDevice) {
  WriteDown(kMaster | kCompute, 1);
  CorruptSwapFiles();
  Prefetch(kMaster | kCompute);
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto view = engine_->Fetch(group_, Tier::kHost, {.roles = kMaster});
    ASSERT_FALSE(view.ok());
    ExpectMismatch(view.status(), "master");
  }
  auto device = engine_->Fetch(group_, Tier::kDevice, {.roles = kCompute});
  ASSERT_FALSE(device.ok());
  ExpectMismatch(device.status(), "compute");
}

// The fetch that names the role in Access::checked is handed the digest
// instead of a check; the pass that finds a mismatch marks the chunks
// lost: every fetch then fails, until a fetch overwrites them.
TEST_F(UncheckedTest, ThePassGetsTheDigestAndLosesWhatItFoundCorrupt) {
  WriteDown(kMaster, 1);
  CorruptSwapFiles();
  auto fetched = residency_->FetchToHost(
      group_, {.update = kMaster, .checked = kMaster}, false);
  ASSERT_TRUE(fetched.ok()) << fetched.status().ToString();
  const Residency::Unchecked read = fetched->unchecked[Role::kMaster];
  ASSERT_NE(read.digest, nullptr);
  const char* bytes = fetched->base[Role::kMaster];
  const tier::Segment* bad = tier::FirstMismatch(*read.digest, bytes);
  ASSERT_NE(bad, nullptr) << "the fetch verified nothing";
  const Status mismatch =
      residency_->Mismatch(group_, Role::kMaster, read, *bad,
                           tier::Hash(bytes + bad->offset, bad->bytes));
  ExpectMismatch(mismatch, "master");
  residency_->MarkLost(fetched->hold, mismatch);
  ASSERT_TRUE(fetched->pin.Release().ok());
  auto lost = engine_->Fetch(group_, Tier::kHost, {.roles = kMaster});
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(lost.status().message().find("was lost"), std::string::npos)
      << lost.status().message();
  // A chunk the hold did not write stays as it was.
  auto compute = engine_->Fetch(group_, Tier::kDevice, {.roles = kCompute});
  ASSERT_TRUE(compute.ok()) << compute.status().ToString();
  ASSERT_TRUE(compute->pin.Release().ok());
  auto load = engine_->Fetch(
      group_, Tier::kHost, {.roles = kMaster, .write = true, .discard = true});
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  Fill(*load, 2);
  ASSERT_TRUE(load->pin.Release().ok());
  auto view = engine_->Fetch(group_, Tier::kHost, {.roles = kMaster});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Check(*view, 2);
  ASSERT_TRUE(view->pin.Release().ok());
}

// A speculative pass that found its bytes corrupt is undone: the old
// extent comes back, and its bytes are read (and verified) again.
TEST_F(UncheckedTest, AnUndoneSpeculativeStepBringsTheOldBytesBack) {
  ASSERT_TRUE(residency_->AddSpares(group_, kMaster).ok());
  WriteDown(kMaster, 1);
  auto fetched = residency_->FetchToHost(
      group_, {.update = kMaster, .checked = kMaster}, true);
  ASSERT_TRUE(fetched.ok()) << fetched.status().ToString();
  ASSERT_NE(fetched->unchecked[Role::kMaster].digest, nullptr);
  residency_->MarkLost(fetched->hold, Status::DataLoss("a test's mismatch"));
  ASSERT_TRUE(fetched->pin.Release().ok());
  ASSERT_TRUE(
      residency_->EndSpeculation(group_, Residency::Outcome::kRestore).ok());
  auto view = engine_->Fetch(group_, Tier::kHost, {.roles = kMaster});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Check(*view, 1);
  ASSERT_TRUE(view->pin.Release().ok());
}

}  // namespace
}  // namespace strata::store_test
