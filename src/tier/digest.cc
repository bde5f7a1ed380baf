#include "src/tier/digest.h"

#include <xxhash.h>

#include <algorithm>

#include "src/tier/digest_avx2.h"

namespace strata::tier {
namespace {

using HashFn = uint64_t (*)(const void*, size_t);

uint64_t HashPortable(const void* data, size_t n) {
  return XXH3_64bits(data, n);
}

HashFn PickHash() {
  return __builtin_cpu_supports("avx2") ? internal::HashAvx2 : HashPortable;
}

}  // namespace

uint64_t Hash(const void* data, size_t n) {
  static const HashFn hash = PickHash();
  return hash(data, n);
}

Digest DigestOf(const void* data, uint64_t bytes) {
  Digest digest;
  const auto* at = static_cast<const char*>(data);
  for (uint64_t offset = 0; offset < bytes; offset += kDigestSegment) {
    const uint64_t n = std::min(kDigestSegment, bytes - offset);
    digest.push_back({offset, n, Hash(at + offset, n)});
  }
  return digest;
}

bool Tiles(const Digest& digest, uint64_t bytes) {
  uint64_t at = 0;
  for (const Segment& s : digest) {
    if (s.offset != at || s.bytes == 0 || s.bytes > bytes - at) return false;
    at += s.bytes;
  }
  return at == bytes;
}

const Segment* FirstMismatch(const Digest& digest, const void* data) {
  const auto* at = static_cast<const char*>(data);
  for (const Segment& s : digest) {
    if (Hash(at + s.offset, s.bytes) != s.hash) return &s;
  }
  return nullptr;
}

}  // namespace strata::tier
