// The AVX2 path (8 lanes; F16C for fp16). Built with -mavx2 -mf16c and no
// FMA. See Note [One body, three ISAs] in kernel_body.h.
#include <immintrin.h>

#include "cpu_adam/kernel_body.h"

namespace strata::cpu_adam {
namespace {

struct Avx2 {
  static constexpr size_t W = 8;
  using F = __m256;
  struct DAcc {
    __m256d lane[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(),
                       _mm256_setzero_pd(), _mm256_setzero_pd()};
  };

  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static F Load(const Bf16* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static F Load(const F16* p) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  // Round to nearest even on the bit pattern; NaN keeps its top bits and is
  // quieted (see convert.h).
  static void Store(Bf16* p, F v) {
    __m256i b = _mm256_castps_si256(v);
    __m256i hi = _mm256_srli_epi32(b, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
    StorePacked(p, _mm256_srli_epi32(_mm256_add_epi32(b, bias), 16), v);
  }
  // The rounded top halves `r` of `v`'s lanes, NaN quieted (convert.h).
  static void StorePacked(Bf16* p, __m256i r, F v) {
    __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
    __m256i qnan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(nan));
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_castsi256_si128(packed));
  }
  // MixBits lane by lane of (i + lane) ^ seed.
  static __m256i Noise(uint32_t seed, size_t i) {
    __m256i x = _mm256_xor_si256(
        _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(i)),
                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
        _mm256_set1_epi32(static_cast<int>(seed)));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7FEB352D));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x846CA68B));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  }
  // F32ToBf16Stochastic lane by lane.
  static void StoreStochastic(Bf16* p, F v, __m256i noise) {
    __m256i b = _mm256_castps_si256(v);
    __m256i bits = _mm256_and_si256(noise, _mm256_set1_epi32(0xFFFF));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, bits), 16);
    StorePacked(p, r, v);
  }
  static void Store(F16* p, F v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F Sign(F a) {
    __m256 zero = _mm256_setzero_ps();
    __m256 pos =
        _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_GT_OQ), _mm256_set1_ps(1.0f));
    __m256 neg = _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_LT_OQ),
                               _mm256_set1_ps(-1.0f));
    return _mm256_or_ps(pos, neg);
  }
  static bool AnyNonFinite(F a) {
    __m256i exp_mask = _mm256_set1_epi32(0x7F800000);
    __m256i e = _mm256_and_si256(_mm256_castps_si256(a), exp_mask);
    return _mm256_movemask_epi8(_mm256_cmpeq_epi32(e, exp_mask)) != 0;
  }
  static void Prefetch(const void* p) {
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
  }
  static F Abs(F a) {
    return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
  }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F Max(F a, F b) { return _mm256_max_ps(a, b); }
  static float MaxLanes(F a) {
    __m128 m =
        _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
  }
  static F Trunc(F a) {
    return _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  }
  using M = __m256;  // all bits set where true
  static M Ge(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  static F Select(M m, F a, F b) { return _mm256_blendv_ps(b, a, m); }
  using I = __m256i;
  static I SetI(int32_t x) { return _mm256_set1_epi32(x); }
  static I CountIf(I r, M m) {
    return _mm256_sub_epi32(r, _mm256_castps_si256(m));
  }
  static I MinI(I a, I b) { return _mm256_min_epi32(a, b); }
  static I MaxI(I a, I b) { return _mm256_max_epi32(a, b); }
  static I TruncI(F a) { return _mm256_cvttps_epi32(a); }
  static F BitsToF(F a) { return _mm256_cvtepi32_ps(_mm256_castps_si256(a)); }
  static F CopySign(F mag, F s) {
    return _mm256_or_ps(mag, _mm256_and_ps(s, _mm256_set1_ps(-0.0f)));
  }
  static I AddI(I a, I b) { return _mm256_add_epi32(a, b); }
  static I Exponent(F a) {
    return _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(a), 23),
                            _mm256_set1_epi32(127));
  }
  using Table = __m256;
  static Table MakeTable(const float* t) { return _mm256_loadu_ps(t); }
  static F Lut8(Table t, I r) { return _mm256_permutevar8x32_ps(t, r); }
  static F LoadCodes(const uint8_t* q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
  }
  static void StoreCodes(uint8_t* q, F c) {
    __m256i i = _mm256_cvttps_epi32(c);
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(i),
                                 _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packus_epi16(w, w));
  }
  static void AddSquares4(__m256d& acc, __m128 x) {
    __m256d d = _mm256_cvtps_pd(x);
    acc = _mm256_add_pd(acc, _mm256_mul_pd(d, d));
  }
  static void AddSquares(DAcc& acc, F v, size_t lane) {
    const size_t h = lane / 8;
    AddSquares4(acc.lane[2 * h], _mm256_castps256_ps128(v));
    AddSquares4(acc.lane[2 * h + 1], _mm256_extractf128_ps(v, 1));
  }
  static void StoreLanes(const DAcc& acc, double* lanes) {
    for (int q = 0; q < 4; ++q) _mm256_storeu_pd(lanes + 4 * q, acc.lane[q]);
  }
};

}  // namespace

const KernelTable& Avx2Kernels() {
  static const KernelTable table = MakeKernelTable<Avx2>(CpuIsa::kAvx2);
  return table;
}

}  // namespace strata::cpu_adam
