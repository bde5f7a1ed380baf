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

// A step that stopped though its gradients are finite.
Status OverflowError(const store::GroupLayout& layout) {
  if (!layout.packed_state) {
    return Status::Internal(fmt::format(
        "group '{}': the step overflowed after its gradients checked finite",
        layout.name));
  }
  return Status::FailedPrecondition(fmt::format(
      "group '{}': a finite gradient made its int8 optimizer state overflow "
      "(from about |g| > 1e20, v exceeds the fp32 range); clip the gradients "
      "(clip_norm) or keep the state in bf16 or fp32 (state_dtype)",
      layout.name));
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
  STRATA_ASSIGN_OR_RETURN(StepHold hold,
                          HoldForStep(task.group, {.read = kGradBit}, false));
  const void* grads = hold.fetched.base[Role::kGrad];
  return StepGroup(task.group, hold, grads, FloatType::kF32, task.params);
}

// A skipped step's undone speculation: the compute copy is the master
// rounded again (Written says it was before the step).
Status OffloadOptimizer::Impl::RestoreCompute(int group) {
  const Group& g = groups_[group];
  STRATA_ASSIGN_OR_RETURN(
      store::Residency::Fetched f,
      FetchToHost(group, {.read = RoleBit(Role::kMaster),
                          .overwrite = RoleBit(Role::kCompute)}));
  Status status = CopyAs(*cpu_, f.base[Role::kMaster], FloatType::kF32,
                         f.base[Role::kCompute], g.compute, g.n);
  RecordWritten(group);
  Status released = f.pin.Release();
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
  Status status = task.direct ? Status() : s.d2h.Wait();
  auto free_slot = [&] {
    std::lock_guard<std::mutex> lk(mu_);
    s.pending = false;
    changed_.notify_all();
  };
  if (!status.ok()) {
    free_slot();
    return status;
  }
  if (task.first && task.final && !Deferred()) {
    // One micro-batch: the staged gradients feed the step directly.
    Result<SumSquaresResult> sum = SumSquares(task.group, s.host, g.compute);
    if (sum.ok()) RecordNorm(task.group, *sum);
    if (sum.ok() && sum->finite) {
      Result<StepHold> hold = HoldForStep(task.group, {}, false);
      status = hold.ok() ? StepGroup(task.group, *hold, s.host, g.compute,
                                     task.params)
                         : hold.status();
      if (status.ok()) MarkApplied(task.group);
    }
    free_slot();
    return sum.ok() ? status : sum.status();
  }
  // The gradients, and when this hand-off steps the group its state too,
  // in one fetch (Note [A step's working set]). The first micro-batch
  // overwrites the accumulator: nothing is read.
  const bool speculate = Deferred() && Speculates(task.group);
  const bool steps = task.final && (!Deferred() || speculate);
  store::Residency::Access grads;
  (task.first ? grads.overwrite : grads.update) = kGradBit;
  Result<StepHold> hold = steps ? HoldForStep(task.group, grads, speculate)
                                : StepHold::Of(FetchToHost(task.group, grads));
  if (!hold.ok()) {
    free_slot();
    return hold.status();
  }
  auto* acc = reinterpret_cast<float*>(hold->fetched.base[Role::kGrad]);
  status = Gather(task, acc);
  free_slot();
  if (status.ok() && task.final) {
    status = NormAndStep(task, *hold, acc, steps, speculate);
  }
  if (!hold->fetched.pin.held()) return status;  // StepGroup released it
  Status released = Release(*hold);
  return status.ok() ? released : status;
}

// The last micro-batch's: the group's norm, and its step where this hand-off
// steps it. A speculative step takes the norm in its pass (Note [The norm in
// the step's pass], pipeline_pass.cc).
Status OffloadOptimizer::Impl::NormAndStep(const Task& task, StepHold& hold,
                                           float* acc, bool steps,
                                           bool speculate) {
  if (speculate) {
    SumSquaresResult sum;
    Status status =
        StepGroup(task.group, hold, acc, FloatType::kF32, task.params, &sum);
    if (status.ok()) RecordNorm(task.group, sum);
    return status;
  }
  STRATA_ASSIGN_OR_RETURN(SumSquaresResult sum,
                          SumSquares(task.group, acc, FloatType::kF32));
  RecordNorm(task.group, sum);
  if (!sum.finite || !steps) return Status();
  Status status =
      StepGroup(task.group, hold, acc, FloatType::kF32, task.params);
  if (status.ok()) MarkApplied(task.group);
  return status;
}

void OffloadOptimizer::Impl::RecordNorm(int group, const SumSquaresResult& r) {
  std::lock_guard<std::mutex> lk(mu_);
  this_step_[group].sum_squares = r.sum;
  this_step_[group].finite = r.finite;
}

// Note [Gradients straight into the accumulator]
// A hand-off's gradients reach the group's fp32 accumulator (its kGrad
// chunk, held for the step) through the slot's host staging buffer: the
// device copies them there at HandOff, and the worker copies (or converts,
// or adds) them into the accumulator. When the first micro-batch of an fp32
// group overwrites the accumulator, that second copy is a plain memcpy of
// every gradient byte on the worker (0.43 GB a step for the 107M GPT of
// torch_offload_bench.py). Such a task is direct: HandOff records when the
// gradients are complete on the device and starts no copy, and the worker,
// once its hold has placed the accumulator, has the device copy them
// straight into it. The device copy starts later than at HandOff, but a
// DMA on a GPU runs at PCIe speed where the memcpy ran at one core's, and
// the slot goes back to the trainer when the copy ends, as before. When
// every hand-off is direct (fp32 groups, one micro-batch, steps that wait
// for the global checks: strata.torch's default), Create allocates no
// staging at all (StagingBytes).
bool OffloadOptimizer::Impl::Direct(int group, bool first, bool final) const {
  const bool accumulates = !final || Deferred();  // else: from the staging
  return first && accumulates && groups_[group].compute == FloatType::kF32;
}

// The task's gradients into the accumulator.
Status OffloadOptimizer::Impl::Gather(const Task& task, float* acc) {
  Slot& s = slots_[task.slot];
  const Group& g = groups_[task.group];
  if (task.direct) {
    STRATA_ASSIGN_OR_RETURN(
        s.d2h,
        parts_.mover->Start(Role::kGrad,
                            transport::Place::Memory(Tier::kDevice, s.device),
                            transport::Place::Memory(Tier::kHost, acc),
                            g.n * sizeof(float), s.written));
    return s.d2h.Wait();
  }
  if (task.first) {
    return CopyAs(*cpu_, s.host, g.compute, acc, FloatType::kF32, g.n);
  }
  optim::Accumulate(acc, s.host, g.compute, g.n);
  return Status();
}

void OffloadOptimizer::Impl::MarkApplied(int group) {
  std::lock_guard<std::mutex> lk(mu_);
  this_step_[group].applied = true;
}

// Note [A step's working set]
// A group's step needs its gradients and its state at the host at once.
// Fetched one after the other, the first could land in the middle of the
// room that Create() set aside for both and split it, and the second
// found no place though the bytes were there (issue #30: Create accepted
// host budgets that failed at step 1 or 2). So the pipeline holds all of
// a step's chunks as one fetch (Residency::Access: read, update or
// overwrite per role), which places them together and, if its own
// chunks split the room, places them all again (Note [Eviction order]).
// Its fetches go to the host, outside the trace (the pipeline reads ahead
// on its own); the chunks are reached through the fetch's addresses.
Result<store::Residency::Fetched> OffloadOptimizer::Impl::FetchToHost(
    int group, const store::Residency::Access& access, bool speculative) {
  return parts_.residency->FetchToHost(group, access, speculative);
}

// Note [The master a speculative step does not read]
// An fp32 group keeps a master beside its compute copy only so that a
// speculative step can be undone (Note [Exact steps under overlap]), and
// while it speculates the two are equal bit for bit: Speculates() holds
// only while both are as the pipeline last wrote them, and the pass
// writes the same fp32 values into both. So its speculative step reads
// the compute copy (homed on the host) as the params, steps it in place
// and writes the master as the pass's second output, fetched to be
// overwritten: the master's bytes on NVMe are not read, nor read ahead
// (0.43 GB a step of the 107M GPT: a third of what fp32 state reads, two
// thirds of int8's). Its old bytes stay on NVMe for an undo: a
// speculative fetch keeps the old extent of a chunk it overwrites as of
// one it updates (Note [Speculative writes]).

// The group's step roles, updated (speculatively: Note [Exact steps under
// overlap], the state's old bytes stay on NVMe), with `extra` in the same
// fetch.
Result<OffloadOptimizer::Impl::StepHold> OffloadOptimizer::Impl::HoldForStep(
    int group, store::Residency::Access extra, bool speculative) {
  {
    // Write-behind keeps one group in flight: the previous group's state
    // goes back to NVMe while this one is updated.
    std::unique_lock<std::mutex> lk(mu_);
    changed_.wait(lk,
                  [this] { return stop_ || writes_.size() + writing_ <= 1; });
  }
  const Group& g = groups_[group];
  StepHold hold;
  hold.start = Clock::now();
  hold.speculative = speculative;
  hold.roles = {g.params(), Role::kCompute};
  extra.update |= g.step_roles;
  extra.checked = g.checked;
  if (speculative && g.master_unread) {
    hold.roles = {Role::kCompute, Role::kMaster};
    extra.update &= ~RoleBit(Role::kMaster);
    extra.overwrite |= RoleBit(Role::kMaster);
    extra.checked &= ~RoleBit(Role::kMaster);
  }
  STRATA_ASSIGN_OR_RETURN(hold.fetched, FetchToHost(group, extra, speculative));
  hold.check = CheckOf(group, hold.fetched);
  held_for_step_->Add(group);
  RecordWritten(group);
  if (speculative) {
    std::lock_guard<std::mutex> lk(mu_);
    this_step_[group].speculated = true;  // FinishStep settles it
  }
  // Only now: the read-ahead's prefetches may evict any unpinned copy, and
  // this group's state, read ahead for this step, was one until the pin.
  ReadAhead(group);
  return hold;
}

StepOptions OffloadOptimizer::Impl::OptionsOf(const StepParams& params) const {
  StepOptions step;
  step.algo = options_.algo;
  const StepHyper& h = params.hyper;
  step.hyper = {h.lr,           h.beta1,    h.beta2,    h.eps,
                h.weight_decay, h.lr_decay, params.step};
  step.prep = {static_cast<float>(1.0 / h.loss_scale), params.clip_coef};
  step.overflow = OverflowPolicy::kStopAtNonFinite;
  return step;
}

// Steps the group over the chunks `hold` holds, then releases it.
Status OffloadOptimizer::Impl::StepGroup(int group, StepHold& hold,
                                         const void* grads, FloatType grad_type,
                                         const StepParams& params,
                                         SumSquaresResult* norm) {
  const Group& g = groups_[group];
  const store::Residency& residency = *parts_.residency;
  auto chunk = [&](Role role) -> void* { return hold.fetched.base[role]; };
  OptimBuffers b;
  b.params = static_cast<float*>(chunk(hold.roles.params));
  b.grads = grads;
  b.grad_type = grad_type;
  b.state1 = chunk(Role::kState1);
  b.state2 = UsesState2(options_.algo) ? chunk(Role::kState2) : nullptr;
  b.seed = static_cast<uint32_t>(group);  // bf16 rounding: per group
  // The compute copy, written in the same pass (an fp32 one too, beside
  // its master), or the master (Note [The master a speculative step does
  // not read]); none when the compute copy is the master, stepped in place.
  b.params_out = g.in_place ? nullptr : chunk(hold.roles.out);
  b.out_type = g.compute;  // fp32 where the out is the master
  b.n = g.n;
  optim::StepDigest digest(DigestedChunks(group, b, hold.roles));
  Result<StepReport> report = Step(group, OptionsOf(params), b, hold.roles,
                                   &digest, hold.check.get(), norm);
  if (report.ok() && !report->overflow()) {
    for (auto& [role, d] : digest.Finish()) {
      parts_.residency->AttachDigest(hold.fetched.hold, role, std::move(d));
    }
  }
  Status released = Release(hold);
  if (released.ok() && !hold.speculative &&
      hold.fetched.base[Role::kGrad] != nullptr) {
    // The step stands and read the gradients last: they are not written
    // down when the write-behind evicts the group (Note [Discarded bytes]
    // in src/store/residency_moves.cc). A discard refused costs only that
    // write.
    static_cast<void>(parts_.residency->Discard(group, kGradBit));
  }
  const Clock::time_point end = Clock::now();
  if (hold.check && hold.check->failed()) return released;  // bad reads
  if (!report.ok()) return report.status();
  if (report->overflow()) {
    if (norm != nullptr) {  // Note [The norm in the step's pass]
      STRATA_ASSIGN_OR_RETURN(*norm, SumSquares(group, grads, grad_type));
      if (!norm->finite) return released;
    }
    return OverflowError(residency.layout(group));
  }
  std::lock_guard<std::mutex> lk(mu_);
  step_seconds_ += Seconds(end - hold.start);
  if (!finishing_) hidden_seconds_ += Seconds(end - hold.start);
  if (g.write_behind) {
    writes_.push_back(group);
    changed_.notify_all();
  }
  return released;
}

void OffloadOptimizer::Impl::ReadAhead(int group) {
  std::vector<int> next;
  bool deferred = false;  // `next` are deferred steps, which never speculate
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const Task& t : tasks_) {
      if (t.slot < 0 && static_cast<int>(next.size()) < options_.read_ahead) {
        next.push_back(t.group);
      }
    }
    deferred = !next.empty();
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
    // Best effort: a prefetch that fails is retried by the demand fetch. One
    // that runs after the group's step fetched its state (the executor was
    // late) would only read it again once it is written back: it is
    // skipped.
    const uint64_t seen = held_for_step_->Count(n);
    // A step under backward of a group that speculates reads no master
    // (Note [The master a speculative step does not read]).
    const bool unread = groups_[n].master_unread && !deferred;
    const RoleMask roles = groups_[n].step_roles &
                           ~(unread ? RoleBit(Role::kMaster) : RoleMask{0});
    static_cast<void>(internal::EngineAccess::PrefetchWhile(
        *engine_, n, Tier::kHost, roles, [counts = held_for_step_, n, seen] {
          return counts->Count(n) == seen;
        }));
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
    // The gradients stay: a speculative step's are kept until FinishStep
    // settles it, and discarded then when the host still holds them (Note
    // [Discarded bytes]); under pressure they are written as any copy.
    Status status =
        parts_.residency->Evict(group, Tier::kHost, kAllRoles & ~kGradBit);
    // Fetched again meanwhile: it stays, and is written when evicted.
    if (status.code() == StatusCode::kFailedPrecondition) status = Status();
    lk.lock();
    --writing_;
    if (!status.ok() && error_.ok()) error_ = status;
    changed_.notify_all();
  }
}

}  // namespace strata
