// OffloadOptimizer: the public face of the pipeline (pipeline.h).
#include "strata/offload_optimizer.h"

#include <string>

#include "src/optim/pipeline.h"

namespace strata {

std::string_view OptimModeName(OptimMode mode) {
  switch (mode) {
    case OptimMode::kOverlap:
      return "overlap";
    case OptimMode::kAfterBackward:
      return "after_backward";
  }
  return "?";
}

Result<OptimMode> ParseOptimMode(std::string_view name) {
  for (OptimMode mode : {OptimMode::kOverlap, OptimMode::kAfterBackward}) {
    if (name == OptimModeName(mode)) return mode;
  }
  return Status(StatusCode::kInvalidArgument,
                "unknown optimizer mode '" + std::string(name) +
                    "'; use overlap or after_backward");
}

Result<std::unique_ptr<OffloadOptimizer>> OffloadOptimizer::Create(
    Engine* engine, const OffloadOptimizerOptions& options) {
  auto impl = std::make_unique<Impl>();
  if (Status s = impl->Init(engine, options); !s.ok()) return s;
  return std::unique_ptr<OffloadOptimizer>(
      new OffloadOptimizer(std::move(impl)));
}

OffloadOptimizer::OffloadOptimizer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

OffloadOptimizer::~OffloadOptimizer() = default;

const OffloadOptimizerOptions& OffloadOptimizer::options() const {
  return impl_->options_;
}

Status OffloadOptimizer::BeginStep(const StepHyper& hyper) {
  return impl_->BeginStep(hyper);
}

Result<GradientBuffer> OffloadOptimizer::AcquireGradients(int group) {
  return impl_->Acquire(group);
}

Status OffloadOptimizer::HandOff(const GradientBuffer& buffer) {
  return impl_->HandOff(buffer);
}

Result<OptimStepReport> OffloadOptimizer::FinishStep() {
  return impl_->Finish();
}

int64_t OffloadOptimizer::step() const { return impl_->step_; }

Status OffloadOptimizer::set_step(int64_t step) {
  if (impl_->in_step_) {
    return Status(StatusCode::kFailedPrecondition,
                  "set_step during a step; call it between steps");
  }
  if (step < 0) {
    return Status(StatusCode::kInvalidArgument,
                  "the step count must be >= 0, not " + std::to_string(step));
  }
  impl_->step_ = step;
  return Status();
}

}  // namespace strata
