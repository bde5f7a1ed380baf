// The optimizer pipeline's own threads: the worker, which consumes handed-off
// gradients and steps groups (Note [Exact steps under overlap]), and the
// writer, which sends updated state back to NVMe behind it. The training
// thread's side is in pipeline.cc.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "src/optim/accumulate.h"
#include "src/optim/pipeline.h"

namespace strata {
namespace {

// n elements from src_type to dst_type, one of them fp32 (the same type:
// a copy).
Status CopyAs(CpuOptimizer& cpu, const void* src, FloatType src_type, void* dst,
              FloatType dst_type, size_t n) {
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * FloatTypeSize(src_type));
    return Status();
  }
  return cpu.Convert(src, src_type, dst, dst_type, n);
}

}  // namespace

void OffloadOptimizer::Impl::WorkerLoop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    changed_.wait(lk, [this] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;
    const Task task = tasks_.front();
    tasks_.pop_front();
    ++running_;
    consuming_ += task.slot >= 0;
    lk.unlock();
    const Status status = RunTask(task);
    lk.lock();
    --running_;
    consuming_ -= task.slot >= 0;
    if (!status.ok() && error_.ok()) error_ = status;
    changed_.notify_all();
  }
}

Status OffloadOptimizer::Impl::RunTask(const Task& task) {
  if (task.slot >= 0) return ConsumeGradients(task);
  Status status =
      task.restore ? RestoreCompute(task.group) : StepDeferred(task);
  parts_.pending->Settle(
      task.group,
      status.ok()
          ? status
          : Status(status.code(),
                   fmt::format("the update of group '{}' at step {} "
                               "failed, so its bytes are not the "
                               "model's; load the last checkpoint: {}",
                               parts_.residency->layout(task.group).name,
                               task.params.step, status.message())));
  return status;
}

Status OffloadOptimizer::Impl::StepDeferred(const Task& task) {
  // Read only: written for the step's gradients, the chunk stays clean, and
  // nothing writes it back to NVMe.
  STRATA_ASSIGN_OR_RETURN(Pin grads,
                          FetchToHost(task.group, kGradBit, Access::kRead));
  const void* base =
      parts_.residency->Address(task.group, Role::kGrad, Tier::kHost, 0);
  Status status =
      StepGroup(task.group, base, FloatType::kF32, task.params, false);
  Status released = grads.Release();
  return status.ok() ? released : status;
}

// A skipped step's undone speculation: the compute copy is the master
// rounded again (Written says it was before the step).
Status OffloadOptimizer::Impl::RestoreCompute(int group) {
  const Group& g = groups_[group];
  STRATA_ASSIGN_OR_RETURN(
      Pin master, FetchToHost(group, RoleBit(Role::kMaster), Access::kRead));
  Result<Pin> compute =
      FetchToHost(group, RoleBit(Role::kCompute), Access::kOverwrite);
  if (!compute.ok()) return compute.status();
  const store::Residency& residency = *parts_.residency;
  const void* from = residency.Address(group, Role::kMaster, Tier::kHost, 0);
  void* to = residency.Address(group, Role::kCompute, Tier::kHost, 0);
  Status status = CopyAs(*cpu_, from, FloatType::kF32, to, g.compute, g.n);
  RecordWritten(group);
  Status released = compute->Release();
  if (status.ok()) status = released;
  released = master.Release();
  return status.ok() ? released : status;
}

bool OffloadOptimizer::Impl::Speculates(int group) const {
  if (!groups_[group].speculative) return false;
  const store::Residency& residency = *parts_.residency;
  const Written& w = written_[group];
  return residency.Version(group, Role::kMaster) == w.master &&
         residency.Version(group, Role::kCompute) == w.compute;
}

void OffloadOptimizer::Impl::RecordWritten(int group) {
  const store::Residency& residency = *parts_.residency;
  written_[group] = {residency.Version(group, Role::kMaster),
                     residency.Version(group, Role::kCompute)};
}

Status OffloadOptimizer::Impl::ConsumeGradients(const Task& task) {
  Slot& s = slots_[task.slot];
  const Group& g = groups_[task.group];
  Status status = s.d2h.Wait();
  auto free_slot = [&] {
    std::lock_guard<std::mutex> lk(mu_);
    s.pending = false;
    changed_.notify_all();
  };
  auto record = [&](const SumSquaresResult& r) {
    std::lock_guard<std::mutex> lk(mu_);
    this_step_[task.group].sum_squares = r.sum;
    this_step_[task.group].finite = r.finite;
  };
  if (!status.ok()) {
    free_slot();
    return status;
  }
  if (task.first && task.final && !Deferred()) {
    // One micro-batch: the staged gradients feed the step directly.
    Result<SumSquaresResult> sum = cpu_->SumSquares(s.host, g.compute, g.n);
    if (sum.ok()) record(*sum);
    if (sum.ok() && sum->finite) {
      status = StepGroup(task.group, s.host, g.compute, task.params, false);
      if (status.ok()) MarkApplied(task.group);
    }
    free_slot();
    return sum.ok() ? status : sum.status();
  }
  // The first micro-batch overwrites the accumulator: nothing is read.
  Result<Pin> grads = FetchToHost(
      task.group, kGradBit, task.first ? Access::kOverwrite : Access::kUpdate);
  if (!grads.ok()) {
    free_slot();
    return grads.status();
  }
  auto* acc = static_cast<float*>(
      parts_.residency->Address(task.group, Role::kGrad, Tier::kHost, 0));
  if (task.first) {
    status = CopyAs(*cpu_, s.host, g.compute, acc, FloatType::kF32, g.n);
  } else {
    optim::Accumulate(acc, s.host, g.compute, g.n);
  }
  free_slot();
  if (status.ok() && task.final) {
    Result<SumSquaresResult> sum = cpu_->SumSquares(acc, FloatType::kF32, g.n);
    if (sum.ok()) record(*sum);
    status = sum.status();
    const bool speculate = Deferred() && Speculates(task.group);
    if (status.ok() && sum->finite && (!Deferred() || speculate)) {
      status =
          StepGroup(task.group, acc, FloatType::kF32, task.params, speculate);
      if (status.ok() && !speculate) MarkApplied(task.group);
    }
  }
  Status released = grads->Release();
  return status.ok() ? released : status;
}

void OffloadOptimizer::Impl::MarkApplied(int group) {
  std::lock_guard<std::mutex> lk(mu_);
  this_step_[group].applied = true;
}

// The pipeline's fetches: to the host, outside the trace (the pipeline reads
// ahead on its own); chunks are then reached by Address().
Result<Pin> OffloadOptimizer::Impl::FetchToHost(int group, RoleMask roles,
                                                Access access) {
  STRATA_ASSIGN_OR_RETURN(
      store::Residency::Fetched fetched,
      parts_.residency->Fetch(group, Tier::kHost,
                              {.roles = roles,
                               .write = access != Access::kRead,
                               .discard = access == Access::kOverwrite,
                               .record = false}));
  return std::move(fetched.pin);
}

// Note [Exact steps under overlap]: the state's old bytes stay on NVMe.
Result<Pin> OffloadOptimizer::Impl::SpeculativeFetch(int group) {
  STRATA_ASSIGN_OR_RETURN(
      store::Residency::Fetched fetched,
      parts_.residency->FetchSpeculative(group, groups_[group].step_roles));
  return std::move(fetched.pin);
}

Status OffloadOptimizer::Impl::StepGroup(int group, const void* grads,
                                         FloatType grad_type,
                                         const StepParams& params,
                                         bool speculative) {
  const Group& g = groups_[group];
  {
    // Write-behind keeps one group in flight: the previous group's state
    // goes back to NVMe while this one is updated.
    std::unique_lock<std::mutex> lk(mu_);
    changed_.wait(lk,
                  [this] { return stop_ || writes_.size() + writing_ <= 1; });
  }
  const Clock::time_point start = Clock::now();
  STRATA_ASSIGN_OR_RETURN(
      Pin state, speculative
                     ? SpeculativeFetch(group)
                     : FetchToHost(group, g.step_roles, Access::kUpdate));
  RecordWritten(group);
  if (speculative) {
    std::lock_guard<std::mutex> lk(mu_);
    this_step_[group].speculated = true;  // FinishStep settles it
  }
  // Only now: the read-ahead's prefetches may evict any unpinned copy, and
  // this group's state, read ahead for this step, was one until the pin.
  ReadAhead(group);
  store::Residency& residency = *parts_.residency;
  auto chunk = [&](Role role) {
    return residency.Address(group, role, Tier::kHost, 0);
  };
  OptimBuffers b;
  b.params =
      static_cast<float*>(chunk(g.in_place ? Role::kCompute : Role::kMaster));
  b.grads = grads;
  b.grad_type = grad_type;
  b.state1 = chunk(Role::kState1);
  b.state2 = UsesState2(options_.algo) ? chunk(Role::kState2) : nullptr;
  b.state_type = FloatType::kF32;
  b.params_out = g.compute == FloatType::kF32 ? nullptr : chunk(Role::kCompute);
  b.out_type = g.compute == FloatType::kF32 ? FloatType::kBF16 : g.compute;
  b.n = g.n;
  StepOptions step;
  step.algo = options_.algo;
  const StepHyper& h = params.hyper;
  step.hyper = {h.lr,           h.beta1,    h.beta2,    h.eps,
                h.weight_decay, h.lr_decay, params.step};
  step.prep = {static_cast<float>(1.0 / h.loss_scale), params.clip_coef};
  step.overflow = OverflowPolicy::kStopAtNonFinite;
  Result<StepReport> report = cpu_->Step(step, b);
  if (report.ok() && g.compute == FloatType::kF32 && !g.in_place) {
    std::memcpy(chunk(Role::kCompute), b.params, g.n * sizeof(float));
  }
  Status released = state.Release();
  const Clock::time_point end = Clock::now();
  if (!report.ok()) return report.status();
  if (report->overflow()) {
    return Status::Internal(
        fmt::format("group '{}': the step overflowed after its "
                    "gradients checked finite",
                    residency.layout(group).name));
  }
  std::lock_guard<std::mutex> lk(mu_);
  step_seconds_ += Seconds(end - start);
  if (!finishing_) hidden_seconds_ += Seconds(end - start);
  if (g.write_behind) {
    writes_.push_back(group);
    changed_.notify_all();
  }
  return released;
}

void OffloadOptimizer::Impl::ReadAhead(int group) {
  std::vector<int> next;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const Task& t : tasks_) {
      if (t.slot < 0 && static_cast<int>(next.size()) < options_.read_ahead) {
        next.push_back(t.group);
      }
    }
    // Deferred steps run in another order than order_, and are all queued
    // before the first runs: none queued, none is due before a backward,
    // where groups step in order_ unless all of them are deferred.
    if (next.empty() && (!Deferred() || speculates_)) {
      auto it = order_.begin();
      if (group >= 0) {
        it = std::find(order_.begin(), order_.end(), group);
        if (it != order_.end()) ++it;
      }
      for (; it != order_.end() &&
             static_cast<int>(next.size()) < options_.read_ahead;
           ++it) {
        next.push_back(*it);
      }
    }
  }
  for (int n : next) {
    // Best effort: a prefetch that fails is retried by the demand fetch.
    static_cast<void>(engine_->Prefetch(n, Tier::kHost, groups_[n].step_roles));
  }
}

void OffloadOptimizer::Impl::WriterLoop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    changed_.wait(lk, [this] { return stop_ || !writes_.empty(); });
    if (writes_.empty()) return;
    const int group = writes_.front();
    writes_.pop_front();
    ++writing_;
    lk.unlock();
    Status status = engine_->Evict(group, Tier::kHost);
    // Fetched again meanwhile: it stays, and is written when evicted.
    if (status.code() == StatusCode::kFailedPrecondition) status = Status();
    lk.lock();
    --writing_;
    if (!status.ok() && error_.ok()) error_ = status;
    changed_.notify_all();
  }
}

}  // namespace strata
