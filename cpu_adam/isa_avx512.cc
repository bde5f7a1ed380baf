// The AVX-512 path (16 lanes, AVX512F only). Built with -mavx512f -mf16c
// and no FMA. See Note [One body, three ISAs] in kernel_body.h.
#include <immintrin.h>

#include "cpu_adam/kernel_body.h"

namespace strata::cpu_adam {
namespace {

struct Avx512 {
  static constexpr size_t W = 16;
  using F = __m512;
  struct DAcc {
    __m512d lane[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
  };

  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static F Load(const Bf16* p) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static F Load(const F16* p) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  // Round to nearest even on the bit pattern; NaN keeps its top bits and is
  // quieted (see convert.h). Not VCVTNEPS2BF16: it flushes denormals.
  static void Store(Bf16* p, F v) {
    __m512i b = _mm512_castps_si512(v);
    __m512i hi = _mm512_srli_epi32(b, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
    StorePacked(p, _mm512_srli_epi32(_mm512_add_epi32(b, bias), 16), v);
  }
  // The rounded top halves `r` of `v`'s lanes, NaN quieted (convert.h).
  static void StorePacked(Bf16* p, __m512i r, F v) {
    __m512i hi = _mm512_srli_epi32(_mm512_castps_si512(v), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtepi32_epi16(r));
  }
  // MixBits lane by lane of (i + lane) ^ seed.
  static __m512i Noise(uint32_t seed, size_t i) {
    __m512i x = _mm512_xor_si512(
        _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(i)),
                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                           12, 13, 14, 15)),
        _mm512_set1_epi32(static_cast<int>(seed)));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7FEB352D));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x846CA68B));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  }
  // F32ToBf16Stochastic lane by lane.
  static void StoreStochastic(Bf16* p, F v, __m512i noise) {
    __m512i bits = _mm512_and_si512(noise, _mm512_set1_epi32(0xFFFF));
    StorePacked(
        p,
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(v), bits), 16),
        v);
  }
  static void Store(F16* p, F v) {
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(p),
        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F Sign(F a) {
    __m512 zero = _mm512_setzero_ps();
    __mmask16 pos = _mm512_cmp_ps_mask(a, zero, _CMP_GT_OQ);
    __mmask16 neg = _mm512_cmp_ps_mask(a, zero, _CMP_LT_OQ);
    __m512 r = _mm512_maskz_mov_ps(pos, _mm512_set1_ps(1.0f));
    return _mm512_mask_mov_ps(r, neg, _mm512_set1_ps(-1.0f));
  }
  static bool AnyNonFinite(F a) {
    __m512i exp_mask = _mm512_set1_epi32(0x7F800000);
    __m512i e = _mm512_and_si512(_mm512_castps_si512(a), exp_mask);
    return _mm512_cmpeq_epi32_mask(e, exp_mask) != 0;
  }
  static void Prefetch(const void* p) {
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
  }
  static F Abs(F a) { return _mm512_abs_ps(a); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F Max(F a, F b) { return _mm512_max_ps(a, b); }
  static float MaxLanes(F a) { return _mm512_reduce_max_ps(a); }
  static F Trunc(F a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  }
  using M = __mmask16;
  static M Ge(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static F Select(M m, F a, F b) { return _mm512_mask_blend_ps(m, b, a); }
  using I = __m512i;
  static I SetI(int32_t x) { return _mm512_set1_epi32(x); }
  static I CountIf(I r, M m) {
    return _mm512_mask_add_epi32(r, m, r, _mm512_set1_epi32(1));
  }
  static I MinI(I a, I b) { return _mm512_min_epi32(a, b); }
  static I MaxI(I a, I b) { return _mm512_max_epi32(a, b); }
  static I TruncI(F a) { return _mm512_cvttps_epi32(a); }
  static F BitsToF(F a) { return _mm512_cvtepi32_ps(_mm512_castps_si512(a)); }
  // The sign bit from s, the rest from mag (a bitwise select).
  static F CopySign(F mag, F s) {
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        _mm512_set1_epi32(INT32_MIN), _mm512_castps_si512(s),
        _mm512_castps_si512(mag), 0xCA));
  }
  static I AddI(I a, I b) { return _mm512_add_epi32(a, b); }
  static I Exponent(F a) {
    return _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(a), 23),
                            _mm512_set1_epi32(127));
  }
  using Table = __m512;  // 8 entries in the low lanes
  static Table MakeTable(const float* t) {
    return _mm512_zextps256_ps512(_mm256_loadu_ps(t));
  }
  static F Lut8(Table t, I r) { return _mm512_permutexvar_ps(r, t); }
  static F LoadCodes(const uint8_t* q) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
  }
  static void StoreCodes(uint8_t* q, F c) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q),
                     _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(c)));
  }

  static void AddSquares8(__m512d& acc, __m256 x) {
    __m512d d = _mm512_cvtps_pd(x);
    acc = _mm512_add_pd(acc, _mm512_mul_pd(d, d));
  }
  static void AddSquares(DAcc& acc, F v, size_t /*lane: always 0*/) {
    AddSquares8(acc.lane[0], _mm512_castps512_ps256(v));
    AddSquares8(acc.lane[1], _mm256_castpd_ps(_mm512_extractf64x4_pd(
                                 _mm512_castps_pd(v), 1)));
  }
  static void StoreLanes(const DAcc& acc, double* lanes) {
    _mm512_storeu_pd(lanes, acc.lane[0]);
    _mm512_storeu_pd(lanes + 8, acc.lane[1]);
  }
};

}  // namespace

const KernelTable& Avx512Kernels() {
  static const KernelTable table = MakeKernelTable<Avx512>(CpuIsa::kAvx512);
  return table;
}

}  // namespace strata::cpu_adam
