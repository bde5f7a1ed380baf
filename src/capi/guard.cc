// The C ABI's shared entry-point machinery (src/capi/guard.h).
#include "src/capi/guard.h"

#include <algorithm>
#include <cstring>

#include "src/capi/convert.h"

namespace strata::capi {

namespace {
thread_local std::string error_text;
thread_local const char* last_error = "";
}  // namespace

strata_status Fail(const char* fn, StatusCode code, std::string_view message,
                   std::string_view detail) noexcept {
  try {
    error_text.assign(fn).append(": ").append(message).append(detail);
    last_error = error_text.c_str();
  } catch (...) {
    last_error = "strata: out of memory while recording an error message";
  }
  return static_cast<strata_status>(code);
}

const char* LastError() noexcept { return last_error; }

size_t CopyText(const std::string& text, char* buffer, size_t capacity) {
  if (capacity > 0) {
    const size_t n = std::min(capacity - 1, text.size());
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return text.size() + 1;
}

Status CheckTextBuffer(const char* buffer, size_t capacity) {
  if (capacity == 0) return Status::Ok();
  return NonNull({{buffer, "user_state_buf"}});
}

}  // namespace strata::capi
