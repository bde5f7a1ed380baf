// Status factories and the early-return macros of strata/status.h.
#include "strata/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace strata {
namespace {

TEST(StatusTest, EachFactoryCarriesItsCodeAndMessage) {
  const struct {
    Status status;
    StatusCode code;
  } cases[] = {
      {Status::InvalidArgument("m"), StatusCode::kInvalidArgument},
      {Status::NotFound("m"), StatusCode::kNotFound},
      {Status::PermissionDenied("m"), StatusCode::kPermissionDenied},
      {Status::ResourceExhausted("m"), StatusCode::kResourceExhausted},
      {Status::NoSpace("m"), StatusCode::kNoSpace},
      {Status::IoError("m"), StatusCode::kIoError},
      {Status::DataLoss("m"), StatusCode::kDataLoss},
      {Status::Unavailable("m"), StatusCode::kUnavailable},
      {Status::FailedPrecondition("m"), StatusCode::kFailedPrecondition},
      {Status::Internal("m"), StatusCode::kInternal},
      {Status::Cancelled("m"), StatusCode::kCancelled},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(c.status.code(), c.code);
    EXPECT_EQ(c.status.message(), "m");
    EXPECT_FALSE(c.status.ok());
  }
}

// Counts its calls, so a test sees that the macros evaluate `expr` once.
struct Source {
  int calls = 0;
  Status Next(Status s) {
    ++calls;
    return s;
  }
  Result<std::unique_ptr<int>> Make(bool ok, int v) {
    ++calls;
    if (!ok) return Status::NotFound("no value");
    return std::make_unique<int>(v);
  }
};

Status TwoSteps(Source& src, Status first, bool* reached_second) {
  STRATA_RETURN_IF_ERROR(src.Next(std::move(first)));
  *reached_second = true;
  return src.Next(Status::Ok());
}

TEST(StatusTest, ReturnIfErrorReturnsTheErrorAndStopsThere) {
  Source src;
  bool second = false;
  const Status s = TwoSteps(src, Status::DataLoss("bad block"), &second);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "bad block");
  EXPECT_FALSE(second);
  EXPECT_EQ(src.calls, 1);
}

TEST(StatusTest, ReturnIfErrorGoesOnWhenOk) {
  Source src;
  bool second = false;
  EXPECT_TRUE(TwoSteps(src, Status::Ok(), &second).ok());
  EXPECT_TRUE(second);
  EXPECT_EQ(src.calls, 2);
}

// A move-only value, declared by the macro and assigned to an existing one.
Result<int> SumOf(Source& src, bool first_ok, bool second_ok) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<int> a, src.Make(first_ok, 2));
  std::unique_ptr<int> b;
  STRATA_ASSIGN_OR_RETURN(b, src.Make(second_ok, 3));
  return *a + *b;
}

TEST(StatusTest, AssignOrReturnBindsTheValue) {
  Source src;
  Result<int> r = SumOf(src, true, true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 5);
  EXPECT_EQ(src.calls, 2);
}

TEST(StatusTest, AssignOrReturnReturnsTheFirstError) {
  Source src;
  Result<int> r = SumOf(src, false, true);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(src.calls, 1);
  r = SumOf(src, true, false);
  EXPECT_EQ(r.status().message(), "no value");
  EXPECT_EQ(src.calls, 3);
}

}  // namespace
}  // namespace strata
