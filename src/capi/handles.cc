// The C ABI's handle objects (src/capi/handles.h): deferred view releases
// and the holds of DLPack exports.
#include "src/capi/handles.h"

#include <pthread.h>

#include <atomic>
#include <utility>

namespace strata::capi {
namespace {

// A forked child inherits the parent's exports (NumPy arrays, torch
// tensors) but not its threads: a deleter run there (at the child's exit)
// must not touch the engine, whose locks another thread may have held at
// the fork. The child lets go of nothing; its exit frees its memory.
std::atomic<bool> forked_child{false};
const bool at_fork_registered = [] {
  pthread_atfork(nullptr, nullptr, [] { forked_child = true; });
  return true;
}();

}  // namespace

void EngineBox::KeepPinned(Status status, GroupView pinned) {
  std::lock_guard<std::mutex> lock(mu_);
  if (deferred_error_.ok()) deferred_error_ = std::move(status);
  kept_.push_back(std::move(pinned));
}

Status EngineBox::TakeDeferredError() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(deferred_error_, Status());
}

Status View::Release(const Fence& fence) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    if (exports_ > 0) {
      deferred_ = true;
      fence_ = fence;
      ++engine_->deferred;
      return Status();
    }
  }
  Status status = group.pin.Release(fence);
  if (!status.ok() && group.pin.held()) {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = false;  // still held: the handle is restored
  }
  return status;
}

Result<std::shared_ptr<void>> View::HoldForExport() {
  std::lock_guard<std::mutex> lock(mu_);
  if (released_) {
    return Status::FailedPrecondition(
        "the view is being released by another thread; export before "
        "releasing it");
  }
  ++exports_;
  // The hold owns a reference to the view; destroying it drops the export.
  return std::shared_ptr<void>(
      this, [self = shared_from_this()](void*) { self->DropExport(); });
}

void View::DropExport() {
  if (forked_child) {
    new std::shared_ptr<View>(shared_from_this());  // never destroyed here
    return;
  }
  Fence fence;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--exports_ > 0 || !deferred_) return;
    deferred_ = false;
    fence = fence_;
  }
  Status status = group.pin.Release(fence);
  if (!status.ok() && group.pin.held()) {
    const int id = group.group;
    engine_->KeepPinned(
        Status(status.code(),
               "the deferred release of a view of group " + std::to_string(id) +
                   " (its last DLPack export was deleted) failed, so the "
                   "fetch stays pinned until the engine closes: " +
                   status.message()),
        std::move(group));
  }
  --engine_->deferred;
}

std::shared_ptr<void> Gradients::HoldForExport() const {
  ++optimizer->exports;
  return {optimizer.get(), [box = optimizer](void*) {
            if (forked_child) {
              new std::shared_ptr<OptimizerBox>(box);  // never destroyed here
              return;
            }
            --box->exports;
          }};
}

}  // namespace strata::capi
