// The CPUs the calling thread may run on: its affinity mask, as taskset,
// cgroup cpusets, SLURM and docker --cpuset-cpus set it, at least 1 (the
// machine's count where the mask cannot be read). Defaults that size thread
// pools from it do not oversubscribe a job confined to part of a machine,
// as std::thread::hardware_concurrency() (every CPU of the machine) would.
//
//   const int threads = std::max(1, UsableCores() - 1);
#ifndef STRATA_COMMON_CORES_H_
#define STRATA_COMMON_CORES_H_

namespace strata {

int UsableCores();

}  // namespace strata

#endif  // STRATA_COMMON_CORES_H_
