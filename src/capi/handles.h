// The C ABI's handles to short-lived objects (strata_view*, one fetched
// group; strata_gradients*, one acquired gradient buffer): a process-wide
// table per kind from handle to the object it stands for, so that a handle
// ended twice, or one that never came from strata, is a clear error
// instead of a use of freed memory.
//
// Note [View handles]
// A handle is a number, never an address, and no number is handed out
// twice in a process: the n-th handle of a kind is (Handle*)n. So a handle
// is either live (in the table), ended (a number below the next one), or
// foreign (anything else), and each case gets its own message. The table
// holds each object by shared_ptr: a call reading one keeps it alive even
// if another thread ends its handle meanwhile (a view's pin goes at the
// release; the names and shapes stay readable).
//
//   auto& views = HandleTable<strata_view, View>::Get();
//   strata_view* handle = views.Add(std::move(view));
//   STRATA_ASSIGN_OR_RETURN(std::shared_ptr<View> v, views.Find(handle));
//   STRATA_ASSIGN_OR_RETURN(std::shared_ptr<View> gone, views.Take(handle));
//
// Thread safety: every method may be called from any thread.
#ifndef STRATA_SRC_CAPI_HANDLES_H_
#define STRATA_SRC_CAPI_HANDLES_H_

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "strata/engine.h"
#include "strata/offload_optimizer.h"
#include "strata/strata.h"

namespace strata::capi {

// One fetched group, as a C caller holds it.
struct View {
  static constexpr const char* kKind = "view";
  static constexpr const char* kEnd = "released";
  static constexpr const char* kFrom = "strata_group_fetch";
  const strata_engine* owner = nullptr;
  int cuda_device = 0;
  GroupView group;  // its pin releases the fetch
};

// One acquired gradient buffer, until its hand-off.
struct Gradients {
  static constexpr const char* kKind = "gradient buffer";
  static constexpr const char* kEnd = "handed off";
  static constexpr const char* kFrom = "strata_optimizer_acquire_gradients";
  const strata_optimizer* owner = nullptr;
  int cuda_device = 0;
  GradientBuffer buffer;
};

template <typename Handle, typename Object>
class HandleTable {
 public:
  static HandleTable& Get() {
    static auto* table = new HandleTable();  // never destroyed: handles
    return *table;                           // may be ended at exit
  }

  Handle* Add(std::shared_ptr<Object> object) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = next_++;
    objects_.emplace(id, std::move(object));
    return reinterpret_cast<Handle*>(static_cast<uintptr_t>(id));
  }
  // The live object behind `handle`; kFailedPrecondition when its handle
  // was ended already, kInvalidArgument when it never was a handle.
  Result<std::shared_ptr<Object>> Find(const Handle* handle) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = objects_.find(IdOf(handle));
    if (it == objects_.end()) return Unknown(IdOf(handle));
    return it->second;
  }
  // Find, and the handle is ended: it is no longer live.
  Result<std::shared_ptr<Object>> Take(const Handle* handle) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = objects_.find(IdOf(handle));
    if (it == objects_.end()) return Unknown(IdOf(handle));
    std::shared_ptr<Object> object = std::move(it->second);
    objects_.erase(it);
    return object;
  }
  // Makes a taken handle live again (ending it failed and it is held).
  void Restore(const Handle* handle, std::shared_ptr<Object> object) {
    std::lock_guard<std::mutex> lock(mu_);
    objects_.emplace(IdOf(handle), std::move(object));
  }
  // Live handles whose object's owner is `owner`.
  template <typename Owner>
  int CountOf(const Owner* owner) const {
    std::lock_guard<std::mutex> lock(mu_);
    int count = 0;
    for (const auto& [id, object] : objects_) count += object->owner == owner;
    return count;
  }

  // Ends every live handle of `owner` (an aborted step's buffers).
  template <typename Owner>
  void EndAllOf(const Owner* owner) {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(objects_, [&](const auto& entry) {
      return entry.second->owner == owner;
    });
  }

 private:
  static uint64_t IdOf(const Handle* handle) {
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle));
  }
  Status Unknown(uint64_t id) const {  // needs mu_ held
    if (id < next_) {
      return Status::FailedPrecondition(fmt::format(
          "{} {:#x} was {} already; each {} is {} once", Object::kKind, id,
          Object::kEnd, Object::kKind, Object::kEnd));
    }
    return Status::InvalidArgument(
        fmt::format("{:#x} is not a {}: pass a handle that {} returned", id,
                    Object::kKind, Object::kFrom));
  }

  // Guarded by mu_.
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Object>> objects_;
  uint64_t next_ = 1;
};

using ViewTable = HandleTable<strata_view, View>;
using GradientsTable = HandleTable<strata_gradients, Gradients>;

}  // namespace strata::capi

#endif  // STRATA_SRC_CAPI_HANDLES_H_
