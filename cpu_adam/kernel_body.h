// The optimizer kernels, written once over a vector-traits class V and
// compiled once per ISA (isa_scalar.cc, isa_avx2.cc, isa_avx512.cc), each
// translation unit with its own -m flags.
//
// Note [One body, three ISAs]
// Why: the three paths must agree bit for bit (the driver may pick any of
// them, and the scalar one is the reference), so the arithmetic is written
// once. How: V supplies W-lane loads/stores with type conversion and the four
// IEEE operations (add, mul, div, sqrt), which are correctly rounded on
// every ISA; the library is built with -ffp-contract=off so no path fuses a
// multiply-add that another does not. Limits: everything here sits in an
// anonymous namespace, so each ISA unit gets private copies; a shared inline
// function compiled with -mavx512f could otherwise be picked by the linker
// for a scalar caller and fault on an older CPU. Only V-independent helpers
// that stay trivial belong here.
//
// A V provides: W, F (a vector of W floats), DAcc (16 double lanes), Set1,
// Load/Store for float, Bf16 and F16, Add, Mul, Div, Sqrt, Sign,
// AnyNonFinite, Prefetch, AddSquares16 and StoreLanes; for 8-bit state
// Abs, Sub, Max (no NaN reaches it), Min (NaN gives the second operand, as
// MINPS), MaxLanes, Trunc, a mask type M with Ge, Lt, And, Ones (1.0f
// where set) and Select, int32 lanes I with SetI, CountIf (+1 where a mask
// is set), MinI, AddI and Exponent, a Table of 8 floats with MakeTable and
// Lut8 (indexed by I), and LoadCodes/StoreCodes (W bytes as floats
// 0..255); for bf16 state Noise (MixBits of each lane's index, mod 2^32,
// xor a seed) and StoreStochastic.
#ifndef STRATA_CPU_ADAM_KERNEL_BODY_H_
#define STRATA_CPU_ADAM_KERNEL_BODY_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cpu_adam/kernels.h"

namespace strata::cpu_adam {
namespace {

struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};
struct NoOut {};

// Bytes ahead of the current element that each input stream is prefetched:
// far enough that DRAM latency is covered while the core does the divide and
// square root of the current vectors (measured: 2 KiB of fp32 brings the
// fp32 AdamW pass from 0.85 to 0.98 of the streaming roofline on 2 cores).
constexpr size_t kPrefetchBytes = 2048;

template <class V, class T>
inline void PrefetchAhead(const T* p) {
  V::Prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes);
}

// Elements (fewer than W) before p is aligned to a whole vector, so the
// full-vector loads and stores of params never split a cache line.
template <class V>
inline size_t HeadCount(const float* p) {
  constexpr size_t kVecBytes = V::W * sizeof(float);
  uintptr_t mis = reinterpret_cast<uintptr_t>(p) % kVecBytes;
  if (mis % sizeof(float) != 0) return 0;
  return ((kVecBytes - mis) % kVecBytes) / sizeof(float);
}

template <class V, OptimAlgo A>
struct VConsts {
  using F = typename V::F;
  explicit VConsts(const StepConsts& c)
      : grad_mul(V::Set1(c.grad_mul)),
        decay(V::Set1(c.decay)),
        l2(V::Set1(c.l2)),
        beta1(V::Set1(c.beta1)),
        one_minus_beta1(V::Set1(c.one_minus_beta1)),
        beta2(V::Set1(c.beta2)),
        one_minus_beta2(V::Set1(c.one_minus_beta2)),
        inv_bc2_sqrt(V::Set1(c.inv_bc2_sqrt)),
        neg_lr(V::Set1(c.neg_lr)),
        eps(V::Set1(c.eps)),
        has_l2(c.has_l2),
        noise_seed(c.noise_seed) {}
  F grad_mul, decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2,
      inv_bc2_sqrt, neg_lr, eps;
  bool has_l2;
  uint32_t noise_seed;
};

// The streams of state1's and state2's stochastic rounding, apart.
constexpr uint32_t kNoiseStream1 = 0;
constexpr uint32_t kNoiseStream2 = 0x68E31DA4u;

// Stores W state elements, the first of them element i of the buffers:
// bf16 state rounded stochastically (strata/cpu_adam.h, StateFormat).
template <class V, OptimAlgo A, class S>
inline void StoreState(const VConsts<V, A>& k, S* s, typename V::F v, size_t i,
                       uint32_t stream) {
  if constexpr (std::is_same_v<S, Bf16>) {
    V::StoreStochastic(s, v, V::Noise(k.noise_seed ^ stream, i));
  } else {
    V::Store(s, v);
  }
}

// The update of W elements, the first of them element i of the buffers, in
// torch's operation order. Returns false, having stored nothing, when a
// scaled gradient is inf or NaN.
template <class V, OptimAlgo A, class G, class S, class O>
inline bool UpdateVector(const VConsts<V, A>& k, size_t i, float* p, const G* g,
                         S* s1, S* s2, O* out) {
  using F = typename V::F;
  F gv = V::Mul(V::Load(g), k.grad_mul);
  if (V::AnyNonFinite(gv)) return false;
  F pv = V::Load(p);
  F m = V::Load(s1);
  if constexpr (A == OptimAlgo::kAdam || A == OptimAlgo::kAdagrad) {
    if (k.has_l2) gv = V::Add(gv, V::Mul(k.l2, pv));
  } else {
    pv = V::Mul(pv, k.decay);
  }
  if constexpr (A == OptimAlgo::kAdam || A == OptimAlgo::kAdamW) {
    F v = V::Load(s2);
    m = V::Add(V::Mul(m, k.beta1), V::Mul(k.one_minus_beta1, gv));
    v = V::Add(V::Mul(v, k.beta2), V::Mul(V::Mul(k.one_minus_beta2, gv), gv));
    F denom = V::Add(V::Mul(V::Sqrt(v), k.inv_bc2_sqrt), k.eps);
    pv = V::Add(pv, V::Div(V::Mul(k.neg_lr, m), denom));
    StoreState(k, s2, v, i, kNoiseStream2);
  } else if constexpr (A == OptimAlgo::kAdagrad) {
    m = V::Add(m, V::Mul(gv, gv));
    F denom = V::Add(V::Sqrt(m), k.eps);
    pv = V::Add(pv, V::Div(V::Mul(k.neg_lr, gv), denom));
  } else {  // Lion
    F c = V::Add(V::Mul(m, k.beta1), V::Mul(k.one_minus_beta1, gv));
    pv = V::Add(pv, V::Mul(k.neg_lr, V::Sign(c)));
    m = V::Add(V::Mul(m, k.beta2), V::Mul(k.one_minus_beta2, gv));
  }
  StoreState(k, s1, m, i, kNoiseStream1);
  V::Store(p, pv);
  if constexpr (!std::is_same_v<O, NoOut>) V::Store(out, pv);
  return true;
}

template <OptimAlgo A>
constexpr bool kHasState2 = A == OptimAlgo::kAdam || A == OptimAlgo::kAdamW;

template <class V, OptimAlgo A, class G, class S, class O>
struct StepKernel {
  static constexpr size_t W = V::W;

  // cnt < W elements at i, through W-element copies (zero-padded: a zero
  // gradient is finite, and the padding is never copied back).
  static bool Partial(const VConsts<V, A>& k, const StepPtrs& x, size_t i,
                      size_t cnt) {
    float p[W] = {};
    G g[W] = {};
    S s1[W] = {}, s2[W] = {};
    O out[W] = {};
    std::memcpy(p, static_cast<float*>(x.params) + i, cnt * sizeof(float));
    std::memcpy(g, static_cast<const G*>(x.grads) + i, cnt * sizeof(G));
    std::memcpy(s1, static_cast<S*>(x.state1) + i, cnt * sizeof(S));
    if constexpr (kHasState2<A>) {
      std::memcpy(s2, static_cast<S*>(x.state2) + i, cnt * sizeof(S));
    }
    if (!UpdateVector<V, A, G, S, O>(k, i, p, g, s1, s2, out)) return false;
    std::memcpy(x.params + i, p, cnt * sizeof(float));
    std::memcpy(static_cast<S*>(x.state1) + i, s1, cnt * sizeof(S));
    if constexpr (kHasState2<A>) {
      std::memcpy(static_cast<S*>(x.state2) + i, s2, cnt * sizeof(S));
    }
    if constexpr (!std::is_same_v<O, NoOut>) {
      std::memcpy(static_cast<O*>(x.out) + i, out, cnt * sizeof(O));
    }
    return true;
  }

  static size_t Run(const StepConsts& c, const StepPtrs& x, size_t begin,
                    size_t end) {
    VConsts<V, A> k(c);
    float* p = x.params;
    const G* g = static_cast<const G*>(x.grads);
    S* s1 = static_cast<S*>(x.state1);
    S* s2 = static_cast<S*>(x.state2);
    O* out = static_cast<O*>(x.out);
    size_t i = begin;
    size_t head = HeadCount<V>(p + begin);
    if (head > end - begin) head = end - begin;
    if (head > 0) {
      if (!Partial(k, x, i, head)) return i;
      i += head;
    }
    for (; i + W <= end; i += W) {
      PrefetchAhead<V>(p + i);
      PrefetchAhead<V>(g + i);
      PrefetchAhead<V>(s1 + i);
      if constexpr (kHasState2<A>) PrefetchAhead<V>(s2 + i);
      S* s2i = kHasState2<A> ? s2 + i : nullptr;
      O* outi = std::is_same_v<O, NoOut> ? nullptr : out + i;
      if (!UpdateVector<V, A, G, S, O>(k, i, p + i, g + i, s1 + i, s2i, outi)) {
        return i;
      }
    }
    if (i < end && !Partial(k, x, i, end - i)) return i;
    return end;
  }
};

// The codes of a QMap (cpu_adam/qmap.h) for W values at a time, in the
// fp32 expressions qmap.h defines; the region r of a value selects its
// decade's constants from registers (Lut8), not from memory. Copied by
// value into each loop: the codes' stores (bytes) could alias a member
// read through a reference, which would then be loaded again each vector.
template <class V, bool kSigned>
struct QCodec {
  using F = typename V::F;
  using I = typename V::I;
  using M = typename V::M;
  using T = typename V::Table;

  explicit QCodec(const QMap& q)
      : a(V::MakeTable(q.a)),
        b(V::MakeTable(q.b)),
        inv_a(V::MakeTable(q.inv_a)),
        last(V::MakeTable(q.last)),
        base(V::MakeTable(q.base)),
        one_threshold(V::Set1(q.one_threshold)),
        one_index(V::Set1(q.one_index)) {
    for (int d = 0; d < 7; ++d) edge[d] = V::Set1(q.b[d + 1]);
  }

  // Values relative to their block's scale to codes (as floats). The
  // first guess of the bucket is it or the one below (QMap::inv_a).
  F Quantize(F x) const {
    const F xa = V::Min(V::Abs(x), V::Set1(2.0f));
    I r = V::SetI(0);
#pragma GCC unroll 7
    for (int d = 0; d < 7; ++d) r = V::CountIf(r, V::Ge(xa, edge[d]));
    const F ar = V::Lut8(a, r), br = V::Lut8(b, r), lr = V::Lut8(last, r);
    F j = V::Min(V::Trunc(V::Mul(V::Sub(xa, br), V::Lut8(inv_a, r))), lr);
    const F next = V::Add(j, V::Set1(1.0f));
    j = V::Add(j, V::Ones(V::And(V::Ge(xa, V::Add(V::Mul(next, ar), br)),
                                 V::Lt(j, lr))));
    const F mag = V::Select(V::Ge(xa, one_threshold), one_index,
                            V::Add(V::Lut8(base, r), j));
    if constexpr (!kSigned) return mag;
    const F mid = V::Set1(127.0f);
    return V::Select(V::Lt(x, V::Set1(0.0f)), V::Sub(mid, V::Min(mag, mid)),
                     V::Add(mid, mag));
  }

  // Codes (as floats) to values relative to their block's scale. The
  // region of a magnitude index is a power of two's exponent: decade d
  // starts at index 2^(d+1) - 1 (unsigned) or 2^d (signed).
  F Dequantize(F code) const {
    const F mid = V::Set1(127.0f);
    const M neg = V::Lt(code, mid);
    const F mag =
        kSigned ? V::Select(neg, V::Sub(mid, code), V::Sub(code, mid)) : code;
    const I r = V::MinI(
        kSigned ? V::AddI(V::Exponent(V::Add(mag, V::Set1(0.5f))), V::SetI(1))
                : V::Exponent(V::Add(mag, V::Set1(1.0f))),
        V::SetI(7));
    F v = V::Add(V::Mul(V::Add(V::Sub(mag, V::Lut8(base, r)), V::Set1(0.5f)),
                        V::Lut8(a, r)),
                 V::Lut8(b, r));
    v = V::Select(V::Ge(mag, one_index), V::Set1(1.0f), v);
    if constexpr (!kSigned) return v;
    return V::Select(neg, V::Sub(V::Set1(0.0f), v), v);
  }

  T a, b, inv_a, last, base;
  F one_threshold, one_index;
  F edge[7];  // QMap::b[1..7]: where decades 0..6 start
};

// Note [8-bit state] in strata/cpu_adam.h, one block at a time: its params,
// m and v (dequantized) in fp32 scratch, updated there by UpdateVector as
// fp32 state, then committed: codes against the block's new scales, and
// params. A block with a non-finite scaled gradient, or whose new m or v
// would not be finite, is left untouched, so a stop leaves whole blocks
// updated or not.
template <class V, OptimAlgo A, class G, class O>
struct Q8StepKernel {
  static constexpr size_t W = V::W;
  static constexpr size_t B = kQ8Block;
  static_assert(B % W == 0 && kHasState2<A>);
  using F = typename V::F;

  struct Scratch {
    alignas(64) float p[B];
    alignas(64) float m[B];
    alignas(64) float v[B];
  };

  static bool AnyNonFinite(const VConsts<V, A>& k, const G* g, size_t cnt) {
    G tail[W] = {};
    const size_t full = cnt / W * W;
    std::memcpy(tail, g + full, (cnt - full) * sizeof(G));
    bool bad = V::AnyNonFinite(V::Mul(V::Load(tail), k.grad_mul));
    for (size_t j = 0; j < full && !bad; j += W) {
      bad = V::AnyNonFinite(V::Mul(V::Load(g + j), k.grad_mul));
    }
    return bad;
  }

  // The block's cnt codes of `q` into `out` (whole vectors: the codes past
  // cnt read as code 0 and are never stored back).
  template <bool kSigned>
  static void Dequant(const QCodec<V, kSigned> codec, const uint8_t* q,
                      float scale, size_t cnt, float* out) {
    const F s = V::Set1(scale);
    const size_t full = cnt / W * W;
    for (size_t j = 0; j < full; j += W) {
      V::Store(out + j, V::Mul(codec.Dequantize(V::LoadCodes(q + j)), s));
    }
    if (full < cnt) {
      uint8_t tail[W] = {};
      std::memcpy(tail, q + full, cnt - full);
      V::Store(out + full, V::Mul(codec.Dequantize(V::LoadCodes(tail)), s));
    }
  }

  // The scale of `in`'s first cnt values (whole vectors: the scratch is
  // zero past cnt): their largest magnitude, 0 when it is below FLT_MIN
  // (too small to invert; the values become zeros), NaN when one is not
  // finite.
  static float Scale(const float* in, size_t cnt) {
    bool bad = false;
    F mx = V::Set1(0.0f);
    for (size_t j = 0; j < cnt; j += W) {
      const F x = V::Load(in + j);
      bad = bad || V::AnyNonFinite(x);
      if (!bad) mx = V::Max(mx, V::Abs(x));
    }
    if (bad) return std::numeric_limits<float>::quiet_NaN();
    const float scale = V::MaxLanes(mx);
    return scale < std::numeric_limits<float>::min() ? 0.0f : scale;
  }

  template <bool kSigned>
  static void Encode(const QCodec<V, kSigned> codec, const float* in,
                     size_t cnt, float scale, uint8_t* q) {
    const F inv = V::Set1(scale > 0.0f ? 1.0f / scale : 0.0f);
    const size_t full = cnt / W * W;
    for (size_t j = 0; j < full; j += W) {
      V::StoreCodes(q + j, codec.Quantize(V::Mul(V::Load(in + j), inv)));
    }
    if (full < cnt) {
      uint8_t t[W];
      V::StoreCodes(t, codec.Quantize(V::Mul(V::Load(in + full), inv)));
      std::memcpy(q + full, t, cnt - full);
    }
  }

  // The new params of the block in s.p, from its params and gradients.
  static void Update(const VConsts<V, A>& k, const StepPtrs& x, size_t i,
                     size_t cnt, Scratch& s) {
    const G* g = static_cast<const G*>(x.grads) + i;
    std::memcpy(s.p, x.params + i, cnt * sizeof(float));
    std::memset(s.p + cnt, 0, (B - cnt) * sizeof(float));
    const size_t full = cnt / W * W;
    for (size_t j = 0; j < full; j += W) {
      PrefetchAhead<V>(g + j);
      UpdateVector<V, A, G, float, NoOut>(k, i + j, s.p + j, g + j, s.m + j,
                                          s.v + j, nullptr);
    }
    if (full == cnt) return;
    G gt[W] = {};
    std::memcpy(gt, g + full, (cnt - full) * sizeof(G));
    UpdateVector<V, A, G, float, NoOut>(k, i + full, s.p + full, gt, s.m + full,
                                        s.v + full, nullptr);
  }

  // The block's new params, and their copy in out_type.
  static void Commit(const StepPtrs& x, size_t i, size_t cnt,
                     const Scratch& s) {
    std::memcpy(x.params + i, s.p, cnt * sizeof(float));
    if constexpr (!std::is_same_v<O, NoOut>) {
      O* out = static_cast<O*>(x.out) + i;
      const size_t full = cnt / W * W;
      for (size_t j = 0; j < full; j += W) V::Store(out + j, V::Load(s.p + j));
      if (full < cnt) {
        O t[W];
        V::Store(t, V::Load(s.p + full));
        std::memcpy(out + full, t, (cnt - full) * sizeof(O));
      }
    }
  }

  static size_t Run(const StepConsts& c, const StepPtrs& x, size_t begin,
                    size_t end) {
    VConsts<V, A> k(c);
    const QCodec<V, true> m_codec(*c.map1);
    const QCodec<V, false> v_codec(*c.map2);
    Scratch s;
    auto* q1 = static_cast<uint8_t*>(x.state1);
    auto* q2 = static_cast<uint8_t*>(x.state2);
    for (size_t i = begin; i < end; i += B) {
      const size_t cnt = end - i < B ? end - i : B;
      const size_t b = i / B;
      if (AnyNonFinite(k, static_cast<const G*>(x.grads) + i, cnt)) return i;
      Dequant(m_codec, q1 + i, x.scale1[b], cnt, s.m);
      Dequant(v_codec, q2 + i, x.scale2[b], cnt, s.v);
      Update(k, x, i, cnt, s);
      std::memset(s.m + cnt, 0, (B - cnt) * sizeof(float));
      std::memset(s.v + cnt, 0, (B - cnt) * sizeof(float));
      const float m_scale = Scale(s.m, cnt), v_scale = Scale(s.v, cnt);
      if (std::isnan(m_scale) || std::isnan(v_scale)) return i;
      Encode(m_codec, s.m, cnt, m_scale, q1 + i);
      Encode(v_codec, s.v, cnt, v_scale, q2 + i);
      x.scale1[b] = m_scale;
      x.scale2[b] = v_scale;
      Commit(x, i, cnt, s);
    }
    return end;
  }
};

// Applies fn to W-element vectors of [begin, end) of src, prefetched ahead;
// the last, partial one is copied into a zero-padded buffer first.
template <class V, class G, class Fn>
inline void ForEachVector(const G* src, size_t begin, size_t end, Fn fn) {
  size_t i = begin;
  for (; i + V::W <= end; i += V::W) {
    PrefetchAhead<V>(src + i);
    fn(V::Load(src + i), i, V::W);
  }
  if (i < end) {
    G tmp[V::W] = {};
    std::memcpy(tmp, src + i, (end - i) * sizeof(G));
    fn(V::Load(tmp), i, end - i);
  }
}

template <class V, class G>
bool NonFinite(const void* grads, float grad_mul, size_t begin, size_t end) {
  typename V::F k = V::Set1(grad_mul);
  bool bad = false;
  ForEachVector<V>(static_cast<const G*>(grads), begin, end,
                   [&](typename V::F v, size_t, size_t) {
                     bad = bad || V::AnyNonFinite(V::Mul(v, k));
                   });
  return bad;
}

template <class V, class G>
double SumSquares(const void* grads, size_t begin, size_t end) {
  const G* g = static_cast<const G*>(grads);
  typename V::DAcc acc{};
  size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    PrefetchAhead<V>(g + i);
    V::AddSquares16(acc, g + i);
  }
  if (i < end) {
    G tmp[16] = {};
    std::memcpy(tmp, g + i, (end - i) * sizeof(G));
    V::AddSquares16(acc, tmp);
  }
  double lanes[16];
  V::StoreLanes(acc, lanes);
  double sum = 0.0;
  for (double lane : lanes) sum += lane;
  return sum;
}

template <class V, class T>
void ToF32(const void* src, float* dst, size_t begin, size_t end) {
  ForEachVector<V>(static_cast<const T*>(src), begin, end,
                   [&](typename V::F v, size_t i, size_t cnt) {
                     if (cnt == V::W) return V::Store(dst + i, v);
                     float tmp[V::W];
                     V::Store(tmp, v);
                     std::memcpy(dst + i, tmp, cnt * sizeof(float));
                   });
}

template <class V, class T>
void FromF32(const float* src, void* dst, size_t begin, size_t end) {
  T* out = static_cast<T*>(dst);
  ForEachVector<V>(src, begin, end, [&](typename V::F v, size_t i, size_t cnt) {
    if (cnt == V::W) return V::Store(out + i, v);
    T tmp[V::W];
    V::Store(tmp, v);
    std::memcpy(out + i, tmp, cnt * sizeof(T));
  });
}

template <class V, OptimAlgo A, class G, class S>
void FillOuts(StepFn* row) {
  row[0] = &StepKernel<V, A, G, S, NoOut>::Run;
  row[1] = &StepKernel<V, A, G, S, Bf16>::Run;
  row[2] = &StepKernel<V, A, G, S, F16>::Run;
}

template <class V, OptimAlgo A, class G>
void FillStates(StepFn (*rows)[kNumOuts]) {
  FillOuts<V, A, G, float>(rows[0]);
  FillOuts<V, A, G, Bf16>(rows[1]);
  if constexpr (kHasState2<A>) {
    rows[2][0] = &Q8StepKernel<V, A, G, NoOut>::Run;
    rows[2][1] = &Q8StepKernel<V, A, G, Bf16>::Run;
    rows[2][2] = &Q8StepKernel<V, A, G, F16>::Run;
  }
}

template <class V, OptimAlgo A>
void FillGrads(KernelTable& t) {
  FillStates<V, A, float>(t.step[static_cast<int>(A)][0]);
  FillStates<V, A, Bf16>(t.step[static_cast<int>(A)][1]);
  FillStates<V, A, F16>(t.step[static_cast<int>(A)][2]);
}

template <class V>
KernelTable MakeKernelTable(CpuIsa isa) {
  KernelTable t{};
  t.isa = isa;
  FillGrads<V, OptimAlgo::kAdam>(t);
  FillGrads<V, OptimAlgo::kAdamW>(t);
  FillGrads<V, OptimAlgo::kAdagrad>(t);
  FillGrads<V, OptimAlgo::kLion>(t);
  t.non_finite[0] = &NonFinite<V, float>;
  t.non_finite[1] = &NonFinite<V, Bf16>;
  t.non_finite[2] = &NonFinite<V, F16>;
  t.sum_squares[0] = &SumSquares<V, float>;
  t.sum_squares[1] = &SumSquares<V, Bf16>;
  t.sum_squares[2] = &SumSquares<V, F16>;
  t.to_f32[1] = &ToF32<V, Bf16>;
  t.to_f32[2] = &ToF32<V, F16>;
  t.from_f32[1] = &FromF32<V, Bf16>;
  t.from_f32[2] = &FromF32<V, F16>;
  return t;
}

}  // namespace
}  // namespace strata::cpu_adam

#endif  // STRATA_CPU_ADAM_KERNEL_BODY_H_
