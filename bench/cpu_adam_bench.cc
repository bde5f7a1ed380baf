// cpu_adam_bench: the fused CPU optimizer step against the memory-bandwidth
// roofline, measured in the same process, on the same buffers, interleaved
// iteration by iteration.
//
// Run:
//   build/bin/cpu_adam_bench --benchmark_filter='AdamW/fp32/268435456'
//   build/bin/cpu_adam_bench --benchmark_counters_tabular=true
// Environment: STRATA_CPU_THREADS (default: every core), STRATA_CPU_ISA.
// Each size runs a fixed number of iterations (5 at 256M and up), so the
// names carry Google Benchmark's "/iterations:N" suffix: filter by prefix.
//
// Benchmarks (n = parameters, 1M to 512M):
//   AdamW/fp32/n              fp32 params, grads, m, v; one pass.
//   AdamW/bf16grad_bf16out/n  bf16 grads in, fp32 master/m/v, bf16 params
//                             out, unscale and overflow check fused.
//     Both run the one-pass kStopAtNonFinite policy: the inf/NaN check is
//     fused, and an inf/NaN stops the pass with part of the elements updated.
//   AdamW/<either>_skipstep/n  the same step in the default kSkipStep policy
//                             (all or nothing): a scan of the gradients for
//                             inf/NaN first, then the pass. Its roofline
//                             reads the gradients twice as well.
//   AdamW/q8_<either>/n       the same with 8-bit m and v (StateFormat::kQ8,
//                             Note [8-bit state]); its roofline streams the
//                             same bytes (1 byte of m and of v an element;
//                             the 4-byte scale per 256 elements, under 2% of
//                             them, is left out: the ratio errs against us).
//   ZeroStep/bf16grad_bf16out/n  the CPU side of a ZeRO-Offload step:
//                             SumSquares over the bf16 grads (global norm),
//                             then the fused step above with the clip
//                             coefficient (SumSquares has already shown the
//                             gradients finite, so one pass is safe).
//   ZeroStep/<fp32|q8_fp32>/n  the same over fp32 grads (fp32 or 8-bit
//                             state), beside <...>_norm_in_pass: the step
//                             taking the norm in its own pass instead
//                             (StepHooks::piece_sums, as a speculative step
//                             of the pipeline does); its roofline reads the
//                             gradients once.
//   SumSquares/bf16/n, Convert/bf16_to_f32/n, Convert/f32_to_bf16/n  the
//                             single-stream passes a pipeline step also
//                             runs; their rooflines are a plain read and
//                             plain widening/narrowing copies.
// The rooflines of a scan or norm pass before the step read the gradient
// bytes once more with the plainest loop there is (an OR of 64-bit words).
// The Time column is the step alone (the roofline runs with the timer
// paused); the figures to read are the counters: params_per_s (median over
// iterations) and vs_roofline: the median time of a plain streaming kernel that
// reads and writes exactly the bytes the step does (fp32 AdamW: reads p, g, m,
// v and writes p, m, v), divided by the median time of the step. The roofline
// kernel is timed with and without software prefetch and the faster of the two
// is used, so the ratio never flatters us. Both run in one TBB arena (the
// optimizer in its kCallerArena mode): with an arena of its own, its workers
// would move between arenas on every call, which costs a small step (1M
// params) about a third of its time and says nothing about the kernel.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "strata/cpu_adam.h"

namespace strata::bench {
namespace {

// What runs over the gradients before the step.
enum class Prepass {
  kNone,  // the step alone, in its one-pass kStopAtNonFinite mode
  kScan,  // the default kSkipStep mode: its all-or-nothing inf/NaN scan
  kNorm,  // SumSquares (the global norm), then the step with a clip coefficient
  kInPass,  // the norm taken in the step's pass (StepHooks::piece_sums)
};

struct Variant {
  const char* name;
  FloatType grad_type;
  bool params_out;
  Prepass prepass;
  StateFormat state = StateFormat::kF32;

  size_t state_bytes() const { return state == StateFormat::kQ8 ? 1 : 4; }
};

int Threads() {
  const char* env = std::getenv("STRATA_CPU_THREADS");
  return env != nullptr && *env != '\0' ? std::atoi(env) : 0;
}

// Page-aligned, huge-page-advised memory that is freed on scope exit.
class Buffer {
 public:
  explicit Buffer(size_t bytes)
      : bytes_((bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20)),
        p_(std::aligned_alloc(2u << 20, bytes_)) {
    madvise(p_, bytes_, MADV_HUGEPAGE);
  }
  ~Buffer() { std::free(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <class T>
  T* as() {
    return static_cast<T*>(p_);
  }

 private:
  size_t bytes_;
  void* p_;
};

// Runs fn(begin, end) over `parts` contiguous ranges of n, one per thread.
template <class Fn>
void Parallel(tbb::task_arena& arena, size_t n, Fn fn) {
  int parts = arena.max_concurrency();
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<int>(0, parts, 1),
        [&](const tbb::blocked_range<int>& r) {
          for (int t = r.begin(); t < r.end(); ++t) {
            fn(n * t / parts / 16 * 16,
               t + 1 == parts ? n : n * (t + 1) / parts / 16 * 16);
          }
        },
        tbb::static_partitioner());
  });
}

struct Step {
  float* p;
  void *m, *v;  // fp32, or kQ8 codes with their scales in ms, vs
  void* g;
  uint16_t* out;
  size_t n;
  float *ms = nullptr, *vs = nullptr;
};

// The streaming kernel: the same loads and stores as the step, with one
// multiply-add per stream instead of Adam's arithmetic. __restrict lets the
// compiler vectorize it; the prefetching variant issues its prefetches once
// per 16 elements, outside the vectorized inner loop.
template <bool kPrefetch, class G, class S>
void Stream(const Step& s, size_t begin, size_t end) {
  float* __restrict pp = s.p;
  S* __restrict mp = static_cast<S*>(s.m);
  S* __restrict vp = static_cast<S*>(s.v);
  const G* __restrict g = static_cast<const G*>(s.g);
  uint16_t* __restrict out = s.out;
  auto element = [&](size_t i) {
    float gi;
    if constexpr (sizeof(G) == 2) {
      gi = std::bit_cast<float>(static_cast<uint32_t>(g[i]) << 16);
    } else {
      gi = g[i];
    }
    float p = pp[i] + gi * 1e-9f;
    pp[i] = p;
    if constexpr (sizeof(S) == 1) {
      const auto gb = static_cast<uint8_t>(std::bit_cast<uint32_t>(gi));
      mp[i] = static_cast<uint8_t>(mp[i] + gb);
      vp[i] = static_cast<uint8_t>(vp[i] ^ gb);
    } else {
      mp[i] = mp[i] * 0.5f + gi;
      vp[i] = vp[i] * 0.5f + gi;
    }
    if constexpr (sizeof(G) == 2) {
      out[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(p) >> 16);
    }
  };
  size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    if (kPrefetch) {
      __builtin_prefetch(pp + i + 512);
      __builtin_prefetch(mp + i + 512);
      __builtin_prefetch(vp + i + 512);
      __builtin_prefetch(g + i + 2048 / sizeof(G));
    }
    for (size_t k = 0; k < 16; ++k) element(i + k);
  }
  for (; i < end; ++i) element(i);
}

// One plain read of the gradient bytes: the floor of both the inf/NaN scan
// and the norm pass. An OR over 64-bit words, which the compiler vectorizes;
// nothing cheaper can read memory.
template <bool kPrefetch>
uint64_t ReadStream(const uint64_t* w, size_t begin, size_t end) {
  uint64_t acc = 0;
  size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    if (kPrefetch) __builtin_prefetch(w + i + 256);
    for (size_t k = 0; k < 8; ++k) acc |= w[i + k];
  }
  for (; i < end; ++i) acc |= w[i];
  return acc;
}

template <bool kPrefetch>
double RooflineOnce(tbb::task_arena& arena, const Step& s, const Variant& v) {
  auto t0 = std::chrono::steady_clock::now();
  if (v.prepass == Prepass::kScan || v.prepass == Prepass::kNorm) {
    const size_t bytes = FloatTypeSize(v.grad_type);
    std::vector<uint64_t> ors(arena.max_concurrency());
    Parallel(arena, s.n, [&](size_t b, size_t e) {
      ors[b * ors.size() / s.n] = ReadStream<kPrefetch>(
          static_cast<const uint64_t*>(s.g), b * bytes / 8, e * bytes / 8);
    });
    benchmark::DoNotOptimize(ors.data());
  }
  Parallel(arena, s.n, [&](size_t b, size_t e) {
    const bool q8 = v.state == StateFormat::kQ8;
    if (v.grad_type == FloatType::kF32) {
      q8 ? Stream<kPrefetch, float, uint8_t>(s, b, e)
         : Stream<kPrefetch, float, float>(s, b, e);
    } else {
      q8 ? Stream<kPrefetch, uint16_t, uint8_t>(s, b, e)
         : Stream<kPrefetch, uint16_t, float>(s, b, e);
    }
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

constexpr float kLossScale = 1024.0f;

Result<StepReport> OurStep(CpuOptimizer& opt, const Step& s, const Variant& v,
                           int64_t step) {
  StepOptions o;
  o.algo = OptimAlgo::kAdamW;
  o.hyper.step = step;
  o.hyper.weight_decay = 0.01;
  o.overflow = v.prepass == Prepass::kScan ? OverflowPolicy::kSkipStep
                                           : OverflowPolicy::kStopAtNonFinite;
  if (v.grad_type != FloatType::kF32) o.prep.grad_scale = 1.0f / kLossScale;
  if (v.prepass == Prepass::kNorm) {
    STRATA_ASSIGN_OR_RETURN(SumSquaresResult ss,
                            opt.SumSquares(s.g, v.grad_type, s.n));
    double norm = std::sqrt(ss.sum) / kLossScale;
    o.prep.clip_coef = static_cast<float>(std::min(1.0, 1.0 / (norm + 1e-6)));
  }
  OptimBuffers b;
  b.params = s.p;
  b.grads = s.g;
  b.grad_type = v.grad_type;
  b.state1 = s.m;
  b.state2 = s.v;
  b.state_format = v.state;
  if (v.state == StateFormat::kQ8) {
    b.state1_scale = s.ms;
    b.state2_scale = s.vs;
  }
  b.params_out = v.params_out ? s.out : nullptr;
  b.n = s.n;
  if (v.prepass != Prepass::kInPass) return opt.Step(o, b);
  std::vector<double> sums((s.n + kStepPiece - 1) / kStepPiece);
  CpuOptimizer::StepHooks hooks;
  hooks.piece_sums = sums.data();
  Result<StepReport> r = opt.Step(o, b, hooks);
  if (r.ok() && !SumPieces(sums.data(), sums.size()).finite) {
    return Status::Internal("the sums of squares are not finite");
  }
  return r;
}

// Correctness before timing: the chosen path and the scalar reference take
// the same step on a prefix of the data and must agree bit for bit.
bool MatchesScalar(CpuOptimizer& opt, const Step& s, const Variant& v) {
  size_t n = std::min<size_t>(s.n, 1 << 16);
  auto scalar = CpuOptimizer::Create({.isa = CpuIsa::kScalar, .threads = 1});
  if (!scalar.ok()) return false;
  const size_t state = n * v.state_bytes();
  const size_t blocks = Q8Blocks(n);
  std::vector<float> p[2], ms[2], vs[2];
  std::vector<char> m[2], vv[2];
  std::vector<uint16_t> out[2];
  for (int k = 0; k < 2; ++k) {
    p[k].assign(s.p, s.p + n);
    m[k].assign(static_cast<char*>(s.m), static_cast<char*>(s.m) + state);
    vv[k].assign(static_cast<char*>(s.v), static_cast<char*>(s.v) + state);
    ms[k].assign(blocks, 0);
    vs[k].assign(blocks, 0);
    out[k].assign(n, 0);
    Step copy{p[k].data(),   m[k].data(), vv[k].data(), s.g,
              out[k].data(), n,           ms[k].data(), vs[k].data()};
    if (!OurStep(k == 0 ? opt : **scalar, copy, v, 1).ok()) return false;
  }
  return p[0] == p[1] && m[0] == m[1] && vv[0] == vv[1] && out[0] == out[1] &&
         ms[0] == ms[1] && vs[0] == vs[1];
}

void Fill(tbb::task_arena& arena, const Step& s, const Variant& v) {
  const FloatType grad_type = v.grad_type;
  Parallel(arena, s.n, [&](size_t b, size_t e) {
    std::memset(static_cast<char*>(s.m) + b * v.state_bytes(), 0,
                (e - b) * v.state_bytes());
    std::memset(static_cast<char*>(s.v) + b * v.state_bytes(), 0,
                (e - b) * v.state_bytes());
    for (size_t i = b; i < e; ++i) {
      float g = static_cast<float>(static_cast<int>(i % 2001) - 1000) * 1e-3f;
      s.p[i] = 0.5f;
      if (grad_type == FloatType::kF32) {
        static_cast<float*>(s.g)[i] = g;
      } else {
        static_cast<uint16_t*>(s.g)[i] = static_cast<uint16_t>(
            std::bit_cast<uint32_t>(g * kLossScale) >> 16);
      }
      if (s.out != nullptr) s.out[i] = 0;
    }
  });
}

// The timing loop of every benchmark: each iteration runs the roofline
// with and without software prefetch (timer paused; the faster counts),
// then ours(), which returns false when it failed. Reports params_per_s =
// n / median(ours) and vs_roofline = median(roofline) / median(ours).
template <class Roof, class Ours>
void Measure(benchmark::State& state, size_t n, const tbb::task_arena& arena,
             CpuIsa isa, Roof roof, Ours ours) {
  std::vector<double> mine, floor;
  for (auto _ : state) {
    state.PauseTiming();
    floor.push_back(std::min(roof(false), roof(true)));
    state.ResumeTiming();
    auto t0 = std::chrono::steady_clock::now();
    bool ok = ours();
    double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (!ok) return state.SkipWithError("our kernel failed or overflowed");
    mine.push_back(t);
  }
  state.counters["params_per_s"] = static_cast<double>(n) / Median(mine);
  state.counters["vs_roofline"] = Median(floor) / Median(mine);
  state.counters["isa"] = static_cast<double>(isa);
  state.counters["threads"] = arena.max_concurrency();
}

tbb::task_arena BenchArena() {
  return tbb::task_arena(Threads() > 0 ? Threads()
                                       : tbb::info::default_concurrency());
}

void BM_Step(benchmark::State& state, Variant v) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto opt =
      CpuOptimizer::Create({.threads = CpuOptimizerOptions::kCallerArena});
  if (!opt.ok()) return state.SkipWithError(opt.status().ToString().c_str());
  tbb::task_arena arena = BenchArena();
  Buffer p(n * 4), m(n * v.state_bytes()), vb(n * v.state_bytes()),
      g(n * FloatTypeSize(v.grad_type)), out(v.params_out ? n * 2 : 0);
  std::vector<float> ms(Q8Blocks(n)), vs(Q8Blocks(n));
  Step s{p.as<float>(),
         m.as<void>(),
         vb.as<void>(),
         g.as<void>(),
         v.params_out ? out.as<uint16_t>() : nullptr,
         n,
         ms.data(),
         vs.data()};
  Fill(arena, s, v);
  if (!arena.execute([&] { return MatchesScalar(**opt, s, v); })) {
    return state.SkipWithError("the dispatched path disagrees with scalar");
  }
  int64_t step = 1;
  Measure(
      state, n, arena, (*opt)->isa(),
      [&](bool prefetch) {
        return prefetch ? RooflineOnce<true>(arena, s, v)
                        : RooflineOnce<false>(arena, s, v);
      },
      [&] {
        Result<StepReport> r =
            arena.execute([&] { return OurStep(**opt, s, v, step++); });
        return r.ok() && !r->overflow();
      });
}

// The single-stream passes a pipeline step runs besides the optimizer
// step: the gradient norm, and the conversions of gradients and parameters.
enum class Pass { kSumSquaresBf16, kBf16ToF32, kF32ToBf16 };

// Their rooflines: plain widening and narrowing copies over the same bytes
// (the norm's is ReadStream).
template <bool kPrefetch, class From, class To, class Fn>
void MapStream(const From* __restrict src, To* __restrict dst, size_t begin,
               size_t end, Fn fn) {
  size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    if (kPrefetch) __builtin_prefetch(src + i + 2048 / sizeof(From));
    for (size_t k = 0; k < 16; ++k) dst[i + k] = fn(src[i + k]);
  }
  for (; i < end; ++i) dst[i] = fn(src[i]);
}

template <bool kPrefetch>
void PassStream(Pass pass, uint16_t* h, uint32_t* f, size_t b, size_t e,
                uint64_t* sink) {
  switch (pass) {
    case Pass::kSumSquaresBf16:
      *sink = ReadStream<kPrefetch>(reinterpret_cast<const uint64_t*>(h), b / 4,
                                    e / 4);
      return;
    case Pass::kBf16ToF32:
      return MapStream<kPrefetch>(h, f, b, e,
                                  [](uint16_t x) { return uint32_t{x} << 16; });
    case Pass::kF32ToBf16:
      return MapStream<kPrefetch>(f, h, b, e, [](uint32_t x) {
        return static_cast<uint16_t>(x >> 16);
      });
  }
}

void BM_Pass(benchmark::State& state, Pass pass) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto opt =
      CpuOptimizer::Create({.threads = CpuOptimizerOptions::kCallerArena});
  if (!opt.ok()) return state.SkipWithError(opt.status().ToString().c_str());
  tbb::task_arena arena = BenchArena();
  Buffer hb(n * 2), fb(n * 4);
  auto* h = hb.as<uint16_t>();
  auto* f = fb.as<uint32_t>();
  // bf16 and fp32 ones: every pass, ours or the roofline's, keeps them.
  Parallel(arena, n, [&](size_t b, size_t e) {
    std::fill(h + b, h + e, uint16_t{0x3F80});
    std::fill(f + b, f + e, 0x3F800000u);
  });
  std::vector<uint64_t> sinks(arena.max_concurrency());
  auto roof = [&](bool prefetch) {
    auto t0 = std::chrono::steady_clock::now();
    Parallel(arena, n, [&](size_t b, size_t e) {
      uint64_t* sink = &sinks[b * sinks.size() / n];
      prefetch ? PassStream<true>(pass, h, f, b, e, sink)
               : PassStream<false>(pass, h, f, b, e, sink);
    });
    benchmark::DoNotOptimize(sinks.data());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
        .count();
  };
  auto ours = [&] {
    return arena.execute([&] {
      CpuOptimizer& o = **opt;
      switch (pass) {
        case Pass::kSumSquaresBf16: {
          Result<SumSquaresResult> r = o.SumSquares(h, FloatType::kBF16, n);
          return r.ok() && r->sum == static_cast<double>(n);
        }
        case Pass::kBf16ToF32:
          return o.Convert(h, FloatType::kBF16, f, FloatType::kF32, n).ok() &&
                 f[n - 1] == 0x3F800000u;
        case Pass::kF32ToBf16:
          return o.Convert(f, FloatType::kF32, h, FloatType::kBF16, n).ok() &&
                 h[n - 1] == 0x3F80;
      }
      return false;
    });
  };
  Measure(state, n, arena, (*opt)->isa(), roof, ours);
}

template <class Arg>
void Register(const std::string& name, void (*bm)(benchmark::State&, Arg),
              Arg arg) {
  for (int64_t n : {int64_t{1} << 20, int64_t{1} << 24, int64_t{1} << 26,
                    int64_t{1} << 28, int64_t{1} << 29}) {
    benchmark::RegisterBenchmark(name.c_str(), bm, arg)
        ->Arg(n)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(std::clamp<int64_t>((int64_t{1} << 30) / n, 5, 1000));
  }
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  using strata::FloatType;
  using namespace strata::bench;
  auto step = [](const char* prefix, Variant v) {
    Register(std::string(prefix) + "/" + v.name, BM_Step, v);
  };
  step("AdamW", {"fp32", FloatType::kF32, false, Prepass::kNone});
  step("AdamW", {"bf16grad_bf16out", FloatType::kBF16, true, Prepass::kNone});
  step("AdamW", {"q8_fp32", FloatType::kF32, false, Prepass::kNone,
                 strata::StateFormat::kQ8});
  step("AdamW", {"q8_bf16grad_bf16out", FloatType::kBF16, true, Prepass::kNone,
                 strata::StateFormat::kQ8});
  step("AdamW", {"fp32_skipstep", FloatType::kF32, false, Prepass::kScan});
  step("AdamW",
       {"bf16grad_bf16out_skipstep", FloatType::kBF16, true, Prepass::kScan});
  step("ZeroStep",
       {"bf16grad_bf16out", FloatType::kBF16, true, Prepass::kNorm});
  const auto q8 = strata::StateFormat::kQ8;
  step("ZeroStep", {"fp32", FloatType::kF32, false, Prepass::kNorm});
  step("ZeroStep",
       {"fp32_norm_in_pass", FloatType::kF32, false, Prepass::kInPass});
  step("ZeroStep", {"q8_fp32", FloatType::kF32, false, Prepass::kNorm, q8});
  step("ZeroStep",
       {"q8_fp32_norm_in_pass", FloatType::kF32, false, Prepass::kInPass, q8});
  Register("SumSquares/bf16", BM_Pass, Pass::kSumSquaresBf16);
  Register("Convert/bf16_to_f32", BM_Pass, Pass::kBf16ToF32);
  Register("Convert/f32_to_bf16", BM_Pass, Pass::kF32ToBf16);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
