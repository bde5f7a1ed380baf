// digest_bench: the NVMe tier's checksum (tier::Hash, XXH3-64) against
// libxxhash's own builds and against a plain read of the same bytes (the
// floor of any hash that streams from memory), in one process, on the
// same buffer.
//
// Run:
//   build/bin/digest_bench --benchmark_counters_tabular=true
//
// Benchmarks (bytes: 64 KiB, in cache as in the optimizer's pass; 256 MiB,
// streamed from memory as in the store's own hashing):
//   Hash/strata/bytes        tier::Hash (xxHash's AVX2 code where the CPU
//                            has AVX2)
//   Hash/libxxhash/bytes     XXH3_64bits of libxxhash (its SSE2 build)
//   Hash/dispatch/bytes      XXH3_64bits_dispatch of libxxhash (the widest
//                            vector code the CPU has)
//   Read/bytes               an OR of every 64-bit word: the floor
//   Step/<how>               one thread's fp32 AdamW step over 16M
//                            parameters streamed from memory, with the
//                            old master, m and v verified: `none` (not
//                            verified), `before` (hashed in a pass of
//                            their own first, as the store verifies a
//                            read), `in_pass` (each piece hashed just
//                            before it is stepped: Note [Unchecked host
//                            copies] in src/store/residency_checks.cc)
// Read the bytes_per_second column (Step: of the bytes verified).
#include <benchmark/benchmark.h>
#define XXH_DISPATCH_DISABLE_REPLACE  // XXH3_64bits stays the SSE2 build
#include <xxh_x86dispatch.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "src/tier/digest.h"
#include "strata/cpu_adam.h"

namespace {

std::vector<uint64_t>& Buffer(size_t bytes) {
  static std::vector<uint64_t> buffer;
  if (buffer.size() * 8 < bytes) {
    buffer.assign(bytes / 8, 0);
    for (size_t i = 0; i < buffer.size(); ++i)
      buffer[i] = i * 0x9E3779B97F4A7C15u;
  }
  return buffer;
}

template <uint64_t (*Fn)(const void*, size_t)>
void BM_Hash(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const std::vector<uint64_t>& b = Buffer(bytes);
  for (auto _ : state) benchmark::DoNotOptimize(Fn(b.data(), bytes));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

uint64_t Strata(const void* p, size_t n) { return strata::tier::Hash(p, n); }
uint64_t Library(const void* p, size_t n) { return XXH3_64bits(p, n); }
uint64_t Dispatch(const void* p, size_t n) {
  return XXH3_64bits_dispatch(p, n);
}

void BM_Read(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const std::vector<uint64_t>& b = Buffer(bytes);
  for (auto _ : state) {
    uint64_t acc = 0;
    for (size_t i = 0; i < bytes / 8; ++i) acc |= b[i];
    benchmark::DoNotOptimize(acc);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

// The old bytes of one Step's master, m and v, hashed around the step as
// `how` says (0 none, 1 before, 2 in the pass).
void BM_Step(benchmark::State& state) {
  constexpr size_t kN = size_t{16} << 20;
  static std::vector<float> p(kN, 0.5f), g(kN, 1e-3f), m(kN), v(kN);
  auto cpu = strata::CpuOptimizer::Create({strata::CpuIsa::kAuto, 1});
  if (!cpu.ok()) return state.SkipWithError("no CPU optimizer");
  strata::OptimBuffers b;
  b.params = p.data();
  b.grads = g.data();
  b.grad_type = strata::FloatType::kF32;
  b.state1 = m.data();
  b.state2 = v.data();
  b.n = kN;
  strata::StepOptions o;
  const int how = static_cast<int>(state.range(0));
  strata::CpuOptimizer::StepHooks hooks;
  uint64_t sink = 0;
  if (how == 2) {
    hooks.check = [&](size_t begin, size_t end) {
      for (const float* a : {p.data(), m.data(), v.data()}) {
        sink ^= strata::tier::Hash(a + begin, (end - begin) * 4);
      }
      return true;
    };
  }
  for (auto _ : state) {
    ++o.hyper.step;
    if (how == 1) {
      for (const float* a : {p.data(), m.data(), v.data()}) {
        sink ^= strata::tier::Hash(a, kN * 4);
      }
    }
    if (!(*cpu)->Step(o, b, hooks).ok()) state.SkipWithError("step failed");
  }
  benchmark::DoNotOptimize(sink);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kN * 12));
}

constexpr int64_t kCached = 64 << 10;
constexpr int64_t kStreamed = int64_t{256} << 20;

BENCHMARK(BM_Hash<Strata>)->Name("Hash/strata")->Arg(kCached)->Arg(kStreamed);
BENCHMARK(BM_Hash<Library>)
    ->Name("Hash/libxxhash")
    ->Arg(kCached)
    ->Arg(kStreamed);
BENCHMARK(BM_Hash<Dispatch>)
    ->Name("Hash/dispatch")
    ->Arg(kCached)
    ->Arg(kStreamed);
BENCHMARK(BM_Read)->Name("Read")->Arg(kCached)->Arg(kStreamed);
BENCHMARK(BM_Step)->Name("Step/none")->Arg(0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Step)->Name("Step/before")->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Step)->Name("Step/in_pass")->Arg(2)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
