// Host copies whose NVMe reads a pass verifies (Note [Unchecked host
// copies] in src/store/residency_checks.cc): no byte of one reaches a
// view or the device unverified, the fetch that takes the check over gets
// the digest, and the chunks of a pass that found corrupt bytes are lost
// until overwritten or restored.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <string>

#include "tests/store/speculation_fixture.h"

namespace strata::store_test {
namespace {

constexpr RoleMask kCompute = RoleBit(Role::kCompute);

// Holds the reads that complete while it is armed until released.
class ReadGate : public aio::FaultInjector {
 public:
  void AfterRead(uint64_t, char*, uint32_t) override {
    if (!armed) return;
    reached = true;
    while (!released) std::this_thread::yield();
  }
  std::atomic<bool> armed{false}, reached{false}, released{false};
};

// The speculation fixture's group, with its master and compute copy read
// unchecked from NVMe, to be checked in a pass.
class UncheckedTest : public SpeculationTest {
 protected:
  UncheckedTest() { injector_ = &gate_; }
  void TearDown() override { engine_.reset(); }  // before the gate goes
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
  // The pass's fetch of the master (and the compute copy beside it).
  Result<Residency::Fetched> FetchForPass() {
    return residency_->FetchToHost(
        group_, {.update = kMaster | kCompute, .checked = kMaster}, false);
  }
  static void ExpectMismatch(const Status& s, const std::string& role) {
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("'layer.0' (" + role + ")"), std::string::npos)
        << s.message();
  }

  ReadGate gate_;
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
// instead of a check; the pass that finds a mismatch marks the chunks it
// writes lost: every fetch of them then fails, until a fetch overwrites
// them.
TEST_F(UncheckedTest, ThePassGetsTheDigestAndLosesWhatItFoundCorrupt) {
  WriteDown(kMaster, 1);
  CorruptSwapFiles();
  auto fetched = FetchForPass();
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
  // Every chunk the hold wrote (the pass stepped part of each).
  for (RoleMask role : {kMaster, kCompute}) {
    auto lost = engine_->Fetch(group_, Tier::kHost, {.roles = role});
    ASSERT_FALSE(lost.ok());
    EXPECT_EQ(lost.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(lost.status().message().find("was lost"), std::string::npos)
        << lost.status().message();
  }
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

// A view that finds the copy corrupt while the pass's fetch has pinned
// it, still placing the compute copy, leaves the mark for that fetch: the
// pass gets the digest and finds the bytes corrupt too, rather than take
// them as verified.
TEST_F(UncheckedTest, ACheckThatFailsUnderThePassesPinLeavesItTheDigest) {
  WriteDown(kMaster, 1);
  CorruptSwapFiles();
  WriteDown(kCompute, 2);  // written after: good bytes
  Prefetch(kMaster);
  gate_.armed = true;  // the compute copy's read waits
  std::future<Result<Residency::Fetched>> pass =
      std::async(std::launch::async, [this] { return FetchForPass(); });
  while (!gate_.reached) std::this_thread::yield();
  gate_.armed = false;
  auto view = engine_->Fetch(group_, Tier::kHost, {.roles = kMaster});
  ASSERT_FALSE(view.ok());
  ExpectMismatch(view.status(), "master");
  gate_.released = true;
  Result<Residency::Fetched> fetched = pass.get();
  ASSERT_TRUE(fetched.ok()) << fetched.status().ToString();
  const Residency::Unchecked read = fetched->unchecked[Role::kMaster];
  ASSERT_NE(read.digest, nullptr) << "the pass would take corrupt bytes";
  EXPECT_NE(tier::FirstMismatch(*read.digest, fetched->base[Role::kMaster]),
            nullptr);
  ASSERT_TRUE(fetched->pin.Release().ok());
}

// While the pass holds the check, a view of the same copy waits for its
// end: it gets the bytes once verified (here: lost, as the pass found them
// corrupt), never bytes no one verified.
TEST_F(UncheckedTest, AViewWaitsForThePassThatChecksTheCopy) {
  WriteDown(kMaster, 1);
  CorruptSwapFiles();
  auto fetched = FetchForPass();
  ASSERT_TRUE(fetched.ok()) << fetched.status().ToString();
  ASSERT_NE(fetched->unchecked[Role::kMaster].digest, nullptr);
  std::future<Result<GroupView>> view = std::async(std::launch::async, [this] {
    return engine_->Fetch(group_, Tier::kHost, {.roles = kMaster});
  });
  EXPECT_EQ(view.wait_for(std::chrono::milliseconds(200)),
            std::future_status::timeout)
      << "the view got bytes the pass had not verified";
  residency_->MarkLost(fetched->hold, Status::DataLoss("the pass's mismatch"));
  ASSERT_TRUE(fetched->pin.Release().ok());
  Result<GroupView> got = view.get();
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("was lost"), std::string::npos)
      << got.status().message();
}

}  // namespace
}  // namespace strata::store_test
