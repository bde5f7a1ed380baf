// Pin (strata/engine.h) and its owner (src/store/pin_owner.h).
#include <utility>

#include "src/store/pin_owner.h"
#include "src/store/residency.h"

namespace strata {

Pin::Pin(std::shared_ptr<internal::PinOwner> owner, uint64_t id)
    : owner_(std::move(owner)), id_(id) {}

Pin::~Pin() {
  if (held()) (void)Release();
}

Pin::Pin(Pin&& other) noexcept
    : owner_(std::move(other.owner_)), id_(std::exchange(other.id_, 0)) {}

Pin& Pin::operator=(Pin&& other) noexcept {
  if (this != &other) {
    if (held()) (void)Release();
    owner_ = std::move(other.owner_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

Status Pin::Release(const Fence& after) {
  if (!held()) {
    return Status::FailedPrecondition(
        "release of a pin that holds nothing: it was released already, "
        "moved from, or never came from a fetch");
  }
  Status status = owner_->Release(id_, after);
  // A fence that cannot be recorded leaves the pin held: releasing it
  // without the fence would free memory the device may still use.
  if (!status.ok() && status.code() != StatusCode::kFailedPrecondition) {
    return status;
  }
  owner_.reset();
  id_ = 0;
  return status;
}

namespace internal {

Status PinOwner::Release(uint64_t id, const Fence& after) {
  std::lock_guard<std::mutex> lock(mu_);
  if (residency_ == nullptr) {
    return Status::FailedPrecondition(
        "release of a pin whose engine was destroyed first; its views "
        "dangled from then on. Release every view before destroying the "
        "engine");
  }
  return residency_->Release(id, after);
}

void PinOwner::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  residency_ = nullptr;
}

}  // namespace internal
}  // namespace strata
