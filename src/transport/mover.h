// How bytes move between tiers: one synchronous call per hop, run by the
// residency manager without its lock held. Host<->device hops go through the
// device's copy engine (CUDA streams or the emulated device's workers) and
// wait for its event; host<->NVMe hops go through the extent store, whose
// reads are checksum-verified. Counts the bytes moved per tier pair.
//
// Thread safety: every method may be called from any thread.
#ifndef STRATA_SRC_TRANSPORT_MOVER_H_
#define STRATA_SRC_TRANSPORT_MOVER_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "src/tier/device.h"
#include "src/tier/nvme_store.h"
#include "strata/engine.h"

namespace strata::transport {

// Where one copy of a chunk lives: memory for the device and host tiers,
// an extent for NVMe.
struct Place {
  Tier tier = Tier::kHost;
  void* ptr = nullptr;
  tier::Extent extent;
};

class Mover {
 public:
  // `nvme` may be null when there is no NVMe tier.
  Mover(tier::Device* device, tier::NvmeStore* nvme);

  // Copies `bytes` from `from` to `to`, adjacent tiers.
  Status Copy(const Place& from, const Place& to, uint64_t bytes);
  // Fills `to` with zeros (a chunk that was never written).
  Status Zero(const Place& to, uint64_t bytes);

  // bytes[from][to] moved so far.
  std::array<std::array<uint64_t, kNumTiers>, kNumTiers> bytes() const;

 private:
  tier::Device* device_;
  tier::NvmeStore* nvme_;
  std::array<std::array<std::atomic<uint64_t>, kNumTiers>, kNumTiers> bytes_ =
      {};
};

}  // namespace strata::transport

#endif  // STRATA_SRC_TRANSPORT_MOVER_H_
