#include "src/capi/handles.h"

#include <fmt/format.h>

#include <utility>

namespace strata::capi {
namespace {

uint64_t IdOf(const strata_view* handle) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle));
}

}  // namespace

ViewTable& ViewTable::Get() {
  static ViewTable* table = new ViewTable();  // never destroyed: views may
  return *table;                              // be released at exit
}

strata_view* ViewTable::Add(std::shared_ptr<View> view) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_++;
  views_.emplace(id, std::move(view));
  return reinterpret_cast<strata_view*>(static_cast<uintptr_t>(id));
}

Status ViewTable::Unknown(uint64_t id) const {
  if (id < next_) {
    return Status::FailedPrecondition(fmt::format(
        "view {:#x} was released already; each view is released once", id));
  }
  return Status::InvalidArgument(
      fmt::format("{:#x} is not a view: pass a handle that "
                  "strata_group_fetch returned",
                  id));
}

Result<std::shared_ptr<View>> ViewTable::Find(const strata_view* handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = views_.find(IdOf(handle));
  if (it == views_.end()) return Unknown(IdOf(handle));
  return it->second;
}

Result<std::shared_ptr<View>> ViewTable::Take(const strata_view* handle) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = views_.find(IdOf(handle));
  if (it == views_.end()) return Unknown(IdOf(handle));
  std::shared_ptr<View> view = std::move(it->second);
  views_.erase(it);
  return view;
}

void ViewTable::Restore(const strata_view* handle, std::shared_ptr<View> view) {
  std::lock_guard<std::mutex> lock(mu_);
  views_.emplace(IdOf(handle), std::move(view));
}

int ViewTable::CountOf(const strata_engine* engine) const {
  std::lock_guard<std::mutex> lock(mu_);
  int count = 0;
  for (const auto& [id, view] : views_) count += view->owner == engine;
  return count;
}

}  // namespace strata::capi
