// Extent digests (src/tier/digest.h), and the NVMe store's use of a digest
// its writer hands in (Note [Checksums in the optimizer's pass]).
#include "src/tier/digest.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "src/tier/nvme_store.h"
#include "tests/testutil/testutil.h"

namespace strata::tier {
namespace {

constexpr uint64_t kKiB = 1 << 10;

TEST(DigestTest, HashIsXxh3AtEveryLengthAndAlignment) {
  std::vector<char> data(3 * kDigestSegment + 777);
  testutil::FillRandom(data.data(), data.size(), 5);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 400; ++i) {
    const size_t at = rng() % 64;
    const size_t n = i < 300 ? rng() % 4097 : rng() % (data.size() - at);
    ASSERT_EQ(Hash(data.data() + at, n), XXH3_64bits(data.data() + at, n))
        << "at " << at << ", " << n << " bytes";
  }
}

TEST(DigestTest, DigestOfTilesInWholeSegmentsAndFindsTheBadOne) {
  std::vector<char> data(2 * kDigestSegment + 4096);
  testutil::FillRandom(data.data(), data.size(), 9);
  const Digest d = DigestOf(data.data(), data.size());
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[2].offset, 2 * kDigestSegment);
  EXPECT_EQ(d[2].bytes, 4096u);
  EXPECT_TRUE(Tiles(d, data.size()));
  EXPECT_EQ(FirstMismatch(d, data.data()), nullptr);
  data[kDigestSegment + 5] ^= 0x10;
  const Segment* bad = FirstMismatch(d, data.data());
  ASSERT_NE(bad, nullptr);
  EXPECT_EQ(bad->offset, kDigestSegment);
  EXPECT_TRUE(DigestOf(data.data(), 0).empty());
  EXPECT_TRUE(Tiles({}, 0));
}

TEST(DigestTest, TilesRefusesGapsOverlapsEmptyAndShortSegments) {
  EXPECT_TRUE(Tiles({{0, 10, 0}, {10, 6, 0}}, 16));
  EXPECT_FALSE(Tiles({{0, 10, 0}, {11, 5, 0}}, 16));  // a gap
  EXPECT_FALSE(Tiles({{0, 10, 0}, {9, 7, 0}}, 16));   // an overlap
  EXPECT_FALSE(Tiles({{0, 0, 0}, {0, 16, 0}}, 16));   // an empty one
  EXPECT_FALSE(Tiles({{0, 10, 0}}, 16));              // short
  EXPECT_FALSE(Tiles({{0, 10, 0}, {10, 8, 0}}, 16));  // past the end
  EXPECT_FALSE(Tiles({}, 16));
}

class StoreDigestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto engine = aio::Engine::Open(aio::IoOptions{});
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    NvmeStoreOptions o;
    o.dir = dir_.path();
    o.capacity = 1 << 20;
    o.files = 1;
    auto store = NvmeStore::Open(engine_.get(), o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    auto extent = store_->Allocate(256 * kKiB);
    ASSERT_TRUE(extent.ok());
    extent_ = *extent;
    aio::PinOptions po;
    po.lock = false;
    for (auto* b : {&out_, &in_}) {
      auto buffer = aio::PinnedBuffer::Allocate(extent_.bytes, po);
      ASSERT_TRUE(buffer.ok());
      *b = std::move(*buffer);
    }
    testutil::FillRandom(out_.data(), extent_.bytes, 3);
  }

  // The writer's own segments: 40 KiB, then the rest.
  std::shared_ptr<const Digest> WritersDigest() const {
    const char* p = static_cast<const char*>(out_.data());
    const uint64_t first = 40 * kKiB;
    return std::make_shared<const Digest>(
        Digest{{0, first, Hash(p, first)},
               {first, extent_.bytes - first,
                Hash(p + first, extent_.bytes - first)}});
  }

  testutil::ScratchDir dir_;
  std::unique_ptr<aio::Engine> engine_;
  std::unique_ptr<NvmeStore> store_;
  Extent extent_;
  aio::PinnedBuffer out_, in_;
};

TEST_F(StoreDigestTest, AWritersDigestIsUsedNotRecomputedAndVerifiesReads) {
  ASSERT_TRUE(store_->Write(extent_, out_.data(), WritersDigest()).ok());
  EXPECT_EQ(store_->stats().bytes_hashed, 0u);  // the write hashed nothing
  ASSERT_TRUE(store_->Read(extent_, in_.data()).ok());
  EXPECT_EQ(store_->stats().bytes_hashed, extent_.bytes);
  EXPECT_EQ(std::memcmp(in_.data(), out_.data(), extent_.bytes), 0);

  // One bit flipped on the file, in the writer's second segment: the read
  // names the segment's offset.
  const std::string path = store_->FilePath(extent_.file);
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const uint64_t at = extent_.offset + 100 * kKiB;
  char byte = static_cast<const char*>(out_.data())[100 * kKiB] ^ 4;
  ASSERT_EQ(pwrite(fd, &byte, 1, static_cast<off_t>(at)), 1);
  close(fd);
  const Status st = store_->Read(extent_, in_.data());
  ASSERT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_NE(st.message().find("at offset " +
                              std::to_string(extent_.offset + 40 * kKiB)),
            std::string::npos)
      << st.message();
  EXPECT_EQ(store_->stats().checksum_failures, 1u);
}

// ReadCheck::kCaller: the store hashes nothing and hands the caller the
// digest it recorded; the caller's mismatch is counted and worded as the
// store's own.
TEST_F(StoreDigestTest, AReadTheCallerVerifiesGetsTheDigestInstead) {
  const std::shared_ptr<const Digest> written = WritersDigest();
  ASSERT_TRUE(store_->Write(extent_, out_.data(), written).ok());
  auto io = store_->StartRead(extent_, in_.data(), ReadCheck::kCaller);
  ASSERT_TRUE(io.ok()) << io.status().ToString();
  ASSERT_TRUE(store_->FinishIo(*io).ok());
  EXPECT_EQ(io->digest, written);
  EXPECT_EQ(store_->stats().bytes_hashed, 0u);
  EXPECT_EQ(store_->stats().bytes_read, extent_.bytes);
  const Status st = store_->Mismatch(extent_, (*written)[1], 7);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("at offset " +
                              std::to_string(extent_.offset + 40 * kKiB)),
            std::string::npos)
      << st.message();
  EXPECT_EQ(store_->stats().checksum_failures, 1u);
}

TEST_F(StoreDigestTest, AWrongDigestFailsTheReadAndAnUntiledOneTheWrite) {
  // The store trusts the writer's hashes: a wrong one is caught on read,
  // never passed as good.
  Digest wrong = *WritersDigest();
  wrong[1].hash ^= 1;
  ASSERT_TRUE(
      store_->Write(extent_, out_.data(), std::make_shared<const Digest>(wrong))
          .ok());
  EXPECT_EQ(store_->Read(extent_, in_.data()).code(), StatusCode::kDataLoss);

  ASSERT_TRUE(store_->Write(extent_, out_.data()).ok());
  Digest short_one = *WritersDigest();
  short_one.pop_back();
  const Status st = store_->Write(extent_, out_.data(),
                                  std::make_shared<const Digest>(short_one));
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("does not tile"), std::string::npos);
  // Refused before anything changed: the extent still reads as written.
  ASSERT_TRUE(store_->Read(extent_, in_.data()).ok());
}

}  // namespace
}  // namespace strata::tier
