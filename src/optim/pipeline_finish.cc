// The end of an optimizer step (FinishStep): the hand-offs checked, the
// global norm reduced, speculation settled, deferred steps queued and
// waited for. The rest of the pipeline is in pipeline.cc and
// pipeline_worker.cc.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/interrupt.h"
#include "src/optim/pipeline.h"

namespace strata {

// Called with mu_ held: every trained group handed off once per
// micro-batch, unless an error already ends the step.
Status OffloadOptimizer::Impl::CheckHandOffs() const {
  for (size_t id = 0; id < groups_.size() && error_.ok(); ++id) {
    if (groups_[id].trainable &&
        this_step_[id].handoffs != options_.micro_batches) {
      return Status::FailedPrecondition(
          fmt::format("FinishStep: group '{}' was handed off {} of {} times "
                      "(micro_batches); hand off every trained group once "
                      "per micro-batch",
                      parts_.residency->layout(id).name,
                      this_step_[id].handoffs, options_.micro_batches));
    }
  }
  return Status();
}

// Called with mu_ held and the worker idle: the gradient norm over every
// group in group order (Note [Exact steps under overlap]).
StepChecks OffloadOptimizer::Impl::Checks(int* bad) const {
  StepChecks checks;
  *bad = -1;
  for (size_t id = 0; id < groups_.size(); ++id) {
    checks.sum_squares += this_step_[id].sum_squares;
    if (!this_step_[id].finite && *bad < 0) *bad = id;
  }
  checks.overflow = *bad >= 0;
  return checks;
}

// Called with mu_ held and the worker idle: the norm and whether the step
// is skipped, from `global` (every rank's checks) or else this process's;
// kDataLoss for non-finite gradients without skip_on_overflow.
Status OffloadOptimizer::Impl::ReduceNorms(const StepChecks* global,
                                           OptimStepReport* report) const {
  int bad = -1;
  const StepChecks local = Checks(&bad);
  const StepChecks& checks = global ? *global : local;
  report->grad_norm = std::sqrt(checks.sum_squares) / current_.hyper.loss_scale;
  report->overflow_group = bad;
  if (!checks.overflow && !local.overflow) return Status();
  if (options_.skip_on_overflow) {
    report->skipped = true;
    return Status();
  }
  const std::string where =
      bad >= 0
          ? fmt::format("in group '{}'", parts_.residency->layout(bad).name)
          : std::string("on another rank");
  return Status::DataLoss(fmt::format(
      "non-finite gradients {} at step {}; {}. Load "
      "the last checkpoint, and lower the learning rate or use "
      "a loss scale with skip_on_overflow",
      where, step_ + 1,
      Deferred() ? "no group was updated"
                 : "groups whose gradients came earlier were updated"));
}

// The first part of Settle, for ranks to combine before FinishStep.
Result<StepChecks> OffloadOptimizer::Impl::LocalChecks() {
  if (!in_step_) {
    return Status::FailedPrecondition("LocalChecks without BeginStep");
  }
  std::unique_lock<std::mutex> lk(mu_);
  STRATA_RETURN_IF_ERROR(CheckHandOffs());
  STRATA_RETURN_IF_ERROR(internal::WaitUntil(
      changed_, lk, [this] { return tasks_.empty() && running_ == 0; },
      "the CPU optimizer's steps"));
  int bad = -1;
  return Checks(&bad);
}

float OffloadOptimizer::Impl::ClipCoef(double grad_norm) const {
  if (options_.clip_norm <= 0) return 1.0f;
  return static_cast<float>(
      std::min(1.0, options_.clip_norm / (grad_norm + 1e-6)));
}

// Called with mu_ held.
void OffloadOptimizer::Impl::QueueDeferred(const StepParams& params,
                                           bool restore) {
  for (auto it = this_order_.rbegin(); it != this_order_.rend(); ++it) {
    const GroupStep& now = this_step_[*it];
    if (now.kept || (restore && !now.speculated)) continue;
    parts_.pending->Mark(*it);
    tasks_.push_back(
        {*it, -1, false, false, false, ParamsOf(*it, params), restore});
  }
  changed_.notify_all();
}

Status OffloadOptimizer::Impl::SettleSpeculation(
    std::unique_lock<std::mutex>& lk, bool keep, OptimStepReport* report) {
  std::vector<int> groups;
  for (size_t id = 0; id < groups_.size(); ++id) {
    if (this_step_[id].speculated) groups.push_back(id);
  }
  report->speculated = static_cast<int>(groups.size());
  report->undone = keep ? 0 : report->speculated;
  lk.unlock();
  Status status;
  for (int id : groups) {
    const Status ended = parts_.residency->EndSpeculation(
        id, keep ? store::Residency::Outcome::kKeep
                 : store::Residency::Outcome::kRestore);
    if (status.ok()) status = ended;
  }
  lk.lock();
  for (int id : groups) this_step_[id].kept = keep && status.ok();
  return status;
}

void OffloadOptimizer::Impl::EndGradients(std::unique_lock<std::mutex>& lk,
                                          bool stepping) {
  std::vector<int> ended;
  for (int id : this_order_) {
    if (!stepping || this_step_[id].kept) ended.push_back(id);
  }
  lk.unlock();
  // A discard refused costs only the write it would have saved.
  for (int id : ended) {
    static_cast<void>(parts_.residency->Discard(id, kGradBit));
  }
  lk.lock();
}

// Note [Exact steps under overlap]: speculative updates stand only when
// clipping did not fire and nothing overflowed. Two phases: Settle ends
// the step's work and queues what is deferred; Complete waits for it (in
// after_backward mode) and reports. An interrupt in either wait leaves
// the step open and FinishStep resumable (Note [Interruptible waits]).
Result<OptimStepReport> OffloadOptimizer::Impl::Finish(
    const StepChecks* global) {
  if (!in_step_) {
    return Status::FailedPrecondition("FinishStep without BeginStep");
  }
  std::unique_lock<std::mutex> lk(mu_);
  if (!settled_.has_value()) {
    // After an error the step ends with it, hand-offs missing or not;
    // missing hand-offs alone, or an interrupt, leave it open.
    STRATA_RETURN_IF_ERROR(CheckHandOffs());
    Result<Settled> settled = Settle(lk, global);
    if (!settled.ok()) {
      if (settled.status().code() != StatusCode::kCancelled) in_step_ = false;
      return settled.status();
    }
    settled_ = *settled;
  }
  if (Deferred() && !UnderNextForward()) {
    STRATA_RETURN_IF_ERROR(internal::WaitUntil(
        changed_, lk, [this] { return tasks_.empty() && running_ == 0; },
        "the CPU optimizer's steps"));
  }
  const Settled done = *std::exchange(settled_, std::nullopt);
  in_step_ = false;
  if (Deferred() && !UnderNextForward()) {
    STRATA_RETURN_IF_ERROR(std::exchange(error_, Status()));
  }
  OptimStepReport report = done.report;
  EndStepBookkeeping(&report, !report.skipped);
  report.finish_wait_seconds = Seconds(Clock::now() - done.start);
  return report;
}

void OffloadOptimizer::Impl::EndStepBookkeeping(OptimStepReport* report,
                                                bool taken) {
  if (taken) ++step_;
  order_ = this_order_;
  report->step = step_;
  report->step_seconds = std::exchange(step_seconds_, 0);
  report->hidden_seconds = std::exchange(hidden_seconds_, 0);
  report->acquire_wait_seconds = acquire_wait_;
  finishing_ = false;
}

Result<OptimAbortReport> OffloadOptimizer::Impl::Abort() {
  OptimAbortReport out;
  if (!in_step_) return out;
  std::unique_lock<std::mutex> lk(mu_);
  if (settled_.has_value()) {
    // Interrupted in Finish's second phase: the step stands, and its
    // updates land as if under the next forward (they are marked pending).
    out.step = std::exchange(settled_, std::nullopt)->report;
    EndStepBookkeeping(&out.step, !out.step.skipped);
    in_step_ = false;
    out.completed = true;
    return out;
  }
  DropHandOffs(lk);
  // An earlier step's update may run on (and wait for its own inputs):
  // only this step's hand-offs matter here.
  STRATA_RETURN_IF_ERROR(internal::WaitUntil(
      changed_, lk, [this] { return consuming_ == 0; },
      "the CPU optimizer's work on this step's gradients"));
  OptimStepReport undone;
  const Status settled = SettleSpeculation(lk, false, &undone);
  QueueDeferred(current_, true);  // undone groups get their compute back
  for (const GroupStep& g : this_step_) out.applied += g.applied;
  this_step_.assign(groups_.size(), GroupStep());
  this_order_.clear();
  error_ = Status();  // the caller met it, or abandons the step anyway
  finishing_ = false;
  in_step_ = false;
  STRATA_RETURN_IF_ERROR(settled);
  return out;
}

void OffloadOptimizer::Impl::DropHandOffs(std::unique_lock<std::mutex>& lk) {
  std::vector<int> dropped;
  for (auto it = tasks_.begin(); it != tasks_.end();) {
    if (it->slot < 0) {  // an earlier step's update: it stays
      ++it;
      continue;
    }
    dropped.push_back(it->slot);
    it = tasks_.erase(it);
  }
  lk.unlock();
  // The buffer may be reused once its copy to the host is done.
  for (int slot : dropped) static_cast<void>(slots_[slot].d2h.Wait());
  lk.lock();
  for (int slot : dropped) slots_[slot].pending = false;
  for (Slot& slot : slots_) slot.acquired = false;
  changed_.notify_all();
}

Result<OffloadOptimizer::Impl::Settled> OffloadOptimizer::Impl::Settle(
    std::unique_lock<std::mutex>& lk, const StepChecks* global) {
  Settled out;
  out.start = Clock::now();
  finishing_ = true;
  STRATA_RETURN_IF_ERROR(internal::WaitUntil(
      changed_, lk, [this] { return tasks_.empty() && running_ == 0; },
      "the CPU optimizer's steps"));
  OptimStepReport& report = out.report;
  const Status failed = std::exchange(error_, Status());
  const Status reduced = failed.ok() ? ReduceNorms(global, &report) : failed;
  StepParams params = current_;
  params.clip_coef = ClipCoef(report.grad_norm);
  const bool stands =
      reduced.ok() && !report.skipped && params.clip_coef == 1.0f;
  STRATA_RETURN_IF_ERROR(SettleSpeculation(lk, stands, &report));
  EndGradients(lk, reduced.ok() && Deferred() && !report.skipped);
  if (!reduced.ok()) {
    QueueDeferred(params, true);  // undone groups get their compute back
    return reduced;
  }
  if (Deferred()) {
    report.clip_coef = report.skipped ? 1.0 : params.clip_coef;
    QueueDeferred(params, report.skipped);
  }
  return out;
}

}  // namespace strata
