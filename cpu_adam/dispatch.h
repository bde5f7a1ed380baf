// Run-time choice of the kernel table (CPUID, STRATA_CPU_ISA).
#ifndef STRATA_CPU_ADAM_DISPATCH_H_
#define STRATA_CPU_ADAM_DISPATCH_H_

#include <string>
#include <string_view>

#include "cpu_adam/kernels.h"
#include "strata/status.h"

namespace strata::cpu_adam {

// True when this CPU (and OS) can run the path.
bool CpuSupports(CpuIsa isa);

// The path for a request: kAuto takes `env` (the value of STRATA_CPU_ISA, or
// null) if set, else the best path `supports` allows. A named path that
// `supports` rejects, or a bad env value, is an error. Inline so that tests
// can act out CPUs this one is not, with a fake `supports`.
inline Result<CpuIsa> ChooseIsa(CpuIsa want, const char* env,
                                bool (*supports)(CpuIsa)) {
  if (want == CpuIsa::kAuto && env != nullptr && *env != '\0') {
    std::string_view name(env);
    for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
      if (name == CpuIsaName(isa)) want = isa;
    }
    if (want == CpuIsa::kAuto) {
      return Status::InvalidArgument(
          "STRATA_CPU_ISA='" + std::string(name) +
          "' is not a CPU path; use scalar, avx2 or avx512, or "
          "unset it to let CPUID choose");
    }
  }
  if (want == CpuIsa::kAuto) {
    return supports(CpuIsa::kAvx512) ? CpuIsa::kAvx512
           : supports(CpuIsa::kAvx2) ? CpuIsa::kAvx2
                                     : CpuIsa::kScalar;
  }
  if (!supports(want)) {
    return Status::Unavailable(
        "the " + std::string(CpuIsaName(want)) +
        " CPU path was requested but this CPU lacks it (avx2 "
        "needs AVX2+F16C, avx512 also AVX512F); request scalar "
        "or unset STRATA_CPU_ISA");
  }
  return want;
}

// The table of ChooseIsa(want, getenv("STRATA_CPU_ISA"), CpuSupports).
Result<const KernelTable*> SelectKernels(CpuIsa want);

}  // namespace strata::cpu_adam

#endif  // STRATA_CPU_ADAM_DISPATCH_H_
