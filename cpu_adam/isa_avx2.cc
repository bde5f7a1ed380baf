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
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, bias), 16);
    __m256i qnan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(nan));
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_castsi256_si128(packed));
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
  static void AddSquares4(__m256d& acc, __m128 x) {
    __m256d d = _mm256_cvtps_pd(x);
    acc = _mm256_add_pd(acc, _mm256_mul_pd(d, d));
  }
  template <class G>
  static void AddSquares16(DAcc& acc, const G* g) {
    for (int h = 0; h < 2; ++h) {
      F v = Load(g + 8 * h);
      AddSquares4(acc.lane[2 * h], _mm256_castps256_ps128(v));
      AddSquares4(acc.lane[2 * h + 1], _mm256_extractf128_ps(v, 1));
    }
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
