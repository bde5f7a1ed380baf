// What every C ABI entry point shares (src/capi/c_api.cc and
// c_api_optimizer.cc): running its body under Guard, which turns a Status
// or an exception into a strata_status and the thread's last error.
//
//   strata_status strata_x(strata_engine* engine) {
//     return Guard(__func__, [&]() -> Status {
//       STRATA_RETURN_IF_ERROR(NonNull({{engine, "engine"}}));
//       STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
//       return e->engine->Drain();
//     });
//   }
#ifndef STRATA_SRC_CAPI_GUARD_H_
#define STRATA_SRC_CAPI_GUARD_H_

#include <cstddef>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "common/interrupt.h"
#include "strata/engine.h"
#include "strata/offload_optimizer.h"
#include "strata/status.h"
#include "strata/strata.h"

namespace strata::capi {

// Records `message` (and `detail`) as the thread's last error, prefixed
// with `fn`, and returns `code` as a strata_status. Never throws: it also
// records failures from inside catch handlers, where allocating the
// message may fail again; then a static text stands in.
strata_status Fail(const char* fn, StatusCode code, std::string_view message,
                   std::string_view detail = {}) noexcept;
const char* LastError() noexcept;

// Note [No exceptions across the C ABI]
// A C caller cannot catch a C++ exception; one escaping would terminate the
// process. strata reports its own failures as Status and throws nothing,
// but the standard library can (std::bad_alloc from a string, a vector or
// a handle). Every entry point therefore runs its body here: any exception
// becomes a status and a message. Bodies write out parameters last, so a
// failed call leaves them untouched.
template <typename Body>
strata_status Guard(const char* fn, Body&& body) noexcept {
  try {
    // Note [Interruptible waits]: the caller's thread, inside the ABI.
    const internal::CallerScope caller;
    const Status status = body();
    if (status.ok()) return STRATA_OK;
    return Fail(fn, status.code(), status.message());
  } catch (const std::bad_alloc&) {
    return Fail(fn, StatusCode::kResourceExhausted,
                "out of host memory; free memory or lower the host budget");
  } catch (const std::exception& e) {
    return Fail(fn, StatusCode::kInternal,
                "unexpected C++ exception: ", e.what());
  } catch (...) {
    return Fail(fn, StatusCode::kInternal,
                "unexpected C++ exception of unknown type");
  }
}

// Copies `text` into the caller's buffer like snprintf; returns the
// length + 1 that the whole text needs.
size_t CopyText(const std::string& text, char* buffer, size_t capacity);

// The checks and copy-out of a call that returns text in the caller's
// buffer (strata_engine_load, strata_optimizer_load).
Status CheckTextBuffer(const char* buffer, size_t capacity);

}  // namespace strata::capi

#endif  // STRATA_SRC_CAPI_GUARD_H_
