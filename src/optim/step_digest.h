// The NVMe checksums of what one optimizer step writes, taken in its pass.
//
// Note [Checksums in the optimizer's pass]
// Why: every chunk the NVMe tier holds carries a digest (the XXH3-64 of
// each segment, src/tier/digest.h). Taken by the store when the write-down
// starts, it is one more pass over bytes that left the cache long before
// (the 107M GPT of torch_offload_bench.py: 0.08 CPU-s a step with its
// state on NVMe, docs/PERF.md). The optimizer's pass has just written
// those bytes; hashed there, piece by piece while each piece is in cache,
// they cost the hashing alone.
// How: CpuOptimizer::Step shows each piece of elements it finished (its
// fixed pieces of kStepPiece elements) to an observer, which hashes the
// piece's bytes in every chunk the step writes (src/optim/pipeline_pass.cc):
// the master (or the compute copy stepped in place), m and v (in 8-bit state, a
// tensor's codes and its scales are two ranges) and the low-precision copy-out.
// Finish hashes what no piece covered (the padding after the last tensor, the
// codes that pad 8-bit state to whole blocks: a few KiB) and orders each
// chunk's segments into its digest. The pipeline attaches them to its hold
// before releasing it (Residency::AttachDigest), and a write-down of those
// bytes to NVMe hands the digest to the store instead of having it hash them.
// Why it is safe: a digest is made after the step wrote the bytes and
// attached while the hold still keeps every other writer out; the
// residency voids it once another write fetch of the chunk begins. A
// wrong one is loud, never silent: every read is verified against the
// digest the store recorded, so the next read of the extent fails as
// corrupt. The read side: the next step's pass verifies the bytes it reads,
// piece by piece, against the segments this one made of the same pieces
// (src/optim/step_check.h; Note [Unchecked host copies] in
// src/store/residency_checks.cc).
// Limits: a step that stops early (kPartial, an 8-bit overflow) attaches
// nothing, and the store hashes as before.
//
// Usage:
//   StepDigest digest({{Role::kMaster, master, master_bytes}, ...});
//   hooks.observer = [&](size_t b, size_t e) {
//     digest.Add(Role::kMaster, b * sizeof(float), (e - b) * sizeof(float));
//   };
//   cpu.Step(options, buffers, hooks);
//   for (auto& [role, d] : digest.Finish()) residency.AttachDigest(...);
//
// Thread safety: Add* may be called from several threads at once; Finish
// after the last of them returned.
#ifndef STRATA_SRC_OPTIM_STEP_DIGEST_H_
#define STRATA_SRC_OPTIM_STEP_DIGEST_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "src/tier/digest.h"
#include "strata/engine.h"

namespace strata::optim {

class StepDigest {
 public:
  struct Chunk {
    Role role = Role::kMaster;
    const char* base = nullptr;
    uint64_t bytes = 0;
  };
  explicit StepDigest(const std::vector<Chunk>& chunks);

  // Hashes bytes [offset, offset + n) of `role`'s chunk, which the step
  // wrote and which no other call covers; nothing for a role not given.
  void Add(Role role, uint64_t offset, uint64_t n);

  // Each chunk's digest: the segments added, and the bytes between them
  // hashed now.
  std::vector<std::pair<Role, std::shared_ptr<const tier::Digest>>> Finish();

 private:
  int IndexOf(Role role) const;

  // Fixed after construction.
  std::vector<Chunk> chunks_;

  // Guarded by mu_.
  std::mutex mu_;
  std::vector<tier::Digest> segments_;  // per chunk, in the order added
};

}  // namespace strata::optim

#endif  // STRATA_SRC_OPTIM_STEP_DIGEST_H_
