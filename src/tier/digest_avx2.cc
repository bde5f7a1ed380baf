// XXH3-64 compiled for AVX2 (built with -mavx2; digest.cc calls it only on
// a CPU that has AVX2). xxHash is inlined here so that its vector code is
// chosen at compile time. It includes nothing but xxHash and C headers, so
// no inline function of a shared C++ header is compiled for AVX2 here and
// picked by the linker for callers on any CPU.
#define XXH_INLINE_ALL
#include "src/tier/digest_avx2.h"

#include <xxhash.h>

namespace strata::tier::internal {

uint64_t HashAvx2(const void* data, size_t n) { return XXH3_64bits(data, n); }

}  // namespace strata::tier::internal
