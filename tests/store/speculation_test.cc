// Speculative writes (Note [Speculative writes] in
// src/store/residency_speculation.cc): a chunk homed on NVMe keeps its old
// bytes in one extent while its new bytes go to the other, until they are kept
// or the old ones restored. And discarded bytes (Note [Discarded bytes]): a
// chunk whose contents ended is blank again, and nothing of it is written down.
#include <gtest/gtest.h>

#include <string>

#include "tests/store/speculation_fixture.h"

namespace strata::store_test {
namespace {

// Kept: the new bytes are the chunk's, through NVMe; twice in a row, so
// each extent is in turn the one written.
TEST_F(SpeculationTest, KeptBytesAreTheNewOnes) {
  ASSERT_TRUE(residency_->AddSpares(group_, kMaster).ok());
  Write(1);
  ASSERT_TRUE(engine_->Evict(group_, Tier::kHost).ok());
  for (uint64_t seed : {2, 3}) {
    Speculate(seed);
    ASSERT_TRUE(engine_->Evict(group_, Tier::kHost).ok());
    ASSERT_TRUE(
        residency_->EndSpeculation(group_, Residency::Outcome::kKeep).ok());
    ExpectMaster(seed);
  }
}

// Restored: the old bytes come back whether the new ones were still on the
// host or already written down, after a kept speculation too, and without
// reading anything to restore them.
TEST_F(SpeculationTest, RestoredBytesAreTheOldOnes) {
  ASSERT_TRUE(residency_->AddSpares(group_, kMaster).ok());
  Write(1);
  ASSERT_TRUE(engine_->Evict(group_, Tier::kHost).ok());
  for (bool written_down : {false, true}) {
    SCOPED_TRACE(written_down ? "written down" : "on the host");
    const uint64_t before = residency_->Version(group_, Role::kMaster);
    Speculate(7);
    if (written_down) {
      ASSERT_TRUE(engine_->Evict(group_, Tier::kHost).ok());
    }
    const uint64_t reads = NvmeReads();
    ASSERT_TRUE(
        residency_->EndSpeculation(group_, Residency::Outcome::kRestore).ok());
    EXPECT_EQ(NvmeReads(), reads);
    EXPECT_GT(residency_->Version(group_, Role::kMaster), before + 1);
    ExpectMaster(1);
  }
  Speculate(2);
  ASSERT_TRUE(
      residency_->EndSpeculation(group_, Residency::Outcome::kKeep).ok());
  Speculate(8);
  ASSERT_TRUE(engine_->Evict(group_, Tier::kHost).ok());
  ASSERT_TRUE(
      residency_->EndSpeculation(group_, Residency::Outcome::kRestore).ok());
  ExpectMaster(2);
}

// Old bytes whose only copy was on the host are written down first; a
// chunk never written restores to zeros.
TEST_F(SpeculationTest, OldBytesOnlyOnTheHostOrNeverWrittenComeBack) {
  ASSERT_TRUE(residency_->AddSpares(group_, kMaster).ok());
  Speculate(5);
  ASSERT_TRUE(engine_->Evict(group_, Tier::kHost).ok());
  ASSERT_TRUE(
      residency_->EndSpeculation(group_, Residency::Outcome::kRestore).ok());
  ExpectZeros();
  Write(1);  // dirty on the host, never written to NVMe
  Speculate(6);
  ASSERT_TRUE(
      residency_->EndSpeculation(group_, Residency::Outcome::kRestore).ok());
  ExpectMaster(1);
}

// A restore cannot take bytes from under a view: it says so, and works once
// the view is released.
TEST_F(SpeculationTest, ARestoreRefusesWhileTheChunkIsFetched) {
  ASSERT_TRUE(residency_->AddSpares(group_, kMaster).ok());
  Write(1);
  Speculate(2);
  auto view = engine_->Fetch(group_, Tier::kHost, {.roles = kMaster});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  const Status refused =
      residency_->EndSpeculation(group_, Residency::Outcome::kRestore);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("layer.0"), std::string::npos)
      << refused.message();
  ASSERT_TRUE(view->pin.Release().ok());
  ASSERT_TRUE(
      residency_->EndSpeculation(group_, Residency::Outcome::kRestore).ok());
  ExpectMaster(1);
}

// Without speculation a write goes to the one extent, and chunks homed
// elsewhere get no spare.
TEST_F(SpeculationTest, WithoutSparesAWriteIsAPlainWrite) {
  Write(1);
  ASSERT_TRUE(engine_->Evict(group_, Tier::kHost).ok());
  Speculate(2);
  ASSERT_TRUE(
      residency_->EndSpeculation(group_, Residency::Outcome::kRestore).ok());
  ExpectMaster(2);
}

class SmallNvmeTest : public SpeculationTest {
 protected:
  SmallNvmeTest() { nvme_budget_ = 256 * kKiB; }  // four files of 64 KiB
};

// Two groups of a 64 KiB master and a 32 KiB compute chunk leave 64 KiB,
// not in one piece: the compute's second extent fits, the master's does
// not, and the compute's is given back.
TEST_F(SmallNvmeTest, SparesBeyondTheNvmeBudgetAreRefusedByName) {
  ASSERT_TRUE(engine_->RegisterGroup(Layer("layer.1", 16384)).ok());
  const uint64_t used = engine_->stats().tiers[2].used;
  const Status refused = residency_->AddSpares(group_, kAllRoles);
  EXPECT_EQ(refused.code(), StatusCode::kNoSpace) << refused.ToString();
  EXPECT_NE(
      refused.message().find("second NVMe extent for group 'layer.0' (master)"),
      std::string::npos)
      << refused.message();
  EXPECT_EQ(engine_->stats().tiers[2].used, used);
  ASSERT_TRUE(residency_->AddSpares(group_, RoleBit(Role::kCompute)).ok());
  EXPECT_EQ(engine_->stats().tiers[2].used, used + 32 * kKiB);
  Write(1);
  ExpectMaster(1);
}

using DiscardTest = SpeculationTest;
constexpr uint64_t kMasterBytes = 16384 * 4;

// Dirty bytes only the host held are dropped unwritten when they end, and
// counted; the chunk reads as zeros without I/O, and takes new bytes as
// before.
TEST_F(DiscardTest, DirtyBytesThatEndedAreNeverWritten) {
  Write(1);
  ASSERT_TRUE(Discard().ok());
  EXPECT_EQ(engine_->stats().discarded_bytes, kMasterBytes);
  ASSERT_TRUE(engine_->Evict(group_, Tier::kHost).ok());
  EXPECT_EQ(NvmeWrites(), 0u);
  ExpectZeros();
  EXPECT_EQ(NvmeReads(), 0u);
  Write(2);
  ExpectMaster(2);
  EXPECT_EQ(NvmeWrites(), kMasterBytes);
}

// Bytes already at home are not counted as saved, and are not read again.
TEST_F(DiscardTest, BytesAtHomeReadAsZerosWithoutIo) {
  Write(1);
  ASSERT_TRUE(engine_->Evict(group_, Tier::kHost).ok());
  const uint64_t reads = NvmeReads();
  ASSERT_TRUE(Discard().ok());
  EXPECT_EQ(engine_->stats().discarded_bytes, 0u);
  ExpectZeros();
  EXPECT_EQ(NvmeReads(), reads);
}

// A view fetched before the discard keeps its bytes (Note [Retired
// copies]); a fetch after it sees zeros.
TEST_F(DiscardTest, AViewKeepsItsBytes) {
  Write(1);
  auto view = engine_->Fetch(group_, Tier::kHost, {.roles = kMaster});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  ASSERT_TRUE(Discard().ok());
  Check(*view, 1);
  ASSERT_TRUE(view->pin.Release().ok());
  ExpectZeros();
}

// Bytes being written, or speculative ones, cannot end: refused by name,
// and nothing changes.
TEST_F(DiscardTest, RefusedWhileWrittenOrSpeculative) {
  Write(1);
  auto view =
      engine_->Fetch(group_, Tier::kHost, {.roles = kMaster, .write = true});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Status refused = Discard();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("layer.0"), std::string::npos)
      << refused.message();
  Fill(*view, 2);
  ASSERT_TRUE(view->pin.Release().ok());
  ASSERT_TRUE(residency_->AddSpares(group_, kMaster).ok());
  Speculate(3);
  refused = Discard();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("speculative"), std::string::npos)
      << refused.message();
  ASSERT_TRUE(
      residency_->EndSpeculation(group_, Residency::Outcome::kRestore).ok());
  ExpectMaster(2);
}

// A speculation on a discarded chunk restores it to zeros, not to the
// bytes its extent held before the discard.
TEST_F(DiscardTest, ARestoreAfterADiscardGivesZeros) {
  ASSERT_TRUE(residency_->AddSpares(group_, kMaster).ok());
  Write(1);
  ASSERT_TRUE(engine_->Evict(group_, Tier::kHost).ok());
  ASSERT_TRUE(Discard().ok());
  Speculate(4);
  ASSERT_TRUE(engine_->Evict(group_, Tier::kHost).ok());
  ASSERT_TRUE(
      residency_->EndSpeculation(group_, Residency::Outcome::kRestore).ok());
  ExpectZeros();
}

}  // namespace
}  // namespace strata::store_test
