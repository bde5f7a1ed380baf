// Chooses the kernel table: CPUID picks the best path, STRATA_CPU_ISA or
// CpuOptimizerOptions::isa can force one.
#include "cpu_adam/dispatch.h"

#include <cpuid.h>

#include <cstdlib>

namespace strata {

std::string_view OptimAlgoName(OptimAlgo algo) {
  switch (algo) {
    case OptimAlgo::kAdam:
      return "Adam";
    case OptimAlgo::kAdamW:
      return "AdamW";
    case OptimAlgo::kAdagrad:
      return "Adagrad";
    case OptimAlgo::kLion:
      return "Lion";
  }
  return "?";
}

std::string_view FloatTypeName(FloatType type) {
  switch (type) {
    case FloatType::kF32:
      return "f32";
    case FloatType::kBF16:
      return "bf16";
    case FloatType::kF16:
      return "f16";
  }
  return "?";
}

std::string_view StateFormatName(StateFormat format) {
  switch (format) {
    case StateFormat::kF32:
      return "fp32";
    case StateFormat::kBF16:
      return "bf16";
    case StateFormat::kQ8:
      return "int8";
  }
  return "?";
}

Result<StateFormat> ParseStateFormat(std::string_view name) {
  for (StateFormat f :
       {StateFormat::kF32, StateFormat::kBF16, StateFormat::kQ8}) {
    if (name == StateFormatName(f)) return f;
  }
  return Status::InvalidArgument("state dtype '" + std::string(name) +
                                 "' is not one of fp32, bf16, int8");
}

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

size_t FloatTypeSize(FloatType type) { return type == FloatType::kF32 ? 4 : 2; }

namespace cpu_adam {

bool CpuSupports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2: {
      unsigned a, b, c, d;
      bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
      return f16c && __builtin_cpu_supports("avx2");
    }
    case CpuIsa::kAvx512:
      return CpuSupports(CpuIsa::kAvx2) && __builtin_cpu_supports("avx512f");
  }
  return false;
}

Result<const KernelTable*> SelectKernels(CpuIsa want) {
  STRATA_ASSIGN_OR_RETURN(
      CpuIsa isa, ChooseIsa(want, std::getenv("STRATA_CPU_ISA"), CpuSupports));
  switch (isa) {
    case CpuIsa::kAvx512:
      return &Avx512Kernels();
    case CpuIsa::kAvx2:
      return &Avx2Kernels();
    default:
      return &ScalarKernels();
  }
}

}  // namespace cpu_adam
}  // namespace strata
