// The C ABI's view handles (strata_view*, strata/strata.h): a process-wide
// table from handle to the fetched group it stands for, so that a handle
// released twice, or one that never came from strata_group_fetch, is a
// clear error instead of a use of freed memory.
//
// Note [View handles]
// A strata_view* is a number, never an address, and no number is handed
// out twice in a process: the n-th view is (strata_view*)n. So a handle is
// either live (in the table), released (a number below the next one), or
// foreign (anything else), and each case gets its own message. The table
// holds each view by shared_ptr: a call reading a view keeps it alive even
// if another thread releases it meanwhile (the pin goes at the release; the
// names and shapes stay readable).
//
//   ViewTable& views = ViewTable::Get();
//   strata_view* handle = views.Add(std::move(view));
//   STRATA_ASSIGN_OR_RETURN(std::shared_ptr<View> v, views.Find(handle));
//   STRATA_ASSIGN_OR_RETURN(std::shared_ptr<View> gone, views.Take(handle));
//
// Thread safety: every method may be called from any thread.
#ifndef STRATA_SRC_CAPI_HANDLES_H_
#define STRATA_SRC_CAPI_HANDLES_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "strata/engine.h"
#include "strata/strata.h"

namespace strata::capi {

// One fetched group, as a C caller holds it.
struct View {
  const strata_engine* owner = nullptr;
  int cuda_device = 0;
  GroupView group;  // its pin releases the fetch
};

class ViewTable {
 public:
  static ViewTable& Get();

  strata_view* Add(std::shared_ptr<View> view);
  // The live view behind `handle`; kFailedPrecondition when it was released
  // already, kInvalidArgument when it never was a view.
  Result<std::shared_ptr<View>> Find(const strata_view* handle) const;
  // Find, and the handle is released: it is no longer live.
  Result<std::shared_ptr<View>> Take(const strata_view* handle);
  // Makes a taken handle live again (its release failed and it is held).
  void Restore(const strata_view* handle, std::shared_ptr<View> view);
  // Live views of `engine`.
  int CountOf(const strata_engine* engine) const;

 private:
  Status Unknown(uint64_t id) const;  // needs mu_ held

  // Guarded by mu_.
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<View>> views_;
  uint64_t next_ = 1;
};

}  // namespace strata::capi

#endif  // STRATA_SRC_CAPI_HANDLES_H_
