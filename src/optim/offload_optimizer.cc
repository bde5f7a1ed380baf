// OffloadOptimizer: the public face of the pipeline (pipeline.h).
#include "strata/offload_optimizer.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "src/ckpt/checkpoint.h"
#include "src/optim/pipeline.h"

namespace strata {
namespace {

// Note [Optimizer checkpoint state]
// OffloadOptimizer::Save wraps the caller's user_state in the manifest's:
// {"strata_optimizer": {"version": 1, "algo": "AdamW", "step": N},
//  "user_state": "<the caller's, verbatim>"}. The step count is what makes a
// resume exact (bias correction); the algorithm says what kState1/kState2
// hold. Mode, micro-batches, clipping and threads are the running
// configuration, not state: a run may resume with others.
constexpr char kStateKey[] = "strata_optimizer";
constexpr int kStateVersion = 1;

// The optimizer's state from a manifest's user_state, checked against
// `algo`: its step count and the caller's part.
Status ParseState(const std::string& text, OptimAlgo algo, int64_t* step,
                  std::string* user_state) {
  const nlohmann::json j =
      nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains(kStateKey)) {
    return Status::FailedPrecondition(
        "it holds no optimizer state (it was written by "
        "Engine::Save); load it with Engine::Load and set_step()");
  }
  const nlohmann::json& o = j[kStateKey];
  if (!o.is_object() || !o.value("version", nlohmann::json()).is_number() ||
      !o.value("algo", nlohmann::json()).is_string() ||
      !o.value("step", nlohmann::json()).is_number_unsigned() ||
      o["step"].get<uint64_t>() > uint64_t{INT64_MAX} ||
      !j.value("user_state", nlohmann::json()).is_string()) {
    return Status::DataLoss(std::string("its optimizer state (\"") + kStateKey +
                            "\" in the manifest's user_state) is malformed");
  }
  if (o["version"] != kStateVersion) {
    return Status::FailedPrecondition(
        "its optimizer state has version " + o["version"].dump() +
        "; this strata reads version " + std::to_string(kStateVersion));
  }
  const std::string saved = o["algo"];
  if (saved != OptimAlgoName(algo)) {
    return Status::FailedPrecondition(
        "it was saved by the " + saved + " optimizer, and this one is " +
        std::string(OptimAlgoName(algo)) +
        "; their state roles differ: create the optimizer "
        "with algo " +
        saved);
  }
  *step = o["step"].get<int64_t>();
  if (user_state != nullptr) *user_state = j["user_state"];
  return Status();
}

}  // namespace

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
  return Status::InvalidArgument("unknown optimizer mode '" +
                                 std::string(name) +
                                 "'; use overlap or after_backward");
}

Result<std::unique_ptr<OffloadOptimizer>> OffloadOptimizer::Create(
    Engine* engine, const OffloadOptimizerOptions& options) {
  auto impl = std::make_unique<Impl>();
  STRATA_RETURN_IF_ERROR(impl->Init(engine, options));
  return std::unique_ptr<OffloadOptimizer>(
      new OffloadOptimizer(std::move(impl)));
}

OffloadOptimizer::OffloadOptimizer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

OffloadOptimizer::~OffloadOptimizer() = default;

const OffloadOptimizerOptions& OffloadOptimizer::options() const {
  return impl_->options_;
}

Status OffloadOptimizer::BeginStep(const StepHyper& hyper,
                                   const std::vector<GroupHyper>& groups) {
  return impl_->BeginStep(hyper, groups);
}

Result<GradientBuffer> OffloadOptimizer::AcquireGradients(int group,
                                                          GradientFill fill) {
  return impl_->Acquire(group, fill);
}

Status OffloadOptimizer::HandOff(const GradientBuffer& buffer,
                                 const Fence& after) {
  return impl_->HandOff(buffer, after);
}

Result<OptimAbortReport> OffloadOptimizer::AbortStep() {
  return impl_->Abort();
}

Result<OptimStepReport> OffloadOptimizer::FinishStep() {
  return impl_->Finish(nullptr);
}

Result<StepChecks> OffloadOptimizer::LocalChecks() {
  return impl_->LocalChecks();
}

Result<OptimStepReport> OffloadOptimizer::FinishStep(const StepChecks& global) {
  return impl_->Finish(&global);
}

int64_t OffloadOptimizer::step() const { return impl_->step_; }

Status OffloadOptimizer::set_step(int64_t step) {
  if (impl_->in_step_) {
    return Status::FailedPrecondition(
        "set_step during a step; call it between steps");
  }
  if (step < 0) {
    return Status::InvalidArgument("the step count must be >= 0, not " +
                                   std::to_string(step));
  }
  impl_->step_ = step;
  return Status();
}

Status OffloadOptimizer::Save(const std::string& dir,
                              const std::string& user_state) {
  STRATA_RETURN_IF_ERROR(impl_->Quiesce());
  nlohmann::json state = {
      {kStateKey,
       {{"version", kStateVersion},
        {"algo", std::string(OptimAlgoName(impl_->options_.algo))},
        {"step", impl_->step_}}},
      {"user_state", user_state}};
  std::string text;
  try {
    text = state.dump();
  } catch (const nlohmann::json::exception&) {
    return Status::InvalidArgument(
        "the user state is not UTF-8 text; encode it (base64, "
        "hex) before saving");
  }
  return impl_->engine()->Save(dir, {text});
}

Status OffloadOptimizer::Load(const std::string& dir, std::string* user_state) {
  // A failed update or write-behind is what a Load repairs: its error,
  // reported or not, does not stop it.
  if (impl_->in_step_) return impl_->Quiesce();  // refused: inside a step
  if (Status s = impl_->Quiesce(); s.code() == StatusCode::kCancelled) {
    return s;  // interrupted: nothing loaded
  }
  int64_t step = 0;
  std::string caller;
  auto check = [&](const std::string& text) {
    return ParseState(text, impl_->options_.algo, &step, &caller);
  };
  if (Status s =
          ckpt::Load(*impl_->engine(), impl_->residency(), dir, nullptr, check);
      !s.ok()) {
    return s;
  }
  impl_->step_ = step;
  impl_->ClearFailedUpdates();
  if (user_state != nullptr) *user_state = std::move(caller);
  return Status();
}

}  // namespace strata
