// Gradient accumulation over micro-batches: acc[i] += float(src[i]), with
// src in fp32, bf16 or fp16. One fp32 add per element in index order, so
// the sum of micro-batches is the same on every path and run.
// Pure compute; thread-compatible.
#ifndef STRATA_SRC_OPTIM_ACCUMULATE_H_
#define STRATA_SRC_OPTIM_ACCUMULATE_H_

#include <cstddef>

#include "strata/cpu_adam.h"

namespace strata::optim {

void Accumulate(float* acc, const void* src, FloatType src_type, size_t n);

}  // namespace strata::optim

#endif  // STRATA_SRC_OPTIM_ACCUMULATE_H_
