// The checksum of an NVMe extent: the XXH3-64 of each segment of its
// bytes, the segments tiling the extent in order. The store makes one of
// fixed segments when it hashes an extent itself; a writer that already
// read every byte (the optimizer's pass: Note [Checksums in the optimizer's
// pass] in src/optim/step_digest.h) hands it one of its own segments, each
// hashed while its bytes were in cache, and the store verifies every read
// against whichever it has.
//
// Usage:
//   Digest d = DigestOf(buf, bytes);          // or segments a writer made
//   STRATA_CHECK(Tiles(d, bytes));
//   if (const Segment* bad = FirstMismatch(d, buf)) { ... bad->offset ... }
//
// Pure functions; thread-safe.
#ifndef STRATA_SRC_TIER_DIGEST_H_
#define STRATA_SRC_TIER_DIGEST_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::tier {

// The segment length of DigestOf: a mismatch names 1 MiB of an extent.
inline constexpr uint64_t kDigestSegment = uint64_t{1} << 20;

struct Segment {
  uint64_t offset = 0;  // within the extent
  uint64_t bytes = 0;
  uint64_t hash = 0;  // XXH3-64 of the bytes
};
using Digest = std::vector<Segment>;

// XXH3-64 (seed 0) of `n` bytes. The same value on every CPU; computed
// with xxHash's AVX2 code where the CPU has AVX2, which streams from
// memory fastest (docs/PERF.md: on the AVX-512 EPYC 27 GB/s against 19
// for libxxhash's SSE2 build and 17 for its AVX-512 dispatch).
uint64_t Hash(const void* data, size_t n);

// `bytes` bytes at `data` in segments of kDigestSegment (the last shorter).
Digest DigestOf(const void* data, uint64_t bytes);

// Whether the segments are non-empty, in order, and tile [0, bytes).
bool Tiles(const Digest& digest, uint64_t bytes);

// The first segment whose bytes at `data` hash otherwise (null: none).
const Segment* FirstMismatch(const Digest& digest, const void* data);

}  // namespace strata::tier

#endif  // STRATA_SRC_TIER_DIGEST_H_
