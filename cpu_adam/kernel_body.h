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
// AnyNonFinite, Prefetch, AddSquares (the squares of a vector into lanes
// `lane`.., a multiple of W below 16) and StoreLanes; for 8-bit state
// Abs, Sub, Max (no NaN reaches it), MaxLanes, Trunc, CopySign, BitsToF
// (the bit pattern read as an int32, converted), a mask type M with Ge and
// Select, int32 lanes I with SetI, TruncI, CountIf (+1 where a mask is
// set), MinI, MaxI, AddI and Exponent, a Table of 8 floats with MakeTable
// and Lut8 (indexed by I, 0..7), and LoadCodes/StoreCodes (W bytes as
// floats 0..255); for bf16 state Noise (MixBits of each lane's index, mod 2^32,
// xor a seed) and StoreStochastic.
#ifndef STRATA_CPU_ADAM_KERNEL_BODY_H_
#define STRATA_CPU_ADAM_KERNEL_BODY_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cpu_adam/kernels.h"
#include "cpu_adam/qcodec.h"

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

// Sums of squares in the fixed order of SumSquaresResult: lane (i - begin)
// % 16 of a DAcc adds element i's square in double, in element order, and
// the lanes are added 0..15 at the end. A step adds its gradients' squares
// vector by vector as it loads them (StepPtrs::sum), in the same order.
template <class V, class G>
inline void AddSquares16(typename V::DAcc& acc, const G* g) {
  for (size_t l = 0; l < 16; l += V::W) V::AddSquares(acc, V::Load(g + l), l);
}

template <class V>
inline double SumOfLanes(const typename V::DAcc& acc) {
  double lanes[16];
  V::StoreLanes(acc, lanes);
  double sum = 0.0;
  for (double lane : lanes) sum += lane;
  return sum;
}

template <class V, class G>
double SumSquares(const void* grads, size_t begin, size_t end) {
  const G* g = static_cast<const G*>(grads);
  typename V::DAcc acc{};
  size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    PrefetchAhead<V>(g + i);
    AddSquares16<V>(acc, g + i);
  }
  if (i < end) {
    G tmp[16] = {};
    std::memcpy(tmp, g + i, (end - i) * sizeof(G));
    AddSquares16<V>(acc, tmp);
  }
  return SumOfLanes<V>(acc);
}

// The squares of cnt (<= W) gradients at g into lanes `lane`.., through a
// zero-padded copy when cnt < W (a zero adds nothing).
template <class V, class G>
inline void AddSquaresOf(typename V::DAcc& acc, const G* g, size_t cnt,
                         size_t lane) {
  if (cnt == V::W) return V::AddSquares(acc, V::Load(g), lane);
  G tmp[V::W] = {};
  std::memcpy(tmp, g, cnt * sizeof(G));
  V::AddSquares(acc, V::Load(tmp), lane);
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

// The weight decay of W params pv: L2 (into the scaled gradients gv) for
// Adam and Adagrad, decoupled (AdamW, Lion).
template <class V, OptimAlgo A>
inline void Decay(const VConsts<V, A>& k, typename V::F& gv,
                  typename V::F& pv) {
  if constexpr (A == OptimAlgo::kAdam || A == OptimAlgo::kAdagrad) {
    if (k.has_l2) gv = V::Add(gv, V::Mul(k.l2, pv));
  } else {
    pv = V::Mul(pv, k.decay);
  }
}

// Adam's (and AdamW's) moments m, v and params pv of W elements, past
// Decay, in torch's operation order.
template <class V, OptimAlgo A>
inline void AdamMoments(const VConsts<V, A>& k, typename V::F gv,
                        typename V::F& pv, typename V::F& m, typename V::F& v) {
  using F = typename V::F;
  m = V::Add(V::Mul(m, k.beta1), V::Mul(k.one_minus_beta1, gv));
  v = V::Add(V::Mul(v, k.beta2), V::Mul(V::Mul(k.one_minus_beta2, gv), gv));
  F denom = V::Add(V::Mul(V::Sqrt(v), k.inv_bc2_sqrt), k.eps);
  pv = V::Add(pv, V::Div(V::Mul(k.neg_lr, m), denom));
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
  Decay(k, gv, pv);
  if constexpr (A == OptimAlgo::kAdam || A == OptimAlgo::kAdamW) {
    F v = V::Load(s2);
    AdamMoments(k, gv, pv, m, v);
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
    // The squares in the pass where whole vectors start at begin, as their
    // lanes do; after it otherwise (params not aligned to a vector).
    const bool squares = x.sum != nullptr && head == 0;
    typename V::DAcc acc{};
    for (; i + W <= end; i += W) {
      PrefetchAhead<V>(p + i);
      PrefetchAhead<V>(g + i);
      PrefetchAhead<V>(s1 + i);
      if constexpr (kHasState2<A>) PrefetchAhead<V>(s2 + i);
      S* s2i = kHasState2<A> ? s2 + i : nullptr;
      O* outi = std::is_same_v<O, NoOut> ? nullptr : out + i;
      if (squares) V::AddSquares(acc, V::Load(g + i), (i - begin) % 16);
      if (!UpdateVector<V, A, G, S, O>(k, i, p + i, g + i, s1 + i, s2i, outi)) {
        return i;
      }
    }
    if (i < end) {
      if (squares) AddSquaresOf<V>(acc, g + i, end - i, (i - begin) % 16);
      if (!Partial(k, x, i, end - i)) return i;
    }
    if (x.sum != nullptr) {
      *x.sum = squares ? SumOfLanes<V>(acc) : SumSquares<V, G>(g, begin, end);
    }
    return end;
  }
};

// Note [8-bit state] in strata/cpu_adam.h, one block at a time, in two
// passes. The first dequantizes m and v in registers, updates them and the
// params as fp32 state, keeps the results in an fp32 scratch and their
// largest magnitudes (the new scales); the second commits: codes against
// the new scales, and params. A block with a non-finite scaled gradient,
// or whose new m or v would not be finite, is left untouched, so a stop
// leaves whole blocks updated or not. (With finite gradients and stored
// scales no NaN arises, only inf by overflow, which the scales carry.)
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

  // What the first pass carries through a block: the codecs, the block's
  // stored scales, and its new ones lane by lane.
  struct Pass {
    QCodec<V, true> m_codec;
    QCodec<V, false> v_codec;
    F m_scale{}, v_scale{}, m_max{}, v_max{};
    typename V::DAcc squares{};  // of the gradients, when StepPtrs::sum asks
  };

  // W elements at offset j of the block, from params p, gradients g and
  // codes q1, q2 into the scratch. False at a non-finite scaled gradient.
  static bool UpdateOne(const VConsts<V, A>& k, Pass& ps, const float* p,
                        const G* g, const uint8_t* q1, const uint8_t* q2,
                        size_t j, Scratch& s) {
    F gv = V::Mul(V::Load(g), k.grad_mul);
    if (V::AnyNonFinite(gv)) return false;
    F pv = V::Load(p);
    F m = V::Mul(ps.m_codec.Dequantize(V::LoadCodes(q1)), ps.m_scale);
    F v = V::Mul(ps.v_codec.Dequantize(V::LoadCodes(q2)), ps.v_scale);
    Decay(k, gv, pv);
    AdamMoments(k, gv, pv, m, v);
    V::Store(s.p + j, pv);
    V::Store(s.m + j, m);
    V::Store(s.v + j, v);
    ps.m_max = V::Max(ps.m_max, V::Abs(m));
    ps.v_max = V::Max(ps.v_max, v);
    return true;
  }

  // The first pass over the block's cnt elements at i. The last vector's
  // lanes past cnt step zeros (params, gradients and state: codes 127 and
  // 0), which leave the scales as they are and are never stored back.
  static bool Update(const VConsts<V, A>& k, Pass& ps, const StepPtrs& x,
                     size_t i, size_t cnt, Scratch& s) {
    const float* p = x.params + i;
    const G* g = static_cast<const G*>(x.grads) + i;
    const uint8_t* q1 = static_cast<const uint8_t*>(x.state1) + i;
    const uint8_t* q2 = static_cast<const uint8_t*>(x.state2) + i;
    const size_t full = cnt / W * W;
    for (size_t j = 0; j < full; j += W) {
      PrefetchAhead<V>(g + j);
      PrefetchAhead<V>(p + j);
      // Blocks start at multiples of 16 from the call's begin.
      if (x.sum != nullptr) V::AddSquares(ps.squares, V::Load(g + j), j % 16);
      if (!UpdateOne(k, ps, p + j, g + j, q1 + j, q2 + j, j, s)) return false;
    }
    if (full == cnt) return true;
    float pt[W] = {};
    G gt[W] = {};
    uint8_t q1t[W], q2t[W] = {};
    std::memset(q1t, 127, W);
    std::memcpy(pt, p + full, (cnt - full) * sizeof(float));
    std::memcpy(gt, g + full, (cnt - full) * sizeof(G));
    std::memcpy(q1t, q1 + full, cnt - full);
    std::memcpy(q2t, q2 + full, cnt - full);
    if (x.sum != nullptr) V::AddSquares(ps.squares, V::Load(gt), full % 16);
    return UpdateOne(k, ps, pt, gt, q1t, q2t, full, s);
  }

  // The scale of a block's values from their largest magnitude: 0 when it
  // is below FLT_MIN (too small to invert; the values become zeros), NaN
  // when it is not finite.
  static float Scale(F lanes) {
    const float scale = V::MaxLanes(lanes);
    if (!std::isfinite(scale)) return std::numeric_limits<float>::quiet_NaN();
    return scale < std::numeric_limits<float>::min() ? 0.0f : scale;
  }

  // The inverse of a scale (0 for 0: its values become zeros).
  static F Inverse(float scale) {
    return V::Set1(scale > 0.0f ? 1.0f / scale : 0.0f);
  }

  // W elements at offset j of the scratch: m's and v's codes against the
  // inverse scales, the params and their copy in out_type.
  static void CommitOne(const Pass& ps, F m_inv, F v_inv, const Scratch& s,
                        size_t j, uint8_t* q1, uint8_t* q2, float* p, O* out) {
    V::StoreCodes(q1, ps.m_codec.Quantize(V::Mul(V::Load(s.m + j), m_inv)));
    V::StoreCodes(q2, ps.v_codec.Quantize(V::Mul(V::Load(s.v + j), v_inv)));
    const F pv = V::Load(s.p + j);
    V::Store(p, pv);
    if constexpr (!std::is_same_v<O, NoOut>) V::Store(out, pv);
  }

  // The second pass: the block's codes against its new scales, its new
  // params and their copy in out_type.
  static void Commit(const Pass& ps, const StepPtrs& x, size_t i, size_t cnt,
                     const Scratch& s, float m_scale, float v_scale) {
    const F m_inv = Inverse(m_scale), v_inv = Inverse(v_scale);
    uint8_t* q1 = static_cast<uint8_t*>(x.state1) + i;
    uint8_t* q2 = static_cast<uint8_t*>(x.state2) + i;
    float* p = x.params + i;
    O* out = std::is_same_v<O, NoOut> ? nullptr : static_cast<O*>(x.out) + i;
    const size_t full = cnt / W * W;
    for (size_t j = 0; j < full; j += W) {
      CommitOne(ps, m_inv, v_inv, s, j, q1 + j, q2 + j, p + j,
                out == nullptr ? nullptr : out + j);
    }
    if (full == cnt) return;
    const size_t n = cnt - full;
    uint8_t q1t[W], q2t[W];
    float pt[W];
    O outt[W];
    CommitOne(ps, m_inv, v_inv, s, full, q1t, q2t, pt, outt);
    std::memcpy(q1 + full, q1t, n);
    std::memcpy(q2 + full, q2t, n);
    std::memcpy(p + full, pt, n * sizeof(float));
    if (out != nullptr) std::memcpy(out + full, outt, n * sizeof(O));
  }

  static size_t Run(const StepConsts& c, const StepPtrs& x, size_t begin,
                    size_t end) {
    VConsts<V, A> k(c);
    Scratch s;
    Pass ps{QCodec<V, true>(*c.map1), QCodec<V, false>(*c.map2)};
    for (size_t i = begin; i < end; i += B) {
      const size_t cnt = end - i < B ? end - i : B;
      const size_t b = i / B;
      ps.m_scale = V::Set1(x.scale1[b]);
      ps.v_scale = V::Set1(x.scale2[b]);
      ps.m_max = ps.v_max = V::Set1(0.0f);
      if (!Update(k, ps, x, i, cnt, s)) return i;
      const float m_scale = Scale(ps.m_max), v_scale = Scale(ps.v_max);
      if (std::isnan(m_scale) || std::isnan(v_scale)) return i;
      Commit(ps, x, i, cnt, s, m_scale, v_scale);
      x.scale1[b] = m_scale;
      x.scale2[b] = v_scale;
    }
    if (x.sum != nullptr) *x.sum = SumOfLanes<V>(ps.squares);
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
  if constexpr (std::is_same_v<G, float>) {
    row[3] = &StepKernel<V, A, G, S, float>::Run;
  }
}

template <class V, OptimAlgo A, class G>
void FillStates(StepFn (*rows)[kNumOuts]) {
  FillOuts<V, A, G, float>(rows[0]);
  FillOuts<V, A, G, Bf16>(rows[1]);
  if constexpr (kHasState2<A>) {
    rows[2][0] = &Q8StepKernel<V, A, G, NoOut>::Run;
    rows[2][1] = &Q8StepKernel<V, A, G, Bf16>::Run;
    rows[2][2] = &Q8StepKernel<V, A, G, F16>::Run;
    if constexpr (std::is_same_v<G, float>) {
      rows[2][3] = &Q8StepKernel<V, A, G, float>::Run;
    }
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
