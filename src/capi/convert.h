// Conversions and checks between the C ABI's structs (strata/strata.h,
// strata/strata_optimizer.h) and the C++ API (strata/engine.h,
// strata/offload_optimizer.h), for c_api.cc and c_api_optimizer.cc. Every
// function checks what a C caller can get wrong and returns kInvalidArgument
// naming it; none throws except std::bad_alloc, which c_api.cc's Guard turns
// into a status.
#ifndef STRATA_SRC_CAPI_CONVERT_H_
#define STRATA_SRC_CAPI_CONVERT_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "strata/engine.h"
#include "strata/offload_optimizer.h"
#include "strata/status.h"
#include "strata/strata.h"

namespace strata::capi {

// A pointer argument and its name in the C signature.
struct Arg {
  const void* pointer;
  const char* name;
};
// kInvalidArgument naming the first NULL argument.
Status NonNull(std::initializer_list<Arg> args);

Status ValidTier(int32_t tier);
Status ValidRole(int32_t role);
Status ValidRoles(uint32_t roles);  // a non-empty subset of every role
Status ValidGroup(const Engine& engine, int32_t group);
// An index below `count` into the tensors of a `what` (a view, a gradient
// buffer), whose count `count_fn` returns.
Status ValidTensorIndex(size_t count, int32_t index, const char* what,
                        const char* count_fn);

strata_engine_options DefaultOptions();
Result<EngineOptions> ReadOptions(const strata_engine_options& options);

strata_group_spec DefaultGroupSpec();
Result<GroupSpec> ReadGroupSpec(const strata_group_spec& spec);

// Fill the caller's struct up to its struct_size; strings and arrays point
// into the C++ objects, so they live as long as those do.
Status WriteEngineInfo(const EngineInfo& info, int cuda_device,
                       strata_engine_info* out);
Status WriteStats(const EngineStats& stats, strata_engine_stats* out);
Status WriteTensorInfo(const TensorView& view, strata_tensor_info* out);

// The optimizer's structs (strata/strata_optimizer.h).
strata_optimizer_options DefaultOptimizerOptions();
Result<OffloadOptimizerOptions> ReadOptimizerOptions(
    const strata_optimizer_options& options);
strata_step_hyper DefaultStepHyper();
Result<StepHyper> ReadStepHyper(const strata_step_hyper& hyper);
// Before the step ends, so that a bad report fails before it is lost.
Status CheckStepReport(const strata_step_report& out);
Status WriteStepReport(const OptimStepReport& report, strata_step_report* out);
Status WriteAbortReport(const OptimAbortReport& report,
                        strata_abort_report* out);
Status WriteGradientsInfo(const GradientBuffer& buffer,
                          strata_gradients_info* out);

}  // namespace strata::capi

#endif  // STRATA_SRC_CAPI_CONVERT_H_
