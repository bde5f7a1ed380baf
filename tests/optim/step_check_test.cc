// optim::StepCheck (src/optim/step_check.h): which segments the pass
// verifies piece by piece, which before it and which after it, and the
// first mismatch it reports.
#include "src/optim/step_check.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace strata::optim {
namespace {

// 4 segments of 1 KiB over `bytes`; segment 3 covers no piece's range.
struct Fixture {
  std::vector<char> bytes = std::vector<char>(4096, 7);
  std::vector<std::string> mismatches;  // "role@offset", in the order found
  std::unique_ptr<StepCheck> check;

  Fixture() {
    auto digest = std::make_shared<tier::Digest>();
    for (uint64_t at = 0; at < 4096; at += 1024) {
      digest->push_back({at, 1024, tier::Hash(bytes.data() + at, 1024)});
    }
    check = std::make_unique<StepCheck>(
        std::vector<StepCheck::Chunk>{
            {Role::kState1, bytes.data(), {digest, {}}},
            {Role::kState2, bytes.data(), {nullptr, {}}}},
        [this](Role role, const store::Residency::Unchecked&,
               const tier::Segment& bad, uint64_t) {
          mismatches.push_back(std::string(RoleName(role)) + "@" +
                               std::to_string(bad.offset));
          return Status::DataLoss("mismatch");
        });
    for (uint64_t at = 0; at < 3072; at += 1024) {
      check->Expect(Role::kState1, at, 1024);
    }
    check->Expect(Role::kState1, 3072, 512);  // not a segment's range
  }
};

TEST(StepCheckTest, ThePassVerifiesItsPiecesAndTheRestIsVerifiedAroundIt) {
  Fixture f;
  f.bytes[3500] ^= 1;  // in the segment no piece covers
  f.bytes[1500] ^= 1;  // in the second piece
  EXPECT_EQ(f.check->VerifyUnexpected().code(), StatusCode::kDataLoss);
  EXPECT_EQ(f.mismatches, std::vector<std::string>{"state1@3072"})
      << "verified a piece's segment before the pass";
  EXPECT_TRUE(f.check->Check(Role::kState1, 0, 1024));
  EXPECT_FALSE(f.check->Check(Role::kState1, 1024, 1024));
  EXPECT_TRUE(f.check->Check(Role::kState2, 1024, 1024)) << "no digest";
  EXPECT_TRUE(f.check->Check(Role::kState1, 1024, 512)) << "no segment";
  EXPECT_EQ(f.mismatches.size(), 2u);
  EXPECT_TRUE(f.check->failed());
  const Status finished = f.check->Finish();
  EXPECT_EQ(finished.code(), StatusCode::kDataLoss);
  EXPECT_EQ(f.mismatches.size(), 2u) << "verified a segment twice";
}

// A pass that stopped early left segments it did not reach: Finish
// verifies them.
TEST(StepCheckTest, FinishVerifiesWhatThePassDidNotReach) {
  Fixture f;
  ASSERT_TRUE(f.check->VerifyUnexpected().ok());
  EXPECT_TRUE(f.check->Check(Role::kState1, 0, 1024));
  f.bytes[2100] ^= 1;
  EXPECT_FALSE(f.check->failed());
  EXPECT_EQ(f.check->Finish().code(), StatusCode::kDataLoss);
  EXPECT_EQ(f.mismatches, std::vector<std::string>{"state1@2048"});
}

TEST(StepCheckTest, BytesThatMatchPass) {
  Fixture f;
  ASSERT_TRUE(f.check->VerifyUnexpected().ok());
  for (uint64_t at = 0; at < 3072; at += 1024) {
    EXPECT_TRUE(f.check->Check(Role::kState1, at, 1024));
  }
  EXPECT_TRUE(f.check->Finish().ok());
  EXPECT_TRUE(f.mismatches.empty());
}

}  // namespace
}  // namespace strata::optim
