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
//   ZeroStep/bf16grad_bf16out/n  the CPU side of a ZeRO-Offload step:
//                             SumSquares over the bf16 grads (global norm),
//                             then the fused step above with the clip
//                             coefficient.
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

struct Variant {
  const char* name;
  FloatType grad_type;
  bool params_out;
  bool zero_step;  // SumSquares first, then the step with a clip coefficient
};

constexpr Variant kFp32{"fp32", FloatType::kF32, false, false};
constexpr Variant kBf16{"bf16grad_bf16out", FloatType::kBF16, true, false};

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
  float *p, *m, *v;
  void* g;
  uint16_t* out;
  size_t n;
};

// The streaming kernel: the same loads and stores as the step, with one
// multiply-add per stream instead of Adam's arithmetic. __restrict lets the
// compiler vectorize it; the prefetching variant issues its prefetches once
// per 16 elements, outside the vectorized inner loop.
template <bool kPrefetch, class G>
void Stream(const Step& s, size_t begin, size_t end) {
  float* __restrict pp = s.p;
  float* __restrict mp = s.m;
  float* __restrict vp = s.v;
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
    mp[i] = mp[i] * 0.5f + gi;
    vp[i] = vp[i] * 0.5f + gi;
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

// 16 independent accumulators, so the compiler vectorizes the loop and the
// sum is not latency-bound.
template <bool kPrefetch>
double SumSquaresStream(const uint16_t* g, size_t begin, size_t end) {
  float acc[16] = {};
  for (size_t i = begin; i + 16 <= end; i += 16) {
    if (kPrefetch) __builtin_prefetch(g + i + 1024);
    for (int l = 0; l < 16; ++l) {
      float x = std::bit_cast<float>(static_cast<uint32_t>(g[i + l]) << 16);
      acc[l] += x * x;
    }
  }
  double sum = 0;
  for (float a : acc) sum += a;
  return sum;
}

template <bool kPrefetch>
double RooflineOnce(tbb::task_arena& arena, const Step& s, const Variant& v) {
  auto t0 = std::chrono::steady_clock::now();
  if (v.zero_step) {
    std::vector<double> sums(arena.max_concurrency());
    Parallel(arena, s.n, [&](size_t b, size_t e) {
      sums[b * sums.size() / s.n] =
          SumSquaresStream<kPrefetch>(static_cast<uint16_t*>(s.g), b, e);
    });
    benchmark::DoNotOptimize(sums.data());
  }
  Parallel(arena, s.n, [&](size_t b, size_t e) {
    if (v.grad_type == FloatType::kF32) {
      Stream<kPrefetch, float>(s, b, e);
    } else {
      Stream<kPrefetch, uint16_t>(s, b, e);
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
  o.overflow = OverflowPolicy::kStopAtNonFinite;
  if (v.grad_type != FloatType::kF32) o.prep.grad_scale = 1.0f / kLossScale;
  if (v.zero_step) {
    Result<SumSquaresResult> ss = opt.SumSquares(s.g, v.grad_type, s.n);
    if (!ss.ok()) return ss.status();
    double norm = std::sqrt(ss->sum) / kLossScale;
    o.prep.clip_coef = static_cast<float>(std::min(1.0, 1.0 / (norm + 1e-6)));
  }
  OptimBuffers b;
  b.params = s.p;
  b.grads = s.g;
  b.grad_type = v.grad_type;
  b.state1 = s.m;
  b.state2 = s.v;
  b.params_out = v.params_out ? s.out : nullptr;
  b.n = s.n;
  return opt.Step(o, b);
}

// Correctness before timing: the chosen path and the scalar reference take
// the same step on a prefix of the data and must agree bit for bit.
bool MatchesScalar(CpuOptimizer& opt, const Step& s, const Variant& v) {
  size_t n = std::min<size_t>(s.n, 1 << 16);
  auto scalar = CpuOptimizer::Create({.isa = CpuIsa::kScalar, .threads = 1});
  if (!scalar.ok()) return false;
  std::vector<float> p[2], m[2], vv[2];
  std::vector<uint16_t> out[2];
  for (int k = 0; k < 2; ++k) {
    p[k].assign(s.p, s.p + n);
    m[k].assign(s.m, s.m + n);
    vv[k].assign(s.v, s.v + n);
    out[k].assign(n, 0);
    Step copy{p[k].data(), m[k].data(), vv[k].data(), s.g, out[k].data(), n};
    if (!OurStep(k == 0 ? opt : **scalar, copy, v, 1).ok()) return false;
  }
  return p[0] == p[1] && m[0] == m[1] && vv[0] == vv[1] && out[0] == out[1];
}

void Fill(tbb::task_arena& arena, const Step& s, FloatType grad_type) {
  Parallel(arena, s.n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      float g = static_cast<float>(static_cast<int>(i % 2001) - 1000) * 1e-3f;
      s.p[i] = 0.5f;
      s.m[i] = 0;
      s.v[i] = 0;
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

void BM_Step(benchmark::State& state, Variant v) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto opt =
      CpuOptimizer::Create({.threads = CpuOptimizerOptions::kCallerArena});
  if (!opt.ok()) return state.SkipWithError(opt.status().ToString().c_str());
  tbb::task_arena arena(Threads() > 0 ? Threads()
                                      : tbb::info::default_concurrency());
  Buffer p(n * 4), m(n * 4), vb(n * 4), g(n * FloatTypeSize(v.grad_type)),
      out(v.params_out ? n * 2 : 0);
  Step s{p.as<float>(),
         m.as<float>(),
         vb.as<float>(),
         g.as<void>(),
         v.params_out ? out.as<uint16_t>() : nullptr,
         n};
  Fill(arena, s, v.grad_type);
  if (!arena.execute([&] { return MatchesScalar(**opt, s, v); })) {
    return state.SkipWithError("the dispatched path disagrees with scalar");
  }
  std::vector<double> ours, roof;
  int64_t step = 1;
  for (auto _ : state) {
    state.PauseTiming();
    double r0 = RooflineOnce<false>(arena, s, v);
    double r1 = RooflineOnce<true>(arena, s, v);
    roof.push_back(std::min(r0, r1));
    state.ResumeTiming();
    auto t0 = std::chrono::steady_clock::now();
    Result<StepReport> r =
        arena.execute([&] { return OurStep(**opt, s, v, step); });
    ++step;
    double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (!r.ok() || r->overflow()) {
      return state.SkipWithError("the step failed or overflowed");
    }
    ours.push_back(t);
  }
  state.counters["params_per_s"] = static_cast<double>(n) / Median(ours);
  state.counters["vs_roofline"] = Median(roof) / Median(ours);
  state.counters["isa"] = static_cast<double>((*opt)->isa());
  state.counters["threads"] = arena.max_concurrency();
}

void Register(const char* prefix, Variant v) {
  for (int64_t n : {int64_t{1} << 20, int64_t{1} << 24, int64_t{1} << 26,
                    int64_t{1} << 28, int64_t{1} << 29}) {
    std::string name = std::string(prefix) + "/" + v.name;
    benchmark::RegisterBenchmark(name.c_str(), BM_Step, v)
        ->Arg(n)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(std::clamp<int64_t>((int64_t{1} << 30) / n, 5, 1000));
  }
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  using strata::bench::Register;
  Register("AdamW", strata::bench::kFp32);
  Register("AdamW", strata::bench::kBf16);
  Register("ZeroStep",
           {"bf16grad_bf16out", strata::FloatType::kBF16, true, true});
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
