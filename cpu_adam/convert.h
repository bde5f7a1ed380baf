// Reference conversions between fp32 and the 16-bit float formats, in
// integer arithmetic only (no dependence on MXCSR or compiler flags). The
// scalar kernels use them directly; the SIMD kernels are tested bit for bit
// against them.
//
// - fp32 -> bf16 / fp16: round to nearest, ties to even. Overflow gives inf
//   (fp16 above 65504). NaN stays NaN: the sign and the top payload bits are
//   kept and the quiet bit is set, as the F16C instructions do.
// - bf16 / fp16 -> fp32 is exact; an fp16 NaN is quieted, as F16C does.
#ifndef STRATA_CPU_ADAM_CONVERT_H_
#define STRATA_CPU_ADAM_CONVERT_H_

#include <bit>
#include <cstdint>

namespace strata::cpu_adam {

inline uint16_t F32ToBf16(float f) {
  uint32_t b = std::bit_cast<uint32_t>(f);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return (b >> 16) | 0x0040u;
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// Stochastic rounding: the 16 bits dropped are added to the noise's low 16
// bits first, so the result rounds up with the probability of the fraction
// it drops (NaN as F32ToBf16).
inline uint16_t F32ToBf16Stochastic(float f, uint32_t noise) {
  uint32_t b = std::bit_cast<uint32_t>(f);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return (b >> 16) | 0x0040u;
  return static_cast<uint16_t>((b + (noise & 0xFFFFu)) >> 16);
}

// A 32-bit integer hash (an xorshift-multiply avalanche); every ISA's
// Noise computes it lane by lane.
inline uint32_t MixBits(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

inline float Bf16ToF32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

inline uint16_t F32ToF16(float f) {
  uint32_t b = std::bit_cast<uint32_t>(f);
  uint32_t sign = (b >> 16) & 0x8000u;
  uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u | ((a >> 13) & 0x3FFu);
  if (a >= 0x38800000u) {  // fp16 normal range (>= 2^-14) or overflow
    uint32_t m = a - ((127u - 15u) << 23);
    m += 0xFFFu + ((m >> 13) & 1u);
    if (m >= (31u << 23)) return sign | 0x7C00u;
    return sign | (m >> 13);
  }
  uint32_t e = a >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to zero
  // fp16 subnormal: value / 2^-24 = mant >> shift, rounded to nearest even.
  uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  uint32_t shift = 126 - e;
  uint32_t q = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return sign | q;
}

inline float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x3FFu;
  if (e == 31) {
    uint32_t nan_quiet = m != 0 ? 0x400000u : 0;
    return std::bit_cast<float>(sign | 0x7F800000u | nan_quiet | (m << 13));
  }
  if (e == 0) {
    if (m == 0) return std::bit_cast<float>(sign);
    e = 113;  // normalize the subnormal: value = m * 2^-24
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --e;
    }
    m &= 0x3FFu;
    return std::bit_cast<float>(sign | (e << 23) | (m << 13));
  }
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

}  // namespace strata::cpu_adam

#endif  // STRATA_CPU_ADAM_CONVERT_H_
