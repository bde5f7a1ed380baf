// How bytes move between tiers: every byte the engine moves goes through
// here, so one counter sees them all, by the role of the chunk that moved
// (EngineStats::bytes and role_bytes). Copy() is one
// synchronous call per hop, run by the residency manager without its lock
// held; Start() issues an asynchronous host<->device copy for a caller that
// overlaps it with other work (the optimizer's gradient copies).
// Host<->device hops go through the device's copy engine (CUDA streams or
// the emulated device's workers); host<->NVMe hops go through the extent
// store, whose reads are checksum-verified (by the store, or by the caller
// of ReadUnchecked).
//
// Thread safety: every method may be called from any thread.
#ifndef STRATA_SRC_TRANSPORT_MOVER_H_
#define STRATA_SRC_TRANSPORT_MOVER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>

#include "src/tier/device.h"
#include "src/tier/nvme_store.h"
#include "strata/engine.h"

namespace strata::transport {

// Where one copy of a chunk lives: memory for the device and host tiers,
// an extent for NVMe.
struct Place {
  // Memory at the device or host tier.
  static Place Memory(Tier tier, void* ptr) { return {tier, ptr, {}}; }

  Tier tier = Tier::kHost;
  void* ptr = nullptr;
  tier::Extent extent;
};

class Mover {
 public:
  // `nvme` may be null when there is no NVMe tier.
  Mover(tier::Device* device, tier::NvmeStore* nvme);

  // Copies `bytes` of a `role` chunk from `from` to `to`, adjacent tiers;
  // counts them once the copy succeeded. A write to NVMe records `digest`,
  // the bytes' own (null: the store hashes them).
  Status Copy(Role role, const Place& from, const Place& to, uint64_t bytes,
              std::shared_ptr<const tier::Digest> digest = {});
  // Copy from NVMe to the host whose bytes the caller verifies before it
  // uses them (tier::ReadCheck::kCaller): returns the digest they must
  // match.
  Result<std::shared_ptr<const tier::Digest>> ReadUnchecked(Role role,
                                                            const Place& from,
                                                            const Place& to,
                                                            uint64_t bytes);
  // Issues a copy of `bytes` of a `role` chunk between the host and the
  // device (either way) and returns its event; counts them once issued, as
  // the device does. The copy starts after `after` (Note [Fences]; the call
  // does not wait). Both ranges must stay valid until the event completes.
  Result<tier::Event> Start(Role role, const Place& from, const Place& to,
                            uint64_t bytes, const tier::Event& after = {});
  // Fills `to` with zeros (a chunk that was never written).
  Status Zero(const Place& to, uint64_t bytes);

  // bytes[from][to] moved so far, summed over the roles.
  EngineStats::TierBytes bytes() const;
  // The same by role: role_bytes()[role][from][to].
  std::array<EngineStats::TierBytes, kNumRoles> role_bytes() const;

 private:
  // The device copy between `from` and `to`, uncounted.
  Result<tier::Event> Issue(const Place& from, const Place& to, uint64_t bytes);
  void Count(Role role, const Place& from, const Place& to, uint64_t bytes);

  tier::Device* device_;
  tier::NvmeStore* nvme_;
  using Counters =
      std::array<std::array<std::atomic<uint64_t>, kNumTiers>, kNumTiers>;
  std::array<Counters, kNumRoles> role_bytes_ = {};
};

}  // namespace strata::transport

#endif  // STRATA_SRC_TRANSPORT_MOVER_H_
