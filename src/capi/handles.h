// The C ABI's handles: a process-wide table per kind (strata_engine*,
// strata_optimizer*, strata_view*, strata_gradients*) from handle to the
// object it stands for, so that a handle ended twice (closed, released,
// handed off), or one that never came from strata, is a clear error
// instead of a use of freed memory.
//
// Note [View handles]
// A handle is a number, never an address, and no number is handed out
// twice in a process: the n-th handle of a kind is (Handle*)(tag << 40 |
// n), the tag naming the kind, so a handle of one kind passed for another
// never reaches an object. So a handle is either live (in the table),
// ended (its kind's, a number below the next one), or foreign (anything
// else), and each case gets its own message. The table
// holds each object by shared_ptr: a call reading one keeps it alive even
// if another thread ends its handle meanwhile (a view's pin goes at the
// release; the names and shapes stay readable). A view keeps its engine
// alive, and an optimizer its engine, so that a call racing a close never
// reaches freed memory.
//
// Note [Exports hold their memory]
// A DLPack export (strata_view_export_dlpack, strata_gradients_export_dlpack)
// holds what its data points into until its deleter runs: the fetch's pin
// for a view, the optimizer (whose pool owns the buffers) for a gradient
// buffer. Releasing a view while exports of it live ends the handle at
// once and defers the pin's release, with the caller's fence, to the
// deleter of the last export; closing an engine or optimizer while exports
// of it live is refused, naming the count (strata_engine_close_after_exports
// ends the handle anyway, for a process that exits: the views the exports
// pin hold the engine until the last is deleted). So an array a consumer
// keeps can never read or write memory strata gave to another group. A
// forked child's deleters let go of nothing (handles.cc).
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

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "strata/engine.h"
#include "strata/offload_optimizer.h"
#include "strata/strata.h"

namespace strata::capi {

// One open engine (strata_engine_open .. strata_engine_close).
struct EngineBox {
  static constexpr const char* kKind = "engine";
  static constexpr uint64_t kTag = 1;  // Note [View handles]
  static constexpr const char* kEnd = "closed";
  static constexpr const char* kFrom = "strata_engine_open";
  int cuda_device = 0;
  RoleMask device_roles = kAllRoles;  // EngineOptions::placement's
  std::atomic<int> optimizers{0};     // open optimizers borrowing it
  std::atomic<int> deferred{0};       // released views pinned by exports

  // A deferred release that failed (Note [Exports hold their memory]):
  // its error is returned by the next TakeDeferredError
  // (strata_engine_drain), and its pin stays held until the engine is
  // gone, so that memory the device may still use is never freed unfenced.
  void KeepPinned(Status status, GroupView pinned);
  Status TakeDeferredError();

 private:
  // Guarded by mu_.
  std::mutex mu_;
  Status deferred_error_;
  // Destroyed after `engine` (declared before it): their pins' releases
  // then reach a closed PinOwner and free nothing.
  std::vector<GroupView> kept_;

 public:
  std::unique_ptr<Engine> engine;
};

// One open optimizer (strata_optimizer_create .. strata_optimizer_close).
struct OptimizerBox {
  static constexpr const char* kKind = "optimizer";
  static constexpr uint64_t kTag = 2;  // Note [View handles]
  static constexpr const char* kEnd = "closed";
  static constexpr const char* kFrom = "strata_optimizer_create";
  std::shared_ptr<EngineBox> engine;
  std::unique_ptr<OffloadOptimizer> optimizer;
  std::atomic<int> exports{0};  // live exports of its gradient buffers
};

// One fetched group, as a C caller holds it.
class View : public std::enable_shared_from_this<View> {
 public:
  static constexpr const char* kKind = "view";
  static constexpr uint64_t kTag = 3;  // Note [View handles]
  static constexpr const char* kEnd = "released";
  static constexpr const char* kFrom = "strata_group_fetch";

  View(std::shared_ptr<EngineBox> engine, const strata_engine* owner,
       bool write)
      : owner(owner), write(write), engine_(std::move(engine)) {}

  // Releases the fetch after `fence`, or, while exports of the view live,
  // records the fence and leaves the release to the last export's
  // deleter. Fails, the pin held, only as GroupView's Pin::Release does.
  Status Release(const Fence& fence);
  // What an export holds: the view, counted until the hold is destroyed;
  // kFailedPrecondition once the view's release began (an export racing
  // it from another thread).
  Result<std::shared_ptr<void>> HoldForExport();
  bool held() const { return group.pin.held(); }

  // Fixed after construction.
  const strata_engine* const owner;
  const bool write;
  int cuda_device() const { return engine_->cuda_device; }
  GroupView group;  // set once by the fetch; its pin releases it

 private:
  void DropExport();

  const std::shared_ptr<EngineBox> engine_;
  // Guarded by mu_.
  std::mutex mu_;
  int exports_ = 0;
  bool released_ = false;  // its handle's release began
  bool deferred_ = false;  // released by its handle, pinned by exports
  Fence fence_;
};

// One acquired gradient buffer, until its hand-off.
struct Gradients {
  static constexpr const char* kKind = "gradient buffer";
  static constexpr uint64_t kTag = 4;  // Note [View handles]
  static constexpr const char* kEnd = "handed off";
  static constexpr const char* kFrom = "strata_optimizer_acquire_gradients";
  const strata_optimizer* owner = nullptr;
  std::shared_ptr<OptimizerBox> optimizer;
  GradientBuffer buffer;

  // What an export holds: the optimizer, counted in its `exports`.
  std::shared_ptr<void> HoldForExport() const;
  int cuda_device() const { return optimizer->engine->cuda_device; }
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
    const uint64_t id = Object::kTag << kTagShift | next_++;
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
  static constexpr int kTagShift = 40;
  static constexpr uint64_t kNumberMask = (uint64_t{1} << kTagShift) - 1;

  static uint64_t IdOf(const Handle* handle) {
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle));
  }
  Status Unknown(uint64_t id) const {  // needs mu_ held
    if (id >> kTagShift == Object::kTag && (id & kNumberMask) < next_) {
      return Status::FailedPrecondition(fmt::format(
          "{} {:#x} was {} already; each {} is {} once", Object::kKind, id,
          Object::kEnd, Object::kKind, Object::kEnd));
    }
    return Status::InvalidArgument(
        fmt::format("{:#x} is no {} handle: pass a handle that {} returned", id,
                    Object::kKind, Object::kFrom));
  }

  // Guarded by mu_.
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Object>> objects_;
  uint64_t next_ = 1;
};

using EngineTable = HandleTable<strata_engine, EngineBox>;
using OptimizerTable = HandleTable<strata_optimizer, OptimizerBox>;
using ViewTable = HandleTable<strata_view, View>;
using GradientsTable = HandleTable<strata_gradients, Gradients>;

}  // namespace strata::capi

#endif  // STRATA_SRC_CAPI_HANDLES_H_
