// The engine's internals, for modules of the core that build on the store
// (the optimizer pipeline): the tiers and the residency manager behind an
// Engine. Not part of the public API.
//
// Ownership: everything belongs to the Engine; pointers stay valid for its
// lifetime. Thread safety: as documented by each module.
#ifndef STRATA_SRC_STORE_ENGINE_INTERNAL_H_
#define STRATA_SRC_STORE_ENGINE_INTERNAL_H_

#include "src/store/residency.h"
#include "src/tier/device.h"
#include "src/tier/pinned_pool.h"
#include "strata/engine.h"

namespace strata::internal {

struct EngineParts {
  tier::Device* device = nullptr;
  tier::PinnedPool* host = nullptr;
  store::Residency* residency = nullptr;
};

EngineParts PartsOf(Engine& engine);

}  // namespace strata::internal

#endif  // STRATA_SRC_STORE_ENGINE_INTERNAL_H_
