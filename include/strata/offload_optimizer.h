// strata/offload_optimizer.h: the offloaded optimizer pipeline. Library
// `strata`.
//
// Example: one training step; tests/store/example_test.cc runs this code.
// ```c++ example
//  EngineOptions o;    // compute copies homed on the host, the rest on NVMe
//  o.device = "host";  // "cuda" on a GPU (the default "auto" picks it)
//  o.device_budget = 16 << 20;
//  o.host_budget = 64 << 20;
//  o.nvme_budget = 256 << 20;
//  o.swap_dir = swap_dir;
//  o.placement.home = {Tier::kHost, Tier::kNvme, Tier::kNvme, Tier::kNvme,
//                      Tier::kNvme};  // compute, master, m, v, grad
//  o.placement.device_roles = RoleBit(Role::kCompute);  // the GPU's
//  STRATA_ASSIGN_OR_RETURN(auto engine, Engine::Open(o));
//  for (int l = 0; l < layers; ++l) {  // one group per layer
//    GroupSpec layer;
//    layer.name = "layer." + std::to_string(l);
//    layer.tensors = {{"w", {1024, 1024}, DType::kBFloat16, kAllRoles}};
//    STRATA_RETURN_IF_ERROR(engine->RegisterGroup(layer).status());
//  }
//  STRATA_ASSIGN_OR_RETURN(
//      auto opt,
//      OffloadOptimizer::Create(engine.get(), {.algo = OptimAlgo::kAdamW}));
//
//  engine->BeginStep();
//  STRATA_RETURN_IF_ERROR(opt->BeginStep({.lr = 1e-4}));
//  const FetchOptions compute{.roles = RoleBit(Role::kCompute)};
//  for (int l = 0; l < layers; ++l) {
//    STRATA_ASSIGN_OR_RETURN(GroupView w,
//                            engine->Fetch(l, Tier::kDevice, compute));
//    Forward(l, w);  // your kernels read w.tensors[0].data
//    STRATA_RETURN_IF_ERROR(w.pin.Release());
//  }
//  for (int l = layers - 1; l >= 0; --l) {
//    STRATA_ASSIGN_OR_RETURN(GroupView w,
//                            engine->Fetch(l, Tier::kDevice, compute));
//    STRATA_ASSIGN_OR_RETURN(GradientBuffer g, opt->AcquireGradients(l));
//    Backward(l, w, g);  // your kernels write g.tensors[0].data
//    STRATA_RETURN_IF_ERROR(w.pin.Release());
//    STRATA_RETURN_IF_ERROR(opt->HandOff(g));  // the CPU steps layer l now
//  }
//  STRATA_ASSIGN_OR_RETURN(OptimStepReport report, opt->FinishStep());
//  STRATA_RETURN_IF_ERROR(engine->EndStep());
// ```
//
// What it does
// - Runs a CPU optimizer (cpu_adam: Adam, AdamW, Adagrad, Lion) over the
//   groups of an Engine, one group at a time, as soon as the group's
//   gradients are final, while backward goes on with earlier layers.
// - Gradients: the caller writes a group's gradients (in the group's
//   compute dtype, laid out like its compute chunk) into a device buffer
//   from AcquireGradients() and hands it off with HandOff(). The pipeline
//   copies it device->host; with one micro-batch the host copy feeds the
//   step directly, otherwise the micro-batches are summed in fp32 into the
//   group's Role::kGrad chunk, in hand-off order.
// - The step reads the group's kMaster, kState1 (and kState2 for Adam/
//   AdamW) and writes them back, and writes the new parameters, rounded to
//   the compute dtype, into the group's kCompute chunk, all in one fused
//   pass (an fp32 group without kMaster: its kCompute chunk is the
//   master, updated in place; an fp32 group's speculative step, below,
//   reads its kCompute chunk, then equal to the master, and leaves the
//   master's old bytes unread). Each role stays at its home tier: state
//   homed on NVMe is read ahead (the next groups' state is fetched to the
//   host while this one is updated) and written behind (the previous
//   group's state goes back to NVMe while the next is updated), inside the
//   engine's host budget.
//
// Exactness (Note [Exact steps under overlap] in src/optim/)
// - Every mode gives bit-identical results, equal to cpu_adam's Step over
//   the whole model in memory with the same hyperparameters.
// - Global-norm clipping and skip-on-overflow need every group's gradients
//   before any group may be updated. With either on, the gradients are
//   kept in kGrad until backward ends, and FinishStep decides the clip
//   coefficient and whether to skip. In kOverlap mode it then queues the
//   updates to run under the next forward and returns: the engine's
//   Fetch() of a group (and Save, Load) waits for that group's update, so
//   the next forward never reads old parameters and waits only where the
//   optimizer is behind. With `speculate` (the default), groups whose
//   state is homed on NVMe do not wait: each steps under backward as if
//   the clip coefficient were 1 and nothing overflowed, into a second set
//   of NVMe extents, and FinishStep keeps those updates when clipping did
//   not fire and no gradient overflowed; otherwise it restores the old
//   state (no I/O) and the group steps again under the next forward
//   (clipped), or its compute copy is restored from its master (skipped).
//   A group steps speculatively once the pipeline wrote its compute copy
//   and master last (not in the first step, nor the first after a Load,
//   nor after the caller wrote them). In kAfterBackward mode FinishStep
//   runs them. A
//   skipped step changes no byte of the model: no master weight, optimizer
//   state or compute copy (its gradients in the kGrad chunks end with the
//   step: they are discarded, not written to NVMe).
// - The step counter is the pipeline's: a step that is skipped does not
//   advance it. It is part of the state Save() writes.
//
// Ownership: the optimizer borrows the Engine, which must outlive it, and
// owns its device gradient buffers and host staging buffers, allocated from
// the engine's budgets at Create().
//
// Thread safety: one training thread calls BeginStep, AcquireGradients,
// HandOff and FinishStep in order; the steps run on the pipeline's own
// thread (CPU Adam in a TBB arena of `threads`), write-behind on another.
// The caller must not fetch a group for writing while its step may run
// (between its final HandOff and FinishStep; an update queued under the
// next forward is waited for by the fetch itself). The budgets Create()
// checks hold the caller's compute fetches beside the optimizer's work; a
// view of the stepped roles (master, state) at the host is beyond them
// while steps run: call Engine::Drain() before taking one.
//
// Failure: Create() fails when a trainable group lacks a role the
// algorithm needs, or when budgets cannot hold the buffers, naming the
// group, role or bytes. Non-finite gradients without skip_on_overflow fail
// FinishStep() naming the group; groups already updated in that step keep
// their update (load the last checkpoint). I/O and data-loss errors of the
// engine come back from the call that met them and from FinishStep(),
// which then ends the step even with hand-offs missing; one of work that
// ends after FinishStep() returned (a write-behind, an update under the
// next forward) comes back from the next BeginStep() (which then starts no
// step) or Save(), once. A group whose update failed also fails every
// Fetch() of it and every Save() until Load() restores a checkpoint.
#ifndef STRATA_OFFLOAD_OPTIMIZER_H_
#define STRATA_OFFLOAD_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "strata/cpu_adam.h"
#include "strata/engine.h"
#include "strata/export.h"
#include "strata/status.h"

namespace strata {

enum class OptimMode : int {
  kOverlap = 0,        // each group steps as soon as its gradients are final
  kAfterBackward = 1,  // every step waits for FinishStep (the baseline)
};
STRATA_EXPORT std::string_view OptimModeName(OptimMode mode);
STRATA_EXPORT Result<OptimMode> ParseOptimMode(std::string_view name);

struct OffloadOptimizerOptions {
  OptimAlgo algo = OptimAlgo::kAdamW;
  OptimMode mode = OptimMode::kOverlap;
  int micro_batches = 1;   // hand-offs per group per optimizer step
  double clip_norm = 0.0;  // global L2 norm clipping (torch's
                           // clip_grad_norm_); 0: off
  // Non-finite gradients: true skips the whole step (fp16 loss scaling);
  // false makes FinishStep() fail naming the group.
  bool skip_on_overflow = false;
  // CPU optimizer threads; 0: all cores this process may run on (its CPU
  // affinity) but one (the training thread's).
  int threads = 0;
  int grad_buffers = 2;  // device gradient buffers (and host staging)
  int read_ahead = 1;    // groups whose state is fetched ahead of the step
  // With clipping or skip_on_overflow in kOverlap mode: groups whose state
  // is homed on NVMe step speculatively under backward (see Exactness
  // above). Create() then takes a second NVMe extent for each of their
  // state chunks, and fails naming the bytes if the NVMe budget cannot
  // hold them. false: they step under the next forward, like the rest.
  bool speculate = true;
};

// Hyperparameters of one step (cpu_adam's OptimHyper without the step
// count, which the pipeline keeps) and the loss scale of its gradients.
struct StepHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double lr_decay = 0.0;
  double loss_scale = 1.0;  // gradients are multiplied by 1 / loss_scale
};

// One group's own hyperparameters for a step (BeginStep), as a torch
// optimizer's param_groups give them: weight decay off for biases and
// norms, per-layer learning rates. Its loss_scale must be the step's.
struct GroupHyper {
  int group = -1;
  StepHyper hyper;
};

// What AcquireGradients leaves in a buffer's tensors.
enum class GradientFill : int {
  kZeros = 0,  // zeroed: the caller's kernels may accumulate into them
  // Whatever the buffer's last user left there: the caller writes every
  // element of every tensor before HandOff, or the step reads another
  // group's gradients. The bytes between the tensors are still zeroed.
  // Saves a pass over the buffer where the first write is a copy.
  kUnwritten = 1,
};

// A device buffer for one group's gradients of one micro-batch (filled as
// AcquireGradients was asked), in the group's compute dtype, each tensor at
// its compute-chunk offset.
struct GradientBuffer {
  int group = -1;
  void* data = nullptr;  // CUDA memory when on_cuda
  uint64_t bytes = 0;
  bool on_cuda = false;
  std::vector<TensorView> tensors;  // role kCompute views into `data`
};

struct OptimStepReport {
  int64_t step = 0;        // steps applied so far (after this one)
  bool skipped = false;    // non-finite gradients, skip_on_overflow
  double grad_norm = 0.0;  // global L2 norm of the unscaled gradients
  double clip_coef = 1.0;  // applied to the unscaled gradients
  // CPU optimizer time since the last FinishStep() returned: this step's
  // updates, or with updates under the next forward, the last step's.
  double step_seconds = 0;
  // Of step_seconds, the part that ran while FinishStep() was not waiting
  // (hidden under the caller's compute).
  double hidden_seconds = 0;
  double finish_wait_seconds = 0;   // FinishStep() blocked
  double acquire_wait_seconds = 0;  // AcquireGradients() blocked on a buffer
  // Groups stepped speculatively under this step's backward, and how many
  // of those were undone (clipping fired or the step was skipped): they
  // step again, or get their compute copy back, under the next forward.
  int speculated = 0;
  int undone = 0;
  // The first group (in group order) whose gradients were not finite; -1
  // when all were. With skip_on_overflow, the group that made the step skip.
  int overflow_group = -1;
};

// The gradient checks of one step over this process's groups, the inputs
// of FinishStep's decisions (Note [Exact steps under overlap]). Ranks that
// each hold a partition of every group add their sum_squares and OR their
// overflow (one all-reduce, torch.distributed's in strata.torch) and give
// the result to FinishStep(global), so every rank clips and skips alike.
struct StepChecks {
  double sum_squares = 0;  // of the scaled gradients, in group order
  bool overflow = false;   // some gradient is not finite
};

// What AbortStep() left of the step it ended.
struct OptimAbortReport {
  // Groups whose update of the aborted step had been applied and cannot be
  // undone (kOverlap without clipping or skip_on_overflow steps each group
  // as soon as its gradients are final): the model now mixes two steps.
  // Always 0 when steps wait for the global norm.
  int applied = 0;
  // The step had settled (an interrupted FinishStep) and stands: it counts
  // as taken, and its last updates land in the background. `step` is then
  // what FinishStep would have reported (skipped, grad_norm, ...).
  bool completed = false;
  OptimStepReport step;
};

class STRATA_EXPORT OffloadOptimizer {
 public:
  // Every group whose tensors carry kState1 is trainable; its tensors must
  // all carry kCompute, the state roles of `algo` (and kGrad when
  // micro_batches > 1, the mode is kAfterBackward, or clipping or
  // skip_on_overflow is on) and kMaster, and share one compute dtype. An
  // fp32 group may leave out kMaster: its compute copy is its master, and
  // the step updates it in place (4 B/param less memory and, with the
  // state on NVMe, a third less I/O a step; but it never steps
  // speculatively). Groups without kState1 are frozen and never stepped
  // (a kMaster of theirs only keeps their exact fp32 values beside a
  // narrower compute copy).
  static Result<std::unique_ptr<OffloadOptimizer>> Create(
      Engine* engine, const OffloadOptimizerOptions& options);
  ~OffloadOptimizer();
  OffloadOptimizer(const OffloadOptimizer&) = delete;
  OffloadOptimizer& operator=(const OffloadOptimizer&) = delete;

  const OffloadOptimizerOptions& options() const;

  // Starts an optimizer step (micro_batches forward/backward passes) with
  // `hyper` for every trained group but those `groups` names (each at most
  // once, with the same loss_scale).
  Status BeginStep(const StepHyper& hyper,
                   const std::vector<GroupHyper>& groups = {});
  // A gradient buffer for `group`, its tensors filled as `fill` says;
  // blocks while every buffer is still being copied to the host. When
  // every buffer is acquired by this thread and not handed off, only this
  // thread could free one: that is kFailedPrecondition naming the groups
  // that hold them, not a wait.
  Result<GradientBuffer> AcquireGradients(
      int group, GradientFill fill = GradientFill::kZeros);
  // Hands the buffer back with this micro-batch's gradients in it. On the
  // group's micro_batches-th hand-off its gradients are final. Kernels that
  // still write them are named by `after` (strata/engine.h Fence): the copy
  // to the host is queued behind them on the device, so the call does not
  // block.
  Status HandOff(const GradientBuffer& buffer, const Fence& after = {});
  // After backward: waits for every group's step (and runs them first when
  // they had to wait for the global norm; with clipping or skipping in
  // kOverlap mode, queues them under the next forward instead). Every
  // trainable group must have been handed off micro_batches times.
  Result<OptimStepReport> FinishStep();
  // After every hand-off of the step: waits until the CPU optimizer has
  // consumed the gradients (and run the steps it may run before the global
  // checks) and returns this process's checks; the step stays open. An
  // error met meanwhile is not returned here but by FinishStep, so that
  // every rank reaches the all-reduce.
  Result<StepChecks> LocalChecks();
  // FinishStep deciding the norm, clip coefficient and skip from `global`,
  // every rank's LocalChecks() combined, instead of this process's alone.
  // The report's overflow_group is this process's (-1 when the overflow
  // came from another rank); without skip_on_overflow an overflow anywhere
  // fails the step.
  Result<OptimStepReport> FinishStep(const StepChecks& global);
  // Ends the open step without FinishStep, after an error or an interrupt
  // in the caller's forward or backward: hand-offs not yet consumed are
  // dropped, acquired buffers freed, speculative updates undone; updates
  // already applied stay (the report says how many). Between steps it does
  // nothing. Waits for the CPU optimizer's current task (kCancelled if
  // interrupted: call it again). The next BeginStep starts clean.
  Result<OptimAbortReport> AbortStep();

  int64_t step() const;  // steps applied so far
  // For a resume: the steps already applied. No step may be in progress.
  Status set_step(int64_t step);

  // Checkpoint (Engine::Save/Load, Note [Checkpoint format]): every tensor
  // of the engine, plus this optimizer's step count and algorithm, which go
  // into the manifest's user_state around the caller's `user_state`.
  // Between steps only; waits for the write-behind of the last step first.
  Status Save(const std::string& dir, const std::string& user_state = "");
  // Loads a checkpoint written by Save() into the engine (any placement or
  // budgets with the same groups and tensors) and restores the step count,
  // so the next step is the one the saved run would have taken.
  // `user_state` (may be null) receives the caller's part. A checkpoint
  // without optimizer state (written by Engine::Save) or of another
  // algorithm is refused before any data changes, as are damaged ones.
  Status Load(const std::string& dir, std::string* user_state = nullptr);

 private:
  class Impl;
  explicit OffloadOptimizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata

#endif  // STRATA_OFFLOAD_OPTIMIZER_H_
