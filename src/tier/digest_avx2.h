// The AVX2 build of Hash (digest.h); call it only where the CPU has AVX2.
// Declared without any header that defines inline functions, for the
// reason given in digest_avx2.cc.
#ifndef STRATA_SRC_TIER_DIGEST_AVX2_H_
#define STRATA_SRC_TIER_DIGEST_AVX2_H_

#include <stddef.h>
#include <stdint.h>

namespace strata::tier::internal {

uint64_t HashAvx2(const void* data, size_t n);

}  // namespace strata::tier::internal

#endif  // STRATA_SRC_TIER_DIGEST_AVX2_H_
