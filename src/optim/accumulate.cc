#include "src/optim/accumulate.h"

#include <cstdint>
#include <cstring>

namespace strata::optim {
namespace {

// Widening is exact for both 16-bit formats; the loops stay plain so the
// compiler vectorizes them.
inline float FromBf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float FromF16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal: normalize.
    int e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

void Accumulate(float* acc, const void* src, FloatType src_type, size_t n) {
  switch (src_type) {
    case FloatType::kF32: {
      const auto* s = static_cast<const float*>(src);
      for (size_t i = 0; i < n; ++i) acc[i] += s[i];
      return;
    }
    case FloatType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) acc[i] += FromBf16(s[i]);
      return;
    }
    case FloatType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) acc[i] += FromF16(s[i]);
      return;
    }
  }
}

}  // namespace strata::optim
