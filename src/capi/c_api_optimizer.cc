// The C ABI of the offloaded optimizer (strata/strata_optimizer.h): a thin
// shim over strata::OffloadOptimizer, in the manner of c_api.cc.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/capi/convert.h"
#include "src/capi/guard.h"
#include "src/capi/handles.h"
#include "strata/dlpack.h"
#include "strata/offload_optimizer.h"
#include "strata/strata.h"

static_assert(STRATA_ALGO_ADAM == static_cast<int>(strata::OptimAlgo::kAdam) &&
              STRATA_ALGO_ADAMW ==
                  static_cast<int>(strata::OptimAlgo::kAdamW) &&
              STRATA_ALGO_ADAGRAD ==
                  static_cast<int>(strata::OptimAlgo::kAdagrad) &&
              STRATA_ALGO_LION == static_cast<int>(strata::OptimAlgo::kLion));
static_assert(STRATA_MODE_OVERLAP ==
                  static_cast<int>(strata::OptimMode::kOverlap) &&
              STRATA_MODE_AFTER_BACKWARD ==
                  static_cast<int>(strata::OptimMode::kAfterBackward));
static_assert(STRATA_GRADIENTS_ZEROED ==
                  static_cast<int>(strata::GradientFill::kZeros) &&
              STRATA_GRADIENTS_UNWRITTEN ==
                  static_cast<int>(strata::GradientFill::kUnwritten));

using strata::Status;
using strata::capi::CopyText;
using strata::capi::EngineTable;
using strata::capi::Gradients;
using strata::capi::GradientsTable;
using strata::capi::Guard;
using strata::capi::NonNull;
using strata::capi::OptimizerBox;
using strata::capi::OptimizerTable;

namespace {

// The whole buffer as one 1-D tensor of the group's compute dtype.
strata::TensorView WholeBuffer(const strata::GradientBuffer& buffer) {
  strata::TensorView whole;
  whole.name = "gradients of group " + std::to_string(buffer.group);
  whole.dtype = buffer.tensors.front().dtype;
  whole.shape = {
      static_cast<int64_t>(buffer.bytes / strata::DTypeSize(whole.dtype))};
  whole.data = buffer.data;
  whole.bytes = buffer.bytes;
  whole.tier = strata::Tier::kDevice;
  whole.on_cuda = buffer.on_cuda;
  return whole;
}

// A tensor of a gradient buffer, or the whole buffer, as an export.
template <typename Managed, typename Make>
strata_status ExportAs(const char* fn, const strata_gradients* gradients,
                       int32_t index, Managed** out, Make make) {
  return Guard(fn, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{gradients, "gradients"}, {out, "out"}}));
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Gradients> g,
                            GradientsTable::Get().Find(gradients));
    if (index != STRATA_WHOLE_BUFFER) {
      STRATA_RETURN_IF_ERROR(strata::capi::ValidTensorIndex(
          g->buffer.tensors.size(), index, "gradient buffer",
          "strata_gradients_get_info's num_tensors"));
    }
    const strata::TensorView tensor = index == STRATA_WHOLE_BUFFER
                                          ? WholeBuffer(g->buffer)
                                          : g->buffer.tensors[index];
    STRATA_ASSIGN_OR_RETURN(Managed * managed, make(*g, tensor));
    *out = managed;
    return Status::Ok();
  });
}

Status CheckChecks(const strata_step_checks& checks) {
  if (checks.struct_size >= sizeof(strata_step_checks)) return Status::Ok();
  return Status::InvalidArgument(
      "strata_step_checks.struct_size is " +
      std::to_string(checks.struct_size) +
      "; set it to sizeof(strata_step_checks) before the call");
}

// strata_optimizer_acquire_gradients{,_filled} inside their Guard.
Status Acquire(strata_optimizer* optimizer, int32_t group,
               strata::GradientFill fill, strata_gradients** gradients) {
  STRATA_RETURN_IF_ERROR(
      NonNull({{optimizer, "optimizer"}, {gradients, "gradients"}}));
  STRATA_ASSIGN_OR_RETURN(auto o, OptimizerTable::Get().Find(optimizer));
  STRATA_RETURN_IF_ERROR(strata::capi::ValidGroup(*o->engine->engine, group));
  // Allocated first: once the buffer is acquired nothing may fail before
  // the caller holds the handle that hands it off.
  auto acquired = std::make_shared<Gradients>();
  acquired->owner = optimizer;
  acquired->optimizer = o;
  STRATA_ASSIGN_OR_RETURN(acquired->buffer,
                          o->optimizer->AcquireGradients(group, fill));
  *gradients = GradientsTable::Get().Add(std::move(acquired));
  return Status::Ok();
}

}  // namespace

extern "C" {

strata_status strata_optimizer_options_init(strata_optimizer_options* options) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{options, "options"}}));
    *options = strata::capi::DefaultOptimizerOptions();
    return Status::Ok();
  });
}

strata_status strata_step_hyper_init(strata_step_hyper* hyper) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{hyper, "hyper"}}));
    *hyper = strata::capi::DefaultStepHyper();
    return Status::Ok();
  });
}

strata_status strata_optimizer_create(strata_engine* engine,
                                      const strata_optimizer_options* options,
                                      strata_optimizer** optimizer) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull(
        {{engine, "engine"}, {options, "options"}, {optimizer, "optimizer"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    STRATA_ASSIGN_OR_RETURN(auto cc,
                            strata::capi::ReadOptimizerOptions(*options));
    auto box = std::make_shared<OptimizerBox>();
    box->engine = e;
    STRATA_ASSIGN_OR_RETURN(
        box->optimizer, strata::OffloadOptimizer::Create(e->engine.get(), cc));
    ++e->optimizers;
    *optimizer = OptimizerTable::Get().Add(std::move(box));
    return Status::Ok();
  });
}

strata_status strata_optimizer_close(strata_optimizer* optimizer) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{optimizer, "optimizer"}}));
    STRATA_ASSIGN_OR_RETURN(auto o, OptimizerTable::Get().Find(optimizer));
    if (const int live = GradientsTable::Get().CountOf(optimizer); live > 0) {
      return Status::FailedPrecondition(
          std::to_string(live) +
          " gradient buffers are acquired and not handed off; hand each "
          "off with strata_optimizer_hand_off first");
    }
    if (const int exports = o->exports.load(); exports > 0) {
      return Status::FailedPrecondition(
          std::to_string(exports) +
          " DLPack exports of gradient buffers are alive and point into "
          "the optimizer's memory; call each export's deleter (drop the "
          "arrays) first");
    }
    STRATA_RETURN_IF_ERROR(OptimizerTable::Get().Take(optimizer).status());
    --o->engine->optimizers;
    return Status::Ok();
  });
}

strata_status strata_optimizer_begin_step(strata_optimizer* optimizer,
                                          const strata_step_hyper* hyper) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(
        NonNull({{optimizer, "optimizer"}, {hyper, "hyper"}}));
    STRATA_ASSIGN_OR_RETURN(auto o, OptimizerTable::Get().Find(optimizer));
    STRATA_ASSIGN_OR_RETURN(auto cc, strata::capi::ReadStepHyper(*hyper));
    return o->optimizer->BeginStep(cc);
  });
}

strata_status strata_optimizer_begin_step_groups(
    strata_optimizer* optimizer, const strata_step_hyper* hyper,
    const int32_t* groups, const strata_step_hyper* group_hypers,
    int32_t count) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(
        NonNull({{optimizer, "optimizer"}, {hyper, "hyper"}}));
    STRATA_ASSIGN_OR_RETURN(auto o, OptimizerTable::Get().Find(optimizer));
    if (count < 0 ||
        (count > 0 && (groups == nullptr || group_hypers == nullptr))) {
      return Status::InvalidArgument(
          "count must be >= 0, with groups and group_hypers of that many");
    }
    STRATA_ASSIGN_OR_RETURN(auto cc, strata::capi::ReadStepHyper(*hyper));
    std::vector<strata::GroupHyper> per_group;
    for (int32_t i = 0; i < count; ++i) {
      STRATA_ASSIGN_OR_RETURN(auto h,
                              strata::capi::ReadStepHyper(group_hypers[i]));
      per_group.push_back({groups[i], h});
    }
    return o->optimizer->BeginStep(cc, per_group);
  });
}

strata_status strata_optimizer_acquire_gradients(strata_optimizer* optimizer,
                                                 int32_t group,
                                                 strata_gradients** gradients) {
  return Guard(__func__, [&]() -> Status {
    return Acquire(optimizer, group, strata::GradientFill::kZeros, gradients);
  });
}

strata_status strata_optimizer_acquire_gradients_filled(
    strata_optimizer* optimizer, int32_t group, int32_t fill,
    strata_gradients** gradients) {
  return Guard(__func__, [&]() -> Status {
    if (fill != STRATA_GRADIENTS_ZEROED && fill != STRATA_GRADIENTS_UNWRITTEN) {
      return Status::InvalidArgument(
          "fill is " + std::to_string(fill) +
          "; use STRATA_GRADIENTS_ZEROED or STRATA_GRADIENTS_UNWRITTEN");
    }
    return Acquire(optimizer, group, static_cast<strata::GradientFill>(fill),
                   gradients);
  });
}

strata_status strata_optimizer_hand_off(strata_optimizer* optimizer,
                                        strata_gradients* gradients,
                                        void* stream, void* event) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(
        NonNull({{optimizer, "optimizer"}, {gradients, "gradients"}}));
    STRATA_ASSIGN_OR_RETURN(auto o, OptimizerTable::Get().Find(optimizer));
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Gradients> owned,
                            GradientsTable::Get().Take(gradients));
    if (owned->owner != optimizer) {
      GradientsTable::Get().Restore(gradients, std::move(owned));
      return Status::InvalidArgument(
          "the gradient buffer was acquired from another optimizer; hand it "
          "off to the one it came from");
    }
    return o->optimizer->HandOff(owned->buffer,
                                 {.stream = stream, .event = event});
  });
}

strata_status strata_optimizer_finish_step(strata_optimizer* optimizer,
                                           strata_step_report* report) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(
        NonNull({{optimizer, "optimizer"}, {report, "report"}}));
    STRATA_ASSIGN_OR_RETURN(auto o, OptimizerTable::Get().Find(optimizer));
    STRATA_RETURN_IF_ERROR(strata::capi::CheckStepReport(*report));
    STRATA_ASSIGN_OR_RETURN(auto done, o->optimizer->FinishStep());
    return strata::capi::WriteStepReport(done, report);
  });
}

strata_status strata_optimizer_local_checks(strata_optimizer* optimizer,
                                            strata_step_checks* checks) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(
        NonNull({{optimizer, "optimizer"}, {checks, "checks"}}));
    STRATA_RETURN_IF_ERROR(CheckChecks(*checks));
    STRATA_ASSIGN_OR_RETURN(auto o, OptimizerTable::Get().Find(optimizer));
    STRATA_ASSIGN_OR_RETURN(strata::StepChecks local,
                            o->optimizer->LocalChecks());
    checks->sum_squares = local.sum_squares;
    checks->overflow = local.overflow ? 1 : 0;
    return Status();
  });
}

strata_status strata_optimizer_finish_step_global(
    strata_optimizer* optimizer, const strata_step_checks* global,
    strata_step_report* report) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull(
        {{optimizer, "optimizer"}, {global, "global"}, {report, "report"}}));
    STRATA_RETURN_IF_ERROR(CheckChecks(*global));
    STRATA_ASSIGN_OR_RETURN(auto o, OptimizerTable::Get().Find(optimizer));
    STRATA_RETURN_IF_ERROR(strata::capi::CheckStepReport(*report));
    const strata::StepChecks checks{global->sum_squares, global->overflow != 0};
    STRATA_ASSIGN_OR_RETURN(auto done, o->optimizer->FinishStep(checks));
    return strata::capi::WriteStepReport(done, report);
  });
}

strata_status strata_optimizer_abort_step(strata_optimizer* optimizer,
                                          strata_abort_report* report) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(
        NonNull({{optimizer, "optimizer"}, {report, "report"}}));
    STRATA_ASSIGN_OR_RETURN(auto o, OptimizerTable::Get().Find(optimizer));
    STRATA_ASSIGN_OR_RETURN(auto done, o->optimizer->AbortStep());
    GradientsTable::Get().EndAllOf(optimizer);
    return strata::capi::WriteAbortReport(done, report);
  });
}

strata_status strata_optimizer_get_step(const strata_optimizer* optimizer,
                                        int64_t* step) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{optimizer, "optimizer"}, {step, "step"}}));
    STRATA_ASSIGN_OR_RETURN(auto o, OptimizerTable::Get().Find(optimizer));
    *step = o->optimizer->step();
    return Status::Ok();
  });
}

strata_status strata_optimizer_set_step(strata_optimizer* optimizer,
                                        int64_t step) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{optimizer, "optimizer"}}));
    STRATA_ASSIGN_OR_RETURN(auto o, OptimizerTable::Get().Find(optimizer));
    return o->optimizer->set_step(step);
  });
}

strata_status strata_optimizer_save(strata_optimizer* optimizer,
                                    const char* dir, const char* user_state) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull(
        {{optimizer, "optimizer"}, {dir, "dir"}, {user_state, "user_state"}}));
    STRATA_ASSIGN_OR_RETURN(auto o, OptimizerTable::Get().Find(optimizer));
    return o->optimizer->Save(dir, user_state);
  });
}

strata_status strata_optimizer_load(strata_optimizer* optimizer,
                                    const char* dir, char* user_state_buf,
                                    size_t capacity, size_t* needed) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(
        NonNull({{optimizer, "optimizer"}, {dir, "dir"}, {needed, "needed"}}));
    STRATA_ASSIGN_OR_RETURN(auto o, OptimizerTable::Get().Find(optimizer));
    STRATA_RETURN_IF_ERROR(
        strata::capi::CheckTextBuffer(user_state_buf, capacity));
    std::string user_state;
    STRATA_RETURN_IF_ERROR(o->optimizer->Load(dir, &user_state));
    *needed = CopyText(user_state, user_state_buf, capacity);
    return Status::Ok();
  });
}

strata_status strata_gradients_get_info(const strata_gradients* gradients,
                                        strata_gradients_info* info) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{gradients, "gradients"}, {info, "info"}}));
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Gradients> g,
                            GradientsTable::Get().Find(gradients));
    return strata::capi::WriteGradientsInfo(g->buffer, info);
  });
}

strata_status strata_gradients_get_tensor(const strata_gradients* gradients,
                                          int32_t index,
                                          strata_tensor_info* info) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{gradients, "gradients"}, {info, "info"}}));
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Gradients> g,
                            GradientsTable::Get().Find(gradients));
    STRATA_RETURN_IF_ERROR(strata::capi::ValidTensorIndex(
        g->buffer.tensors.size(), index, "gradient buffer",
        "strata_gradients_get_info's num_tensors"));
    return strata::capi::WriteTensorInfo(g->buffer.tensors[index], info);
  });
}

strata_status strata_gradients_export_dlpack(const strata_gradients* gradients,
                                             int32_t index,
                                             DLManagedTensor** out) {
  return ExportAs(__func__, gradients, index, out,
                  [](const Gradients& g, const strata::TensorView& t) {
                    return strata::ToDLPack(t, g.cuda_device(),
                                            g.HoldForExport());
                  });
}

strata_status strata_gradients_export_dlpack_versioned(
    const strata_gradients* gradients, int32_t index,
    strata_dlpack_versioned** out) {
  return ExportAs(__func__, gradients, index, out,
                  [](const Gradients& g, const strata::TensorView& t) {
                    return strata::ToDLPackVersioned(t, g.cuda_device(), false,
                                                     g.HoldForExport());
                  });
}

}  // extern "C"
