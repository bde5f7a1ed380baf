// The C ABI's handle objects (src/capi/handles.h): deferred view releases
// and the holds of DLPack exports.
#include "src/capi/handles.h"

#include <utility>

namespace strata::capi {

void EngineBox::RecordDeferredError(Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (deferred_error_.ok()) deferred_error_ = std::move(status);
}

Status EngineBox::TakeDeferredError() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(deferred_error_, Status());
}

Status View::Release(const Fence& fence) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (exports_ > 0) {
      deferred_ = true;
      fence_ = fence;
      ++engine_->deferred;
      return Status();
    }
  }
  return group.pin.Release(fence);
}

std::shared_ptr<void> View::HoldForExport() {
  std::lock_guard<std::mutex> lock(mu_);
  ++exports_;
  // The hold owns a reference to the view; destroying it drops the export.
  return {this, [self = shared_from_this()](void*) { self->DropExport(); }};
}

void View::DropExport() {
  Fence fence;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--exports_ > 0 || !deferred_) return;
    deferred_ = false;
    fence = fence_;
  }
  Status status = group.pin.Release(fence);
  --engine_->deferred;
  if (!status.ok()) {
    engine_->RecordDeferredError(Status(
        status.code(), "the deferred release of a view of group " +
                           std::to_string(group.group) +
                           " (its last DLPack export was deleted) failed: " +
                           status.message()));
  }
}

std::shared_ptr<void> Gradients::HoldForExport() const {
  ++optimizer->exports;
  return {optimizer.get(), [box = optimizer](void*) { --box->exports; }};
}

}  // namespace strata::capi
