// Internal interface between the driver (optimizer.cc) and the per-ISA
// kernels (isa_*.cc). Each ISA translation unit fills one KernelTable; the
// driver validates, splits the work into partitions and calls the table.
#ifndef STRATA_CPU_ADAM_KERNELS_H_
#define STRATA_CPU_ADAM_KERNELS_H_

#include <cstddef>

#include "cpu_adam/qmap.h"
#include "strata/cpu_adam.h"

namespace strata::cpu_adam {

// fp32 scalars of one step, derived once per call in double (see
// MakeStepConsts in optimizer.cc). Unused fields are ignored by an algorithm.
struct StepConsts {
  float grad_mul;  // grad_scale * clip_coef
  float decay;     // AdamW, Lion: 1 - lr * wd
  float l2;        // Adam, Adagrad: wd
  bool has_l2;     // Adam, Adagrad: wd != 0
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float inv_bc2_sqrt;  // Adam/AdamW: 1 / sqrt(1 - beta2^t)
  float neg_lr;  // Adam/AdamW: -lr / (1 - beta1^t); Adagrad: -clr; Lion: -lr
  float eps;
  // kQ8 state: the code books of state1 (signed) and state2 (unsigned).
  const QMap* map1;
  const QMap* map2;
  // kBF16 state: the seed of this call's stochastic rounding, from the
  // step and OptimBuffers::seed.
  uint32_t noise_seed;
};

// Base pointers; element i of each buffer is at index i.
struct StepPtrs {
  float* params;
  const void* grads;
  void* state1;
  void* state2;
  void* out;
  float* scale1;  // kQ8 state: block b's scale at index b
  float* scale2;
  // Null, or where a call that steps all of [begin, end) stores the sum of
  // squares of those gradients, as stored (before grad_mul), bit for bit
  // SumSquaresFn's over the same range. A call that stops leaves it.
  double* sum;
};

inline constexpr int kNumAlgos = 4;
inline constexpr int kNumTypes = 3;   // FloatType: f32, bf16, f16
inline constexpr int kNumStates = 3;  // StateFormat: f32, bf16, q8
inline constexpr int kNumOuts = 4;    // none, bf16, f16, f32 (f32 grads)

// Updates elements [begin, end). Returns end, or the index of the first
// element of the vector (kQ8: of the block) whose scaled gradient holds
// inf/NaN; elements from that index on are untouched. kQ8: begin is a
// multiple of kQ8Block.
using StepFn = size_t (*)(const StepConsts& c, const StepPtrs& x, size_t begin,
                          size_t end);
// True when some grads[i] * grad_mul, i in [begin, end), is inf or NaN.
using NonFiniteFn = bool (*)(const void* grads, float grad_mul, size_t begin,
                             size_t end);
// Sum of squares of [begin, end) in the fixed order of SumSquaresResult: lane
// (i - begin) % 16 accumulates in double, then lanes 0..15 are added in order.
using SumSquaresFn = double (*)(const void* grads, size_t begin, size_t end);
using ToF32Fn = void (*)(const void* src, float* dst, size_t begin, size_t end);
using FromF32Fn = void (*)(const float* src, void* dst, size_t begin,
                           size_t end);

struct KernelTable {
  CpuIsa isa;
  // [algo][grad type][StateFormat][out: none, bf16, f16, f32]; null where
  // the algorithm has no such state (kQ8: Adam and AdamW only), and for an
  // fp32 copy-out of bf16 or f16 gradients (an fp32 model's gradients are
  // fp32: Step refuses the rest).
  StepFn step[kNumAlgos][kNumTypes][kNumStates][kNumOuts];
  NonFiniteFn non_finite[kNumTypes];
  SumSquaresFn sum_squares[kNumTypes];
  ToF32Fn to_f32[kNumTypes];
  FromF32Fn from_f32[kNumTypes];
};

const KernelTable& ScalarKernels();
const KernelTable& Avx2Kernels();
const KernelTable& Avx512Kernels();

}  // namespace strata::cpu_adam

#endif  // STRATA_CPU_ADAM_KERNELS_H_
