// The store's side of every Pin (strata/engine.h): the Residency that made a
// pin releases it, for as long as the Residency lives. A PinOwner outlives
// it (each pin shares it), so a pin released after its engine was destroyed
// fails with a clear error instead of touching freed memory.
//
// Thread safety: Release and Close may be called from any thread; Close
// waits for a Release under way.
#ifndef STRATA_SRC_STORE_PIN_OWNER_H_
#define STRATA_SRC_STORE_PIN_OWNER_H_

#include <cstdint>
#include <memory>
#include <mutex>

#include "strata/engine.h"

namespace strata::store {
class Residency;
}  // namespace strata::store

namespace strata::internal {

class PinOwner {
 public:
  explicit PinOwner(store::Residency* residency) : residency_(residency) {}

  // A pin on hold `id` of the owner's Residency.
  static Pin Make(std::shared_ptr<PinOwner> owner, uint64_t id) {
    return Pin(std::move(owner), id);
  }
  Status Release(uint64_t id, const Fence& after);
  // The Residency is going: later releases fail.
  void Close();

 private:
  // Guarded by mu_; null once closed.
  std::mutex mu_;
  store::Residency* residency_;
};

}  // namespace strata::internal

#endif  // STRATA_SRC_STORE_PIN_OWNER_H_
