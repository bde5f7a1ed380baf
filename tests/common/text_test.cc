// The shared text helpers (common/text.h): sizes both ways, byte counts for
// people, errno names, lists split.
#include "common/text.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>
#include <vector>

namespace strata {
namespace {

TEST(ParseSizeTest, AcceptsBinaryUnits) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("128K"), 128u << 10);
  EXPECT_EQ(*ParseSize("1m"), 1u << 20);
  EXPECT_EQ(*ParseSize("2GiB"), 2ull << 30);
  EXPECT_EQ(*ParseSize("1T"), 1ull << 40);
  for (const char* bad : {"", "K", "-1", "1X", "1.5G", "12KK"}) {
    Result<uint64_t> r = ParseSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("is not a size (e.g. 4096"),
              std::string::npos);
  }
}

TEST(SizeTextTest, WholeUnitsElseBytesAndParseSizeReadsItBack) {
  EXPECT_EQ(SizeText(0), "0");
  EXPECT_EQ(SizeText(4096), "4K");
  EXPECT_EQ(SizeText(3u << 20), "3M");
  EXPECT_EQ(SizeText(2ull << 30), "2G");
  EXPECT_EQ(SizeText(1ull << 40), "1024G");
  EXPECT_EQ(SizeText(1000), "1000");
  for (uint64_t n : {uint64_t{1000}, uint64_t{4096}, uint64_t{3} << 20}) {
    EXPECT_EQ(*ParseSize(SizeText(n)), n);
  }
}

TEST(SplitListTest, NonEmptyPiecesInOrder) {
  EXPECT_EQ(SplitList("a:b", ':'), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(SplitList(":a::b:", ':'), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(SplitList("4K,1M", ','), (std::vector<std::string>{"4K", "1M"}));
  EXPECT_TRUE(SplitList("", ',').empty());
  EXPECT_TRUE(SplitList(":::", ':').empty());
}

TEST(HumanBytesTest, OneDecimalInTheLargestUnit) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(4096), "4.0 KiB");
  EXPECT_EQ(HumanBytes(1610612736), "1.5 GiB");
  EXPECT_EQ(HumanBytes(5ull << 40), "5.0 TiB");
  EXPECT_EQ(HumanBytes(2048ull << 40), "2048.0 TiB");
}

TEST(ErrnoTextTest, NameAndDescription) {
  EXPECT_EQ(ErrnoText(ENOSPC), "ENOSPC (No space left on device)");
  EXPECT_EQ(ErrnoText(4242).rfind("errno 4242 (", 0), 0u);
}

}  // namespace
}  // namespace strata
