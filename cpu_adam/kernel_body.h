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
// AnyNonFinite, Prefetch, AddSquares16 and StoreLanes.
#ifndef STRATA_CPU_ADAM_KERNEL_BODY_H_
#define STRATA_CPU_ADAM_KERNEL_BODY_H_

#include <cstdint>
#include <cstring>
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
        has_l2(c.has_l2) {}
  F grad_mul, decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2,
      inv_bc2_sqrt, neg_lr, eps;
  bool has_l2;
};

// The update of W elements, in torch's operation order. Returns false, having
// stored nothing, when a scaled gradient is inf or NaN.
template <class V, OptimAlgo A, class G, class S, class O>
inline bool UpdateVector(const VConsts<V, A>& k, float* p, const G* g, S* s1,
                         S* s2, O* out) {
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
    V::Store(s2, v);
  } else if constexpr (A == OptimAlgo::kAdagrad) {
    m = V::Add(m, V::Mul(gv, gv));
    F denom = V::Add(V::Sqrt(m), k.eps);
    pv = V::Add(pv, V::Div(V::Mul(k.neg_lr, gv), denom));
  } else {  // Lion
    F c = V::Add(V::Mul(m, k.beta1), V::Mul(k.one_minus_beta1, gv));
    pv = V::Add(pv, V::Mul(k.neg_lr, V::Sign(c)));
    m = V::Add(V::Mul(m, k.beta2), V::Mul(k.one_minus_beta2, gv));
  }
  V::Store(s1, m);
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
    if (!UpdateVector<V, A, G, S, O>(k, p, g, s1, s2, out)) return false;
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
      if (!UpdateVector<V, A, G, S, O>(k, p + i, g + i, s1 + i, s2i, outi)) {
        return i;
      }
    }
    if (i < end && !Partial(k, x, i, end - i)) return i;
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
