// strata/status.h: the error vocabulary shared by every strata component.
//
// Contract
// - Anything the environment causes (a full disk, a missing directory, a
//   memlock limit, a blocked syscall) is reported as a Status or a Result<T>.
//   Its message names the problem and, where there is one, the fix.
// - Programming bugs (broken invariants, misuse that no input can cause)
//   abort with file:line through STRATA_CHECK. They are never returned.
// - Status and Result are plain values: copyable, movable, thread-compatible
//   (not synchronized). A default Status is OK and allocates nothing.
#ifndef STRATA_STATUS_H_
#define STRATA_STATUS_H_

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace strata {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // the caller passed something unusable
  kNotFound,            // a path or name does not exist
  kPermissionDenied,    // EACCES, EPERM, EROFS
  kResourceExhausted,   // memory, memlock, budgets
  kNoSpace,             // ENOSPC, EDQUOT
  kIoError,             // EIO and other device errors
  kDataLoss,            // checksum mismatch, truncated data
  kUnavailable,         // a kernel facility is missing or blocked
  kFailedPrecondition,  // the object is in the wrong state for the call
  kInternal,            // an unexpected errno or library failure
  kCancelled,           // the caller asked a wait to stop (Ctrl-C)
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  // One factory per code: Status::NoSpace("swap directory ... is full").
  static Status InvalidArgument(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status NotFound(std::string message) {
    return Status(StatusCode::kNotFound, std::move(message));
  }
  static Status PermissionDenied(std::string message) {
    return Status(StatusCode::kPermissionDenied, std::move(message));
  }
  static Status ResourceExhausted(std::string message) {
    return Status(StatusCode::kResourceExhausted, std::move(message));
  }
  static Status NoSpace(std::string message) {
    return Status(StatusCode::kNoSpace, std::move(message));
  }
  static Status IoError(std::string message) {
    return Status(StatusCode::kIoError, std::move(message));
  }
  static Status DataLoss(std::string message) {
    return Status(StatusCode::kDataLoss, std::move(message));
  }
  static Status Unavailable(std::string message) {
    return Status(StatusCode::kUnavailable, std::move(message));
  }
  static Status FailedPrecondition(std::string message) {
    return Status(StatusCode::kFailedPrecondition, std::move(message));
  }
  static Status Internal(std::string message) {
    return Status(StatusCode::kInternal, std::move(message));
  }
  static Status Cancelled(std::string message) {
    return Status(StatusCode::kCancelled, std::move(message));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK" or "<code name>: <message>".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kPermissionDenied:
      return "permission denied";
    case StatusCode::kResourceExhausted:
      return "resource exhausted";
    case StatusCode::kNoSpace:
      return "no space";
    case StatusCode::kIoError:
      return "I/O error";
    case StatusCode::kDataLoss:
      return "data loss";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kFailedPrecondition:
      return "failed precondition";
    case StatusCode::kInternal:
      return "internal";
    case StatusCode::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

inline std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

[[noreturn]] inline void CheckFailed(const char* file, int line,
                                     const char* what) {
  std::fprintf(stderr, "strata: %s:%d: check failed: %s\n", file, line, what);
  std::abort();
}

// Aborts with file:line when `cond` is false. For invariants only.
#define STRATA_CHECK(cond) \
  ((cond) ? (void)0 : ::strata::CheckFailed(__FILE__, __LINE__, #cond))

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    STRATA_CHECK(!status_.ok());
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & {
    STRATA_CHECK(ok());
    return *value_;
  }
  const T& value() const& {
    STRATA_CHECK(ok());
    return *value_;
  }
  T&& value() && {
    STRATA_CHECK(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace strata

// Early returns. In a function returning Status or Result<U>:
//   STRATA_RETURN_IF_ERROR(file->Sync());          // returns the error
//   STRATA_ASSIGN_OR_RETURN(File* f, OpenFile(p));  // or binds the value
// `expr` is evaluated once; ASSIGN_OR_RETURN declares (or assigns) `lhs`
// in the enclosing scope, so it cannot be the body of an unbraced if.
#define STRATA_RETURN_IF_ERROR(expr)                                      \
  do {                                                                    \
    if (::strata::Status strata_status_ = (expr); !strata_status_.ok()) { \
      return strata_status_;                                              \
    }                                                                     \
  } while (false)

#define STRATA_STATUS_CONCAT_(a, b) a##b
#define STRATA_STATUS_CONCAT(a, b) STRATA_STATUS_CONCAT_(a, b)
#define STRATA_ASSIGN_OR_RETURN(lhs, expr)                                 \
  STRATA_ASSIGN_OR_RETURN_(STRATA_STATUS_CONCAT(strata_result_, __LINE__), \
                           lhs, expr)
#define STRATA_ASSIGN_OR_RETURN_(result, lhs, expr) \
  auto result = (expr);                             \
  if (!result.ok()) return result.status();         \
  lhs = std::move(result).value()

#endif  // STRATA_STATUS_H_
