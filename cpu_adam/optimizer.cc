// CpuOptimizer: validation, the fp32 step constants, and the split of each
// call into stable per-thread partitions. The arithmetic is in
// kernel_body.h.
#include <pthread.h>
#include <tbb/blocked_range.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cpu_adam/convert.h"
#include "cpu_adam/dispatch.h"
#include "strata/cpu_adam.h"

namespace strata {
namespace {

using cpu_adam::KernelTable;
using cpu_adam::StepConsts;

// Note [Partitions]
// Why: the optimizer streams gigabytes per step; the win is in keeping every
// core's memory traffic flowing, not in load balancing. How: a call is split
// into one contiguous partition per thread, and tbb::affinity_partitioner
// replays each partition onto the thread that ran it last time: the same
// core touches the same pages each step (first-touch friendly, no per-tile
// fork/join). Step's inner boundaries are multiples of kStepPiece
// elements, so its pieces depend on n alone: a thread walks its partition
// in those pieces to notice, between pieces, that another thread has
// stopped, and to show each piece to the caller's hooks while it is in
// cache; the next step's pieces are the same whatever the thread count or
// the buffers' addresses (the NVMe tier verifies the old bytes piece by
// piece against the digest the previous step made of the same pieces).
// Convert's boundaries are on 4 KiB pages of its source instead. Limits:
// below kMinParallel elements one thread does the whole call, where waking
// workers would cost more than it saves.
constexpr size_t kPageBytes = 4096;
constexpr size_t kMinParallel = size_t{1} << 16;
// SumSquares sums fixed blocks so its order does not depend on the split:
// a step's pieces, whose sums Step takes in its pass (StepHooks::piece_sums).
constexpr size_t kNormBlock = kStepPiece;
constexpr int kMaxThreads = 4096;

// Note [TSan and TBB]
// Debian's libtbb is not built with ThreadSanitizer, so TSan cannot see the
// synchronization that hands a task to a worker and joins it again, and
// would report every buffer access of a parallel region as a race (and
// spend minutes symbolizing them, even when suppressed). In TSan builds
// Run() therefore states that edge itself: a release before the region and
// an acquire at the start of each task, and the reverse at the end. What
// TSan still sees are TBB's own task objects, which tests/tsan.supp
// suppresses. Outside TSan builds these are no-ops.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
void SyncRelease(void* token) { __tsan_release(token); }
void SyncAcquire(void* token) { __tsan_acquire(token); }
#else
void SyncRelease(void*) {}
void SyncAcquire(void*) {}
#endif

struct Span {
  const char* name;
  uintptr_t begin;
  uintptr_t end;
  bool wraps;  // n elements would run past the end of the address space
};

// n elements of `size` bytes at p.
Span MakeSpan(const char* name, const void* p, size_t n, size_t size) {
  auto begin = reinterpret_cast<uintptr_t>(p);
  bool wraps = n > (UINTPTR_MAX - begin) / size;
  return {name, begin, wraps ? begin : begin + n * size, wraps};
}

// Every span must fit in the address space, and no two may overlap.
Status CheckSpans(const std::vector<Span>& spans) {
  for (const Span& s : spans) {
    if (s.wraps) {
      return Status::InvalidArgument(
          std::string(s.name) +
          " would run past the end of the address space: n is "
          "not the element count of the buffers");
    }
  }
  for (size_t a = 0; a < spans.size(); ++a) {
    for (size_t b = a + 1; b < spans.size(); ++b) {
      if (spans[a].begin < spans[b].end && spans[b].begin < spans[a].end) {
        return Status::InvalidArgument(
            std::string(spans[a].name) + " and " + spans[b].name +
            " overlap; every buffer of a step must be distinct");
      }
    }
  }
  return Status();
}

bool ValidType(FloatType t) {
  return t == FloatType::kF32 || t == FloatType::kBF16 || t == FloatType::kF16;
}

size_t StateSize(StateFormat format) {
  return format == StateFormat::kF32 ? 4 : format == StateFormat::kBF16 ? 2 : 1;
}

// kQ8 state is Adam's and AdamW's, with both scales; the others have none.
Status CheckStateFormat(OptimAlgo algo, const OptimBuffers& b) {
  const bool q8 = b.state_format == StateFormat::kQ8;
  if (b.state_format != StateFormat::kF32 &&
      b.state_format != StateFormat::kBF16 && !q8) {
    return Status::InvalidArgument("state_format is not a StateFormat");
  }
  if (q8 && algo != OptimAlgo::kAdam && algo != OptimAlgo::kAdamW) {
    return Status::InvalidArgument(
        "8-bit state (StateFormat::kQ8) is for Adam and AdamW; " +
        std::string(OptimAlgoName(algo)) + " needs f32 or bf16 state");
  }
  if (q8 && b.n > 0 &&
      (b.state1_scale == nullptr || b.state2_scale == nullptr)) {
    return Status::InvalidArgument(
        "8-bit state needs state1_scale and state2_scale: one float per "
        "kQ8Block elements each");
  }
  if (!q8 && (b.state1_scale != nullptr || b.state2_scale != nullptr)) {
    return Status::InvalidArgument(
        "state1_scale and state2_scale are for 8-bit state only; pass null");
  }
  return Status();
}

Status CheckBuffers(OptimAlgo algo, const OptimBuffers& b) {
  const bool two_states = algo == OptimAlgo::kAdam || algo == OptimAlgo::kAdamW;
  std::string name(OptimAlgoName(algo));
  if (b.n > 0 &&
      (b.params == nullptr || b.grads == nullptr || b.state1 == nullptr)) {
    return Status::InvalidArgument(
        name + " step: params, grads and state1 must not be null");
  }
  if (b.n > 0 && two_states && b.state2 == nullptr) {
    return Status::InvalidArgument(
        name + " step: state2 (exp_avg_sq) must not be null");
  }
  if (!two_states && b.state2 != nullptr) {
    return Status::InvalidArgument(
        name + " step keeps one state buffer; pass state2 = null");
  }
  if (!ValidType(b.grad_type)) {
    return Status::InvalidArgument("grad_type is not a FloatType");
  }
  if (b.params_out != nullptr && !ValidType(b.out_type)) {
    return Status::InvalidArgument("out_type is not a FloatType");
  }
  if (b.params_out != nullptr && b.out_type == FloatType::kF32 &&
      b.grad_type != FloatType::kF32) {
    return Status::InvalidArgument(
        "an fp32 params_out needs fp32 grads (the gradients of an fp32 "
        "copy); convert to bf16 or f16 for a copy of that width");
  }
  STRATA_RETURN_IF_ERROR(CheckStateFormat(algo, b));
  const size_t state_size = StateSize(b.state_format);
  std::vector<Span> spans = {
      MakeSpan("params", b.params, b.n, sizeof(float)),
      MakeSpan("grads", b.grads, b.n, FloatTypeSize(b.grad_type)),
      MakeSpan("state1", b.state1, b.n, state_size)};
  if (b.state2) {
    spans.push_back(MakeSpan("state2", b.state2, b.n, state_size));
  }
  if (b.state_format == StateFormat::kQ8) {
    const size_t blocks = Q8Blocks(b.n);
    spans.push_back(
        MakeSpan("state1_scale", b.state1_scale, blocks, sizeof(float)));
    spans.push_back(
        MakeSpan("state2_scale", b.state2_scale, blocks, sizeof(float)));
  }
  if (b.params_out) {
    spans.push_back(
        MakeSpan("params_out", b.params_out, b.n, FloatTypeSize(b.out_type)));
  }
  return CheckSpans(spans);
}

bool FiniteAtLeast(double x, double lo) { return std::isfinite(x) && x >= lo; }

Status CheckHyper(const StepOptions& o) {
  const OptimHyper& h = o.hyper;
  if (!FiniteAtLeast(h.lr, 0)) {
    return Status::InvalidArgument("lr must be finite and >= 0");
  }
  if (!FiniteAtLeast(h.weight_decay, 0) || !FiniteAtLeast(h.lr_decay, 0)) {
    return Status::InvalidArgument(
        "weight_decay and lr_decay must be finite and >= 0");
  }
  if (!(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1)) {
    return Status::InvalidArgument("beta1 and beta2 must be in [0, 1)");
  }
  if (o.algo != OptimAlgo::kLion && !(std::isfinite(h.eps) && h.eps > 0)) {
    return Status::InvalidArgument(
        "eps must be finite and > 0: it keeps the update finite where the "
        "second moment is 0");
  }
  if (h.step < 1) {
    return Status::InvalidArgument(
        "step must be >= 1 (the 1-based number of this step)");
  }
  if (!(std::isfinite(o.prep.grad_scale) && o.prep.grad_scale > 0 &&
        std::isfinite(o.prep.clip_coef) && o.prep.clip_coef > 0)) {
    return Status::InvalidArgument(
        "grad_scale and clip_coef must be finite and > 0");
  }
  return Status();
}

// The fp32 scalars of a step, from double, as torch computes them from
// Python floats (see the header for the one deliberate difference).
StepConsts MakeStepConsts(const StepOptions& o) {
  const OptimHyper& h = o.hyper;
  const double t = static_cast<double>(h.step);
  StepConsts c{};
  c.grad_mul = o.prep.grad_scale * o.prep.clip_coef;
  const bool decoupled =
      o.algo == OptimAlgo::kAdamW || o.algo == OptimAlgo::kLion;
  c.decay = decoupled ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
  c.has_l2 = !decoupled && h.weight_decay != 0;
  c.l2 = static_cast<float>(h.weight_decay);
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.eps = static_cast<float>(h.eps);
  c.map1 = &cpu_adam::SignedMap();
  c.map2 = &cpu_adam::UnsignedMap();
  switch (o.algo) {
    case OptimAlgo::kAdam:
    case OptimAlgo::kAdamW: {
      double bc1 = 1.0 - std::pow(h.beta1, t);
      double bc2 = 1.0 - std::pow(h.beta2, t);
      c.neg_lr = static_cast<float>(-(h.lr / bc1));
      c.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
      break;
    }
    case OptimAlgo::kAdagrad:
      c.neg_lr = static_cast<float>(-(h.lr / (1.0 + (t - 1.0) * h.lr_decay)));
      break;
    case OptimAlgo::kLion:
      c.neg_lr = static_cast<float>(-h.lr);
      break;
  }
  return c;
}

// The kernels see the fp32 roundings of the hyperparameters; a finite double
// can still round to inf (lr = 1e39) or to zero (eps = 1e-46).
Status CheckStepConsts(OptimAlgo algo, const StepConsts& c) {
  for (float x : {c.grad_mul, c.decay, c.l2, c.inv_bc2_sqrt, c.neg_lr, c.eps}) {
    if (!std::isfinite(x)) {
      return Status::InvalidArgument(
          "a step scalar (lr / bias correction, 1 - lr * weight_decay, "
          "weight_decay or grad_scale * clip_coef) overflows fp32; use "
          "hyperparameters within fp32 range");
    }
  }
  if (!(c.grad_mul > 0)) {
    return Status::InvalidArgument(
        "grad_scale * clip_coef underflows to 0 in fp32");
  }
  if (algo != OptimAlgo::kLion && !(c.eps > 0)) {
    return Status::InvalidArgument("eps rounds to 0 in fp32; use eps >= 1e-38");
  }
  return Status();
}

// Names a TBB worker "strata-adam" (for top and perf) the first time it
// runs a part of a step; never the thread that called into the arena.
void NameWorker(std::thread::id caller) {
  thread_local bool named = false;
  if (named || std::this_thread::get_id() == caller) return;
  named = true;
  static_cast<void>(pthread_setname_np(pthread_self(), "strata-adam"));
}

}  // namespace

struct CpuOptimizer::Impl {
  const KernelTable* kernels = nullptr;
  std::optional<tbb::task_arena> arena;  // absent: the caller's arena
  tbb::affinity_partitioner affinity;

  int Partitions() const {
    return arena ? arena->max_concurrency()
                 : tbb::this_task_arena::max_concurrency();
  }

  // Calls fn(part, begin, end) for each range of `bounds` (part p covers
  // [bounds[p], bounds[p + 1])), in parallel when there is more than one.
  template <class Fn>
  void Run(const std::vector<size_t>& bounds, Fn fn) {
    int parts = static_cast<int>(bounds.size()) - 1;
    if (parts == 1) return fn(0, bounds[0], bounds[1]);
    int token = 0;  // Note [TSan and TBB]
    SyncRelease(&token);
    const std::thread::id caller = std::this_thread::get_id();
    auto body = [&](const tbb::blocked_range<int>& r) {
      SyncAcquire(&token);
      NameWorker(caller);
      for (int p = r.begin(); p < r.end(); ++p) fn(p, bounds[p], bounds[p + 1]);
      SyncRelease(&token);
    };
    auto all = [&] {
      tbb::parallel_for(tbb::blocked_range<int>(0, parts, 1), body, affinity);
    };
    if (arena) {
      arena->execute(all);
    } else {
      all();
    }
    SyncAcquire(&token);
  }

  // Step's split of n elements: inner boundaries on multiples of
  // kStepPiece (see Note [Partitions]).
  std::vector<size_t> PieceSplit(size_t n) const {
    const size_t pieces = (n + kStepPiece - 1) / kStepPiece;
    int parts = n < kMinParallel ? 1 : Partitions();
    if (static_cast<size_t>(parts) > pieces) parts = static_cast<int>(pieces);
    std::vector<size_t> bounds(parts + 1, n);
    bounds[0] = 0;
    for (int p = 1; p < parts; ++p) bounds[p] = pieces * p / parts * kStepPiece;
    return bounds;
  }

  // Page-aligned split of n elements of `elem_bytes` starting at `base`
  // (see Note [Partitions]).
  std::vector<size_t> Split(size_t n, const void* base,
                            size_t elem_bytes) const {
    size_t page = kPageBytes / elem_bytes;
    int parts = n < kMinParallel ? 1 : Partitions();
    if (parts > 1 && static_cast<size_t>(parts) > n / page) {
      parts = static_cast<int>(n / page);  // at least a page per partition
    }
    std::vector<size_t> bounds(parts + 1, n);
    bounds[0] = 0;
    auto addr = reinterpret_cast<uintptr_t>(base);
    size_t head =
        addr % elem_bytes != 0
            ? 0
            : ((kPageBytes - addr % kPageBytes) % kPageBytes) / elem_bytes;
    if (head > n) head = n;
    for (int p = 1; p < parts; ++p) {
      size_t even = (n - head) / parts * p;
      bounds[p] = head + even / page * page;
    }
    return bounds;
  }
};

CpuOptimizer::CpuOptimizer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
CpuOptimizer::~CpuOptimizer() = default;

Result<std::unique_ptr<CpuOptimizer>> CpuOptimizer::Create(
    const CpuOptimizerOptions& options) {
  if (options.threads < CpuOptimizerOptions::kCallerArena ||
      options.threads > kMaxThreads) {
    return Status::InvalidArgument("threads must be 1.." +
                                   std::to_string(kMaxThreads) +
                                   ", 0 (all cores) or kCallerArena");
  }
  STRATA_ASSIGN_OR_RETURN(const KernelTable* kernels,
                          cpu_adam::SelectKernels(options.isa));
  auto impl = std::make_unique<Impl>();
  impl->kernels = kernels;
  if (options.threads != CpuOptimizerOptions::kCallerArena) {
    impl->arena.emplace(options.threads > 0 ? options.threads
                                            : tbb::info::default_concurrency());
  }
  return std::unique_ptr<CpuOptimizer>(new CpuOptimizer(std::move(impl)));
}

CpuIsa CpuOptimizer::isa() const { return impl_->kernels->isa; }
int CpuOptimizer::threads() const { return impl_->Partitions(); }

Result<StepReport> CpuOptimizer::Step(const StepOptions& options,
                                      const OptimBuffers& b) {
  return Step(options, b, StepHooks{});
}

Result<StepReport> CpuOptimizer::Step(const StepOptions& options,
                                      const OptimBuffers& b,
                                      const StepHooks& hooks) {
  if (static_cast<int>(options.algo) >= cpu_adam::kNumAlgos) {
    return Status::InvalidArgument("algo is not an OptimAlgo");
  }
  if (options.overflow != OverflowPolicy::kSkipStep &&
      options.overflow != OverflowPolicy::kStopAtNonFinite) {
    return Status::InvalidArgument("overflow is not an OverflowPolicy");
  }
  STRATA_RETURN_IF_ERROR(CheckHyper(options));
  STRATA_RETURN_IF_ERROR(CheckBuffers(options.algo, b));
  StepConsts c = MakeStepConsts(options);
  STRATA_RETURN_IF_ERROR(CheckStepConsts(options.algo, c));
  c.noise_seed = cpu_adam::MixBits(
      b.seed * 0x9E3779B9u ^
      cpu_adam::MixBits(static_cast<uint32_t>(options.hyper.step)));
  StepReport report;
  if (b.n == 0) return report;
  const KernelTable& k = *impl_->kernels;
  const int g = static_cast<int>(b.grad_type);
  // Whole pieces, so a block is one thread's (Note [8-bit state]).
  const std::vector<size_t> bounds = impl_->PieceSplit(b.n);

  if (options.overflow == OverflowPolicy::kSkipStep) {
    std::atomic<bool> bad{false};
    impl_->Run(bounds, [&](int, size_t begin, size_t end) {
      if (k.non_finite[g](b.grads, c.grad_mul, begin, end)) bad = true;
    });
    if (bad) {
      report.outcome = StepOutcome::kSkipped;
      return report;
    }
  }

  const int out = b.params_out == nullptr          ? 0
                  : b.out_type == FloatType::kBF16 ? 1
                  : b.out_type == FloatType::kF16  ? 2
                                                   : 3;
  cpu_adam::StepFn fn = k.step[static_cast<int>(options.algo)][g]
                              [static_cast<int>(b.state_format)][out];
  const cpu_adam::StepPtrs ptrs{b.params,       b.grads,      b.state1,
                                b.state2,       b.params_out, b.state1_scale,
                                b.state2_scale, nullptr};
  std::atomic<bool> stop{false};
  impl_->Run(bounds, [&](int, size_t begin, size_t end) {
    for (size_t i = begin; i < end; i += kStepPiece) {
      if (stop.load(std::memory_order_relaxed)) return;
      size_t j = end - i < kStepPiece ? end : i + kStepPiece;
      cpu_adam::StepPtrs x = ptrs;
      if (hooks.piece_sums != nullptr) {
        x.sum = hooks.piece_sums + i / kStepPiece;
      }
      if ((hooks.check && !hooks.check(i, j)) || fn(c, x, i, j) != j) {
        stop = true;
        return;
      }
      if (hooks.observer) hooks.observer(i, j);
    }
  });
  if (stop) report.outcome = StepOutcome::kPartial;
  return report;
}

Result<SumSquaresResult> CpuOptimizer::SumSquares(const void* grads,
                                                  FloatType type, size_t n) {
  if (!ValidType(type)) {
    return Status::InvalidArgument("SumSquares: type is not a FloatType");
  }
  SumSquaresResult result;
  if (n == 0) return result;
  if (grads == nullptr) {
    return Status::InvalidArgument("SumSquares: grads must not be null");
  }
  STRATA_RETURN_IF_ERROR(
      CheckSpans({MakeSpan("grads", grads, n, FloatTypeSize(type))}));
  size_t blocks = (n + kNormBlock - 1) / kNormBlock;
  std::vector<double> sums(blocks);
  int parts = n < kMinParallel ? 1 : impl_->Partitions();
  if (static_cast<size_t>(parts) > blocks) parts = static_cast<int>(blocks);
  std::vector<size_t> bounds(parts + 1);
  for (int p = 0; p <= parts; ++p) bounds[p] = blocks * p / parts;
  cpu_adam::SumSquaresFn fn =
      impl_->kernels->sum_squares[static_cast<int>(type)];
  impl_->Run(bounds, [&](int, size_t first, size_t last) {
    for (size_t blk = first; blk < last; ++blk) {
      size_t begin = blk * kNormBlock;
      size_t end = begin + kNormBlock < n ? begin + kNormBlock : n;
      sums[blk] = fn(grads, begin, end);
    }
  });
  return SumPieces(sums.data(), sums.size());
}

SumSquaresResult SumPieces(const double* sums, size_t pieces) {
  SumSquaresResult result;
  for (size_t k = 0; k < pieces; ++k) result.sum += sums[k];
  result.finite = std::isfinite(result.sum);
  return result;
}

Status CpuOptimizer::Convert(const void* src, FloatType src_type, void* dst,
                             FloatType dst_type, size_t n) {
  if (!ValidType(src_type) || !ValidType(dst_type)) {
    return Status::InvalidArgument("Convert: type is not a FloatType");
  }
  if ((src_type == FloatType::kF32) == (dst_type == FloatType::kF32)) {
    return Status::InvalidArgument(
        "Convert: exactly one side must be f32 (f32 <-> bf16 or f16)");
  }
  if (n == 0) return Status();
  if (src == nullptr || dst == nullptr) {
    return Status::InvalidArgument("Convert: src and dst must not be null");
  }
  STRATA_RETURN_IF_ERROR(
      CheckSpans({MakeSpan("src", src, n, FloatTypeSize(src_type)),
                  MakeSpan("dst", dst, n, FloatTypeSize(dst_type))}));
  std::vector<size_t> bounds = impl_->Split(n, src, FloatTypeSize(src_type));
  const KernelTable& k = *impl_->kernels;
  impl_->Run(bounds, [&](int, size_t begin, size_t end) {
    if (src_type == FloatType::kF32) {
      k.from_f32[static_cast<int>(dst_type)](static_cast<const float*>(src),
                                             dst, begin, end);
    } else {
      k.to_f32[static_cast<int>(src_type)](src, static_cast<float*>(dst), begin,
                                           end);
    }
  });
  return Status();
}

}  // namespace strata
