// Run-time choice of the kernel table (CPUID, STRATA_CPU_ISA).
#ifndef STRATA_CPU_ADAM_DISPATCH_H_
#define STRATA_CPU_ADAM_DISPATCH_H_

#include "cpu_adam/kernels.h"
#include "strata/status.h"

namespace strata::cpu_adam {

// True when this CPU (and OS) can run the path.
bool CpuSupports(CpuIsa isa);

// kAuto: STRATA_CPU_ISA if set, else the best supported path. A named path
// the CPU lacks, or a bad STRATA_CPU_ISA value, is an error.
Result<const KernelTable*> SelectKernels(CpuIsa want);

}  // namespace strata::cpu_adam

#endif  // STRATA_CPU_ADAM_DISPATCH_H_
