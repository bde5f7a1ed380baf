// The scalar path: the reference the SIMD paths are tested against, and the
// fallback on CPUs without AVX2. Element access goes through memcpy, so any
// alignment works. See Note [One body, three ISAs] in kernel_body.h.
#include <bit>
#include <cmath>
#include <cstdint>

#include "cpu_adam/convert.h"
#include "cpu_adam/kernel_body.h"

namespace strata::cpu_adam {
namespace {

struct Scalar {
  static constexpr size_t W = 1;
  using F = float;
  using DAcc = double[16];

  static F Set1(float x) { return x; }
  static F Load(const float* p) {
    float v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static F Load(const Bf16* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return Bf16ToF32(h);
  }
  static F Load(const F16* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return F16ToF32(h);
  }
  static void Store(float* p, F v) { std::memcpy(p, &v, sizeof v); }
  static void Store(Bf16* p, F v) {
    uint16_t h = F32ToBf16(v);
    std::memcpy(p, &h, sizeof h);
  }
  static uint32_t Noise(uint32_t seed, size_t i) {
    return MixBits(static_cast<uint32_t>(i) ^ seed);
  }
  static void StoreStochastic(Bf16* p, F v, uint32_t noise) {
    uint16_t h = F32ToBf16Stochastic(v, noise);
    std::memcpy(p, &h, sizeof h);
  }
  static void Store(F16* p, F v) {
    uint16_t h = F32ToF16(v);
    std::memcpy(p, &h, sizeof h);
  }
  static F Add(F a, F b) { return a + b; }
  static F Mul(F a, F b) { return a * b; }
  static F Div(F a, F b) { return a / b; }
  static F Sqrt(F a) { return std::sqrt(a); }
  // torch.sign: -1, 0 or 1 (0 for NaN and for either zero).
  static F Sign(F a) { return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : 0.0f); }
  static bool AnyNonFinite(F a) {
    return (std::bit_cast<uint32_t>(a) & 0x7F800000u) == 0x7F800000u;
  }
  static void Prefetch(const void*) {}
  static F Abs(F a) { return std::fabs(a); }
  static F Sub(F a, F b) { return a - b; }
  static F Max(F a, F b) { return a > b ? a : b; }
  static float MaxLanes(F a) { return a; }
  static F Trunc(F a) { return std::trunc(a); }
  using M = bool;
  static M Ge(F a, F b) { return a >= b; }
  static F Select(M m, F a, F b) { return m ? a : b; }
  using I = int32_t;
  static I SetI(int32_t x) { return x; }
  static I CountIf(I r, M m) { return r + m; }
  static I MinI(I a, I b) { return a < b ? a : b; }
  static I MaxI(I a, I b) { return a > b ? a : b; }
  static I TruncI(F a) { return static_cast<I>(a); }  // |a| < 2^31 here
  static F BitsToF(F a) {
    return static_cast<float>(std::bit_cast<int32_t>(a));
  }
  static F CopySign(F mag, F s) { return std::copysign(mag, s); }
  static I AddI(I a, I b) { return a + b; }
  // The unbiased exponent of a positive normal float.
  static I Exponent(F a) {
    return static_cast<I>(std::bit_cast<uint32_t>(a) >> 23) - 127;
  }
  using Table = const float*;
  static Table MakeTable(const float* t) { return t; }
  static F Lut8(Table t, I r) { return t[r]; }
  static F LoadCodes(const uint8_t* q) { return *q; }
  static void StoreCodes(uint8_t* q, F c) { *q = static_cast<uint8_t>(c); }
  static void AddSquares(DAcc& acc, F v, size_t lane) {
    const double x = v;
    acc[lane] += x * x;
  }
  static void StoreLanes(const DAcc& acc, double* lanes) {
    std::memcpy(lanes, acc, sizeof(DAcc));
  }
};

}  // namespace

const KernelTable& ScalarKernels() {
  static const KernelTable table = MakeKernelTable<Scalar>(CpuIsa::kScalar);
  return table;
}

}  // namespace strata::cpu_adam
