// The engine's internals, for modules of the core that build on the store
// (the optimizer pipeline) and for tests: the tiers and the residency
// manager behind an Engine, and Open with testing hooks. Not part of the
// public API.
//
// Ownership: everything belongs to the Engine; pointers stay valid for its
// lifetime. Thread safety: as documented by each module.
#ifndef STRATA_SRC_STORE_ENGINE_INTERNAL_H_
#define STRATA_SRC_STORE_ENGINE_INTERNAL_H_

#include <functional>
#include <memory>

#include "src/store/pending_updates.h"
#include "src/store/residency.h"
#include "src/tier/device.h"
#include "src/tier/pinned_pool.h"
#include "src/transport/mover.h"
#include "strata/aio.h"
#include "strata/engine.h"

namespace strata::internal {

struct EngineParts {
  tier::Device* device = nullptr;
  tier::PinnedPool* host = nullptr;
  store::Residency* residency = nullptr;
  transport::Mover* mover = nullptr;         // every byte moved goes through it
  store::PendingUpdates* pending = nullptr;  // Engine::Fetch waits for these
};

// What Engine::Open does not take: hooks for tests.
struct EngineHooks {
  aio::FaultInjector* fault_injector = nullptr;  // under the aio engine;
                                                 // not owned
};

// The one way past Engine's public API (its friend).
struct EngineAccess {
  static EngineParts Parts(Engine& engine);
  // Engine::Open, with `hooks`.
  static Result<std::unique_ptr<Engine>> Open(const EngineOptions& options,
                                              const EngineHooks& hooks);
  // Engine::Prefetch, skipped if `wanted()` is false when it would run (a
  // read-ahead that came too late to help).
  static Status PrefetchWhile(Engine& engine, int group, Tier tier,
                              RoleMask roles, std::function<bool()> wanted);
};

inline EngineParts PartsOf(Engine& engine) {
  return EngineAccess::Parts(engine);
}

}  // namespace strata::internal

#endif  // STRATA_SRC_STORE_ENGINE_INTERNAL_H_
