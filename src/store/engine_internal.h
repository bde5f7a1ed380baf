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
  // Note [Masters from compute copies]
  // A caller that registers a group with a master and writes only its
  // compute copy (the natural way: the weights it computes with) expects
  // training to start from those weights, not from a master of zeros. So
  // a master is unset, and takes the exact fp32 widening of the compute
  // copy, when the compute copy was written (its chunk's version is not 0)
  // and the master either
  // - was never fetched for writing since registration (version 0), or
  // - was last written together with the compute copy, by one write fetch
  //   of the caller's (Residency::WrittenTogether: every role fetched for
  //   writing), and holds only zero bits while the compute copy does not.
  //   No step, load or consistent write leaves that; writing the master
  //   alone (zeros included) is always taken as meant.
  // Before each optimizer step (OffloadOptimizer::BeginStep) and before
  // Save, unset masters are filled; the checks cost nothing unless a
  // group is in one of those two cases (the second reads its master once).
  // Once set, the master is the truth: a later write of the compute copy
  // alone is overwritten by the next step.
  static Status FillUnsetMasters(Engine& engine);
};

inline EngineParts PartsOf(Engine& engine) {
  return EngineAccess::Parts(engine);
}

}  // namespace strata::internal

#endif  // STRATA_SRC_STORE_ENGINE_INTERNAL_H_
