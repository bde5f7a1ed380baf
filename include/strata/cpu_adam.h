// strata/cpu_adam.h: fused CPU optimizer kernels (Adam, AdamW, Adagrad,
// Lion) at the memory-bandwidth roofline. Pure compute: no I/O, no CUDA.
//
// Contract
// - One Step() call updates n fp32 master parameters in place, together with
//   their optimizer state, in a single pass over memory. The gradient unscale
//   and clip (one multiply), the inf/NaN check and the optional low-precision
//   copy of the new parameters are fused into that pass.
// - Semantics are those of torch.optim (Adam, AdamW, Adagrad) and of the Lion
//   paper's reference code, evaluated in fp32 in torch 1.13's operation order
//   (m = m * beta1 + (1 - beta1) * g; torch 2.x uses lerp, a few ulps away),
//   with one documented difference: the bias-corrected sqrt(v) is multiplied
//   by 1/sqrt(1 - beta2^t) instead of divided by sqrt(1 - beta2^t) (at most
//   one ulp in the denominator; DeepSpeed does the same). No FMA contraction is
//   used, so the scalar, AVX2 and AVX-512 paths give bit-identical results,
//   whatever the thread count.
// - The caller owns every buffer and the step counter (OptimHyper::step), so a
//   resumed run is exact. Hyperparameters may change on every call.
// - Any length and any alignment are accepted; n = 0 is a no-op whose buffer
//   pointers may be null. Null or overlapping buffers, an n whose bytes would
//   run past the end of the address space, unsupported type combinations
//   and hyperparameters that are (or whose fp32 step scalars are) out of
//   range are rejected with kInvalidArgument before anything is written.
// - Non-finite gradients are not an error: the step reports overflow (see
//   OverflowPolicy for what is written).
// - Threads: the work is split into one large, page-aligned partition per
//   thread, identical from call to call for the same buffers and n, and
//   replayed onto the same worker threads (tbb::affinity_partitioner), so the
//   same core touches the same memory every step. A CpuOptimizer is
//   thread-compatible: concurrent calls on one object must be serialized;
//   distinct objects may run concurrently.
#ifndef STRATA_CPU_ADAM_H_
#define STRATA_CPU_ADAM_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "strata/export.h"
#include "strata/state_format.h"
#include "strata/status.h"

namespace strata {

enum class OptimAlgo : uint8_t { kAdam, kAdamW, kAdagrad, kLion };

// Element types. bf16 and fp16 are IEEE-style 16-bit formats stored as
// uint16_t; conversions from fp32 round to nearest even and keep NaN a NaN.
enum class FloatType : uint8_t { kF32, kBF16, kF16 };

enum class CpuIsa : uint8_t { kAuto, kScalar, kAvx2, kAvx512 };

STRATA_EXPORT std::string_view OptimAlgoName(OptimAlgo algo);
STRATA_EXPORT std::string_view FloatTypeName(FloatType type);
STRATA_EXPORT std::string_view CpuIsaName(CpuIsa isa);
STRATA_EXPORT size_t FloatTypeSize(FloatType type);

// Per-call hyperparameters. Scalars derived from them (bias corrections,
// 1 - beta, 1 - lr * weight_decay) are computed in double and rounded to
// fp32 once, as torch does with Python floats.
struct OptimHyper {
  double lr = 1e-3;
  double beta1 = 0.9;    // Adam/AdamW: first moment; Lion: update interpolation
  double beta2 = 0.999;  // Adam/AdamW: second moment; Lion: momentum decay
  double eps = 1e-8;     // Adam/AdamW/Adagrad (torch's Adagrad default: 1e-10)
  // AdamW and Lion: decoupled (p *= 1 - lr * wd). Adam and Adagrad: L2
  // (g += wd * p), as in torch.
  double weight_decay = 0.0;
  double lr_decay = 0.0;  // Adagrad only: lr / (1 + (step - 1) * lr_decay)
  // The 1-based number of the step being taken (torch's state["step"] after
  // its increment). Drives Adam's bias correction and Adagrad's lr decay.
  int64_t step = 1;
};

// Gradient preprocessing fused into the pass: g = g_raw * (grad_scale *
// clip_coef), the two factors multiplied in fp32 first. grad_scale is
// 1 / loss_scale; clip_coef comes from global-norm clipping (see
// CpuOptimizer::SumSquares).
struct GradPrep {
  float grad_scale = 1.0f;
  float clip_coef = 1.0f;
};

// How the optimizer state is stored (OptimBuffers::state_format; the enum
// is in strata/state_format.h).
//   kF32   4 bytes an element.
//   kBF16  2 bytes, rounded stochastically after every step: up with the
//          probability of the fraction bf16 cannot hold, from a hash of the
//          element's index in the buffers (mod 2^32), the step and
//          OptimBuffers::seed, so the same on every ISA, at every thread
//          count and in a resumed run. Rounded to nearest, an update
//          smaller than half a bf16 ulp (2^-9 relative) would be lost, and
//          with beta2 >= 0.996 a bf16 exp_avg_sq would stop decaying
//          towards a smaller gradient; rounded stochastically it decays on
//          average, with 8 significant bits of noise per element.
//   kQ8    Adam/AdamW only: 1 byte an element plus 4 bytes a block of
//          kQ8Block elements (Note [8-bit state]).

// Note [8-bit state]
// kQ8 keeps m and v as bitsandbytes' and torchao's 8-bit Adam do: block-wise
// dynamic quantization (Dettmers et al., "8-bit Optimizers via Block-wise
// Quantization", 2021). Each block of kQ8Block = 256 elements (the block
// both use; 4 bytes of scale per 256 elements, 1.6% over 1 byte an element,
// and an outlier only coarsens its own block) has an fp32 scale, the
// block's largest |m| (or v) after the step, and each element one byte: the
// index of a value of a 256-entry code book, times the scale.
// The code books are the dynamic tree maps of that paper: per decade
// 10^-6..1, values spaced evenly within it, twice as many in each higher
// decade, plus 0 and 1; m's is signed (127 values of each sign), v's
// unsigned (254 positive), so both keep 7 decades of range and about 2
// significant digits at the top of a block. One pass per block, in
// registers and a 3 KiB scratch: dequantize, the fp32 update of the other
// formats, the new scales, and each value to the code of its bucket
// (cpu_adam/qmap.h: the map's nearest value, except at a decade's edge),
// in fp32 expressions that scalar, AVX2 and AVX-512 evaluate alike, bit
// for bit. A block whose new m or v would not be finite (a finite
// gradient whose square overflows) is not stored: the step stops there as
// at a non-finite gradient (kPartial). A block whose largest value is
// below FLT_MIN stores zeros. Element i belongs to block i / kQ8Block of
// the buffers given; partitions start on block boundaries. Tensors too
// small to gain (under a few blocks) are better kept in fp32 by the
// caller.
inline constexpr size_t kQ8Block = 256;
// The pieces a step shows its hooks (CpuOptimizer::Step): whole blocks.
inline constexpr size_t kStepPiece = size_t{1} << 16;
static_assert(kStepPiece % kQ8Block == 0);
inline constexpr size_t Q8Blocks(size_t n) {
  return (n + kQ8Block - 1) / kQ8Block;
}

// Buffers of one Step. All hold n elements.
//   params        fp32 master weights, updated in place.
//   grads         of grad_type (f32, bf16 or f16), read only.
//   state1        Adam/AdamW: exp_avg. Adagrad: state_sum (the caller sets
//                 its initial value). Lion: exp_avg.
//   state2        Adam/AdamW: exp_avg_sq. Must be null for Adagrad and Lion.
//   state_format  how state1 and state2 hold their elements (StateFormat);
//                 with kQ8, state1_scale and state2_scale hold one fp32
//                 scale per block (Q8Blocks(n) each; all zero with zero
//                 codes is a zero state). Null otherwise.
//   params_out    optional (may be null): the updated parameters, converted
//                 to out_type (bf16 or f16), for the device copy; or, with
//                 fp32 grads, an fp32 copy (a model whose compute copy is
//                 fp32 beside its master), written in the same pass.
struct OptimBuffers {
  float* params = nullptr;
  const void* grads = nullptr;
  FloatType grad_type = FloatType::kF32;
  void* state1 = nullptr;
  void* state2 = nullptr;
  StateFormat state_format = StateFormat::kF32;
  float* state1_scale = nullptr;
  float* state2_scale = nullptr;
  void* params_out = nullptr;
  FloatType out_type = FloatType::kBF16;
  size_t n = 0;
  // kBF16 state: the stream of its stochastic rounding (a distinct value
  // per buffer the caller steps, such as a group's id).
  uint32_t seed = 0;
};

enum class OverflowPolicy : uint8_t {
  // All or nothing: the scaled gradients are scanned first (one extra read of
  // the gradient bytes only). If any is inf or NaN, the step reports kSkipped
  // and no byte of params, state or params_out is written.
  kSkipStep,
  // One pass: each vector of gradients is checked before anything derived
  // from it is stored. On inf/NaN the pass stops (other threads at their next
  // block) and reports kPartial: a part of the elements holds this step's
  // update and the rest is unchanged, and no inf/NaN gradient ever reaches
  // params or state. (Finite gradients whose arithmetic overflows fp32, such
  // as g * g for |g| > 1.8e19, store inf as torch does, under either policy.)
  // Use it when the gradients are already known to be finite, for example
  // because SumSquares() returned a finite sum.
  kStopAtNonFinite,
};

enum class StepOutcome : uint8_t { kApplied, kSkipped, kPartial };

struct StepReport {
  StepOutcome outcome = StepOutcome::kApplied;
  bool overflow() const { return outcome != StepOutcome::kApplied; }
};

struct StepOptions {
  OptimAlgo algo = OptimAlgo::kAdamW;
  OptimHyper hyper;
  GradPrep prep;
  OverflowPolicy overflow = OverflowPolicy::kSkipStep;
};

// Sum of squares of a gradient buffer, for global-norm clipping. Squares are
// exact in double and summed in a fixed order (16 lanes per piece of
// kStepPiece elements, then the pieces in order: SumPieces), so the result
// is bit-identical on every ISA and thread count. finite is false when the
// buffer holds inf or NaN.
struct SumSquaresResult {
  double sum = 0.0;
  bool finite = true;
};

// The sum of squares of a buffer from its pieces' sums, in order.
STRATA_EXPORT SumSquaresResult SumPieces(const double* sums, size_t pieces);

struct CpuOptimizerOptions {
  // kAuto: the best path the CPU supports, unless STRATA_CPU_ISA=scalar|avx2|
  // avx512 names one. A named ISA the CPU lacks is an error.
  CpuIsa isa = CpuIsa::kAuto;
  // > 0: run in a private TBB arena of that many threads. 0: a private arena
  // of tbb::info::default_concurrency() threads. kCallerArena: run in the
  // arena of the calling thread (for callers that manage their own cores).
  int threads = 0;
  static constexpr int kCallerArena = -1;
};

class STRATA_EXPORT CpuOptimizer {
 public:
  static Result<std::unique_ptr<CpuOptimizer>> Create(
      const CpuOptimizerOptions& options = {});
  ~CpuOptimizer();
  CpuOptimizer(const CpuOptimizer&) = delete;
  CpuOptimizer& operator=(const CpuOptimizer&) = delete;

  Result<StepReport> Step(const StepOptions& options,
                          const OptimBuffers& buffers);
  // Step, showing the caller each piece of elements [begin, end) while
  // its bytes are in cache (the NVMe tier's checksums: the old bytes are
  // verified before the piece is stepped, the new ones hashed after). The
  // pieces are fixed by n alone: [k * kStepPiece, min(n, (k + 1) *
  // kStepPiece)) for every k, so a step sees the pieces the previous one
  // saw. Both hooks run on the stepping thread, on several threads at
  // once, none before the buffers and hyperparameters passed the checks.
  // - `check(begin, end)` before the piece is stepped; false stops the step
  //   (kPartial: that piece and the ones not yet begun are unchanged).
  // - `observer(begin, end)` after it was stepped. The pieces of a step
  //   that completes tile [0, n), each once; those of a kPartial or
  //   kSkipped one do not.
  // - `piece_sums`, when not null, has room for a double per piece: piece
  //   k's gradients' sum of squares (as stored, before GradPrep) goes to
  //   [k] once it is stepped, taken as the pass loads them, so a step that
  //   completes needs no SumSquares pass of its own:
  //   SumPieces(piece_sums, pieces) is SumSquares(grads, type, n), bit for
  //   bit. A piece not stepped keeps its value.
  // Any may be null.
  using PieceCheck = std::function<bool(size_t begin, size_t end)>;
  using StepObserver = std::function<void(size_t begin, size_t end)>;
  struct StepHooks {
    PieceCheck check;
    StepObserver observer;
    double* piece_sums = nullptr;
  };
  Result<StepReport> Step(const StepOptions& options,
                          const OptimBuffers& buffers, const StepHooks& hooks);

  Result<SumSquaresResult> SumSquares(const void* grads, FloatType type,
                                      size_t n);

  // Converts n elements between fp32 and bf16/f16 (one side must be f32),
  // rounding to nearest even. Buffers must not overlap.
  Status Convert(const void* src, FloatType src_type, void* dst,
                 FloatType dst_type, size_t n);

  CpuIsa isa() const;
  int threads() const;  // the partition count used for large buffers

 private:
  struct Impl;
  explicit CpuOptimizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata

#endif  // STRATA_CPU_ADAM_H_
