// The offloaded optimizer pipeline behind strata::OffloadOptimizer
// (include/strata/offload_optimizer.h states the contract).
//
// Note [Exact steps under overlap]
// Why: a step must equal AdamW over the whole model in memory, bit for bit.
// Clipping multiplies every gradient by clip_norm / (norm + 1e-6), where the
// norm covers every group's gradients; skip-on-overflow needs to know
// whether any gradient in the model is inf/NaN. Backward produces the last
// group's gradients last, so neither is known until backward ends.
// Options, and what each costs when clipping (or skipping) is on:
// 1. Defer: keep each group's gradients (fp32, in its kGrad chunk, where
//    the engine may spill them to NVMe), record its sum of squares, and
//    step every group once backward has ended. Adds no byte of traffic
//    beyond the 4 B/param of gradients kept. When they run:
//    a. in FinishStep: the whole optimizer time in the open;
//    b. under the next forward (Note [Steps under the next forward]).
// 2. Speculate: step each group under backward as if clip_coef were 1 and
//    nothing overflowed, and undo it when FinishStep learns otherwise.
//    Exact only if the old state survives the speculative step: 12 B/param
//    more host memory for state homed there, or a second set of NVMe
//    extents for state homed on NVMe (Note [Speculative writes] in
//    src/store/residency_speculation.cc: the new state goes to the other
//    extent, and the undo points the chunk back at the old one, with no I/O).
//    The undone groups then run 1b, so a step that clips costs what 1b costs.
// 3. Delay the update by a step (ZeRO-Offload's DPU): not exact.
// How: kAfterBackward runs 1a (the baseline). kOverlap with clipping or
// skip-on-overflow runs 2 for groups whose state (master, m, v) is all
// homed on NVMe, with `speculate` on (the default), and 1b for the rest,
// among them the fp32 groups without a master (their step updates the
// compute copy in place, and nothing could restore it).
// Each speculative step keeps the gradients in kGrad, as 1b does, for the
// redo. FinishStep keeps the speculation when the clip coefficient is
// exactly 1 and nothing overflowed: the step ran with the same inputs,
// hyperparameters and coefficient as 1b would, so the bytes are the same.
// Otherwise it restores the state, then queues under the next forward
// each undone group's step with the real coefficient (clipped), or the
// rounding of its restored master into its compute copy (skipped, or the
// step failed). That rounding is the compute copy's old bytes only if the
// pipeline wrote the compute copy and the master last (Written: their
// chunk versions after its last write), so a group speculates only then:
// not in the first step, not after a Load or a caller's write of them.
// Norms are summed per group in group order, so the global norm does not
// depend on arrival order, and a group's sum of squares is taken over the
// same bytes in every mode; each queued step carries the hyperparameters,
// clip coefficient and step number it was decided with (StepParams),
// since it may run after the next BeginStep.
// Limits (docs/PERF.md, strata-sim with clipping; 1G parameters, state on
// NVMe, compute 2.2x the I/O floor): 1b alone hides the optimizer under
// the forward, a third of the compute, where the unclipped overlap has the
// backward, two thirds: 0.80-0.83 of the resident step, whether or not
// clipping fires. 2 gives 0.98 when clipping fires on no step, and 0.93
// when it fires every third step: the clipped step costs nothing more, the
// step after it 22% more (the redo under its forward reads the state
// again). State on the host steps in far less than that (1b: overlap with
// clipping as fast as without). What 2 costs: the spare extents (12
// B/param of NVMe) and, with a host too small to keep them, 4 B/param of
// kept gradients written to NVMe a step. Early in training most steps
// clip, and then 2 costs the speculative step's I/O on top of 1b's;
// `speculate` = false turns it off.
//
// Note [Steps under the next forward]
// With clipping or skip-on-overflow in kOverlap mode, FinishStep waits for
// the gradients to be consumed (their norms), decides clip and skip, and
// queues one step per trained group whose speculative update it did not
// keep (an undone one of a skipped step: the rounding of its master into
// its compute copy) in the order the next forward will fetch them: the
// reverse of this step's hand-off order. It marks each
// group pending in the engine (store::PendingUpdates) before it returns,
// and the worker settles the group when its step is done. Engine::Fetch
// (and Save, Load) wait for a pending group, so the next forward's fetch
// of group i waits for group i's step only, and never reads old bytes
// even when it asks in another order. The optimizer's own fetches go to
// the residency manager and do not wait. Prefetches do not wait either: a
// copy of the old compute bytes they make is invalidated by the step's
// write fetch (versions, src/store/residency.h). The next step's hand-offs
// queue behind the steps (one FIFO, one worker), so a group's gradients
// of step k+1 overwrite its kGrad only after step k's update read it. A
// failed step leaves its group failed in PendingUpdates: fetches of it
// fail with the error, and Save refuses, until a checkpoint is loaded.
//
// Note [Threads and cores]
// Only two kinds of work need a core of their own: the training thread
// (which drives the GPU, or is the host-emulated device's compute) and the
// CPU optimizer. So CPU Adam runs in its own TBB arena of `threads` (all
// cores but one by default: the cores of the CPU affinity, common/cores.h,
// so that a job confined by taskset or a cgroup does not oversubscribe its
// share), entered by the pipeline's worker thread, and nothing else
// computes there. Everything else waits on hardware and
// needs no core: the aio ring threads sleep in io_uring_enter while the
// drive DMAs (strata-nvme-bench: under 2% of a core at 3 GB/s), CUDA copy
// engines are DMA engines, and the write-behind and prefetch threads block
// on those. They are not pinned: on the 2-core reference machine pinning
// would give each a core it leaves idle, and the scheduler runs a thread
// that wakes on a completion at once. The exception is the host-emulated
// device, whose copies are memcpy on its stream threads and take their
// time from the optimizer's core; strata-sim counts that as offload
// overhead (docs/PERF.md).
#ifndef STRATA_SRC_OPTIM_PIPELINE_H_
#define STRATA_SRC_OPTIM_PIPELINE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "src/optim/step_check.h"
#include "src/optim/step_digest.h"
#include "src/store/engine_internal.h"
#include "strata/offload_optimizer.h"

namespace strata {

// The roles of an optimizer pass's params (read and written) and of the
// copy it writes beside them (OptimBuffers::params_out).
struct PassRoles {
  Role params = Role::kMaster;
  Role out = Role::kCompute;
};

class OffloadOptimizer::Impl {
 public:
  using Clock = std::chrono::steady_clock;

  Status Init(Engine* engine, const OffloadOptimizerOptions& options);
  ~Impl();

  Status BeginStep(const StepHyper& hyper,
                   const std::vector<GroupHyper>& groups);
  Result<GradientBuffer> Acquire(int group, GradientFill fill);
  Status HandOff(const GradientBuffer& buffer, const Fence& after);
  // `global`: every rank's checks (FinishStep(global)); null: this one's.
  Result<OptimStepReport> Finish(const StepChecks* global);
  Result<StepChecks> LocalChecks();
  Result<OptimAbortReport> Abort();
  // Between steps: waits for the write-behind; its error, if any.
  Status Quiesce();
  // After a Load: fetches of groups whose update failed may go on.
  void ClearFailedUpdates() { parts_.pending->ClearFailed(); }
  Engine* engine() const { return engine_; }
  const store::Residency& residency() const { return *parts_.residency; }

  // Fixed after Init.
  OffloadOptimizerOptions options_;

  // Owned by the training thread (OffloadOptimizer's caller); the worker
  // never reads them (each task carries its step number).
  int64_t step_ = 0;
  bool in_step_ = false;

 private:
  // What Init learns about a group.
  struct Group {
    bool trainable = false;
    uint64_t n = 0;  // elements of every role's chunk the step covers
    FloatType compute = FloatType::kBF16;
    uint64_t compute_bytes = 0;
    RoleMask step_roles = 0;
    // The roles its pass verifies as it reads them from NVMe (Note
    // [Unchecked host copies] in src/store/residency_checks.cc).
    RoleMask checked = 0;
    bool in_place = false;      // fp32, no master: steps its compute copy
    bool write_behind = false;  // has roles homed on NVMe
    bool speculative = false;   // ... state ones, and steps speculatively
    // fp32 and speculative: its speculative steps read the compute copy,
    // not the master (Note [The master a speculative step does not read]).
    bool master_unread = false;
    uint64_t host_working = 0;  // its step's roles homed off the host
    // The chunk the step updates as its fp32 params.
    Role params() const { return in_place ? Role::kCompute : Role::kMaster; }
  };
  // What this step learned about a group so far; reset by BeginStep.
  struct GroupStep {
    int handoffs = 0;
    double sum_squares = 0;
    bool finite = true;
    bool speculated = false;  // stepped with clip_coef 1, not yet settled
    bool kept = false;        // ... and FinishStep kept the update
    bool applied = false;     // stepped for good under backward
  };
  struct Slot {
    void* device = nullptr;  // device and host are fixed after Init
    void* host = nullptr;    // null when every hand-off is direct
    // Set by HandOff, or by the worker for a direct task; waited for by
    // the worker.
    tier::Event d2h;
    tier::Event written;  // set by HandOff: the gradients complete on the
                          // device, which every copy of them waits for
    int group = -1;
    bool acquired = false;
    std::thread::id acquirer;  // while acquired
    bool pending = false;      // handed off, not yet consumed by the worker
  };
  // What a group's step runs with, decided when it was queued (Note
  // [Exact steps under overlap]).
  struct StepParams {
    StepHyper hyper;
    float clip_coef = 1.0f;
    int64_t step = 1;  // this step's number, from 1 (bias correction)
  };
  // What FinishStep's first phase found, for its second.
  struct Settled {
    OptimStepReport report;
    Clock::time_point start;
  };
  struct Task {
    int group = -1;
    int slot = -1;  // gradients to consume; -1: a deferred step
    bool first = false;
    bool final = false;
    // The worker copies the device's gradients straight into the group's
    // accumulator (Note [Gradients straight into the accumulator]).
    bool direct = false;
    StepParams params;
    bool restore = false;  // with slot -1: restore the compute copy only
  };
  // The versions of a group's master and compute chunks after the pipeline
  // last wrote them: while both hold, the compute copy is the master
  // rounded, so a skipped speculative step can restore it from the master.
  struct Written {
    uint64_t master = ~uint64_t{0};
    uint64_t compute = ~uint64_t{0};
  };
  static constexpr RoleMask kGradBit = RoleBit(Role::kGrad);

  static RoleMask StateRoles(const Group& g) {
    return g.step_roles & ~RoleBit(Role::kCompute);
  }
  static bool UsesState2(OptimAlgo algo) {
    return algo == OptimAlgo::kAdam || algo == OptimAlgo::kAdamW;
  }
  static double Seconds(Clock::duration d) {
    return std::chrono::duration<double>(d).count();
  }

  Status InspectGroups();
  // Every tensor of a trained group has `roles` and the group's dtype.
  Status CheckTensors(const store::GroupLayout& layout, RoleMask roles,
                      bool grads) const;
  // The homes of the group's chunks: its write-behind, host working set
  // and whether it speculates.
  void ReadHomes(const store::GroupLayout& layout, RoleMask needed,
                 Group& g) const;
  // Second NVMe extents for the state of groups that speculate.
  Status AddSpares();
  Status MakeDeviceRoom(uint64_t bytes);  // for the gradient buffers
  Status MakeHostRoom(uint64_t staging);
  uint64_t StagingBytes() const;
  Status AllocateSlots();
  Status CheckSelfWait(int group) const;  // under mu_
  // The buffer of `group` in the slot at `device`, and its fill.
  GradientBuffer BufferOf(int group, void* device) const;
  Status Fill(const GradientBuffer& buffer, GradientFill fill);
  Status CheckGroupHyper(const StepHyper& hyper,
                         const std::vector<GroupHyper>& groups) const;
  // `base` with the hyperparameters of `group` this step.
  StepParams ParamsOf(int group, const StepParams& base) const;
  // Steps wait for the global norm (clipping, skipping, kAfterBackward).
  bool Deferred() const;
  // ... and run under the next forward (Note [Steps under the next
  // forward]) rather than in FinishStep.
  bool UnderNextForward() const;
  void WorkerLoop();
  void WriterLoop();
  Status RunTask(const Task& task);
  Status StepDeferred(const Task& task);
  Status RestoreCompute(int group);
  // Whether the group's step under backward is speculative (Note [Exact
  // steps under overlap]): it may be, and its compute copy is derived.
  bool Speculates(int group) const;
  void RecordWritten(int group);
  Status ConsumeGradients(const Task& task);
  bool Direct(int group, bool first, bool final) const;
  Status Gather(const Task& task, float* acc);
  void MarkApplied(int group);  // stepped for good under this backward
  // Note [A step's working set] (pipeline_worker.cc).
  Result<store::Residency::Fetched> FetchToHost(
      int group, const store::Residency::Access& access,
      bool speculative = false);
  // A step's hold on its chunks, when it began (the step's seconds),
  // whether its writes are speculative, what it must verify of what it
  // read (null: nothing), and its pass's roles.
  struct StepHold {
    store::Residency::Fetched fetched;
    Clock::time_point start;
    bool speculative = false;
    std::unique_ptr<optim::StepCheck> check;
    PassRoles roles;
    static Result<StepHold> Of(Result<store::Residency::Fetched> f) {
      if (!f.ok()) return f.status();
      return StepHold{std::move(*f), Clock::now(), false, nullptr, {}};
    }
  };
  Result<StepHold> HoldForStep(int group, store::Residency::Access extra,
                               bool speculative);
  // Releases a step's hold once every byte it read unchecked is verified;
  // a mismatch marks its chunks lost (Residency::MarkLost) and is
  // returned before any error of the release.
  Status Release(StepHold& hold);
  // `digest` hashes what the step writes (Note [Checksums in the
  // optimizer's pass] in src/optim/step_digest.h), `check` verifies what
  // it reads (src/optim/step_check.h); `norm`, when not null, gets the
  // gradients' sum of squares of a step that applies (Note [The norm in the
  // step's pass], pipeline_pass.cc).
  Result<StepReport> Step(int group, const StepOptions& step,
                          const OptimBuffers& whole, PassRoles roles,
                          optim::StepDigest* digest, optim::StepCheck* check,
                          SumSquaresResult* norm);
  // The group's gradients' sum of squares, call by call (the same Note).
  Result<SumSquaresResult> SumSquares(int group, const void* grads,
                                      FloatType type);
  // What the step's pass verifies of `fetched`, the hold of its chunks.
  std::unique_ptr<optim::StepCheck> CheckOf(
      int group, const store::Residency::Fetched& fetched) const;
  // The chunks of `b` that the step writes and that are homed on NVMe.
  std::vector<optim::StepDigest::Chunk> DigestedChunks(int group,
                                                       const OptimBuffers& b,
                                                       PassRoles roles) const;
  StepOptions OptionsOf(const StepParams& params) const;
  // `norm`: as Step's; a speculative step that stopped at a non-finite
  // gradient returns OK with the norm not finite.
  Status StepGroup(int group, StepHold& hold, const void* grads,
                   FloatType grad_type, const StepParams& params,
                   SumSquaresResult* norm = nullptr);
  // The last micro-batch's norm, and the step where the hand-off steps.
  Status NormAndStep(const Task& task, StepHold& hold, float* acc, bool steps,
                     bool speculate);
  void RecordNorm(int group, const SumSquaresResult& r);
  // Prefetches the state of the groups that step after `group` (-1: the
  // first): the deferred steps queued, else in the last step's order.
  void ReadAhead(int group);
  // Finish's first phase (Note [Exact steps under overlap]), with mu_
  // held: the step's work ended, the norm reduced, speculation settled,
  // deferred steps queued.
  Result<Settled> Settle(std::unique_lock<std::mutex>& lk,
                         const StepChecks* global);
  // Finish's passes, each called with mu_ held.
  Status CheckHandOffs() const;
  // Abort's: drops this step's hand-offs not yet consumed (their copies
  // to the host waited for first) and frees every acquired buffer.
  void DropHandOffs(std::unique_lock<std::mutex>& lk);
  // Ends the step's bookkeeping (Finish and Abort): the step count, the
  // order, the seconds.
  void EndStepBookkeeping(OptimStepReport* report, bool taken);
  // This process's checks in group order; the first group whose gradients
  // were not finite in `bad` (-1: none).
  StepChecks Checks(int* bad) const;
  Status ReduceNorms(const StepChecks* global, OptimStepReport* report) const;
  // Keeps (`keep`) or undoes the speculative steps of this step; counts
  // them in `report`. Called with mu_ held and the worker idle; unlocks it
  // meanwhile.
  Status SettleSpeculation(std::unique_lock<std::mutex>& lk, bool keep,
                           OptimStepReport* report);
  // Discards the gradients of this step's groups that no deferred step
  // will read: all of them unless `stepping` (Note [Discarded bytes] in
  // src/store/residency_moves.cc). Called with mu_ held; unlocks it meanwhile.
  void EndGradients(std::unique_lock<std::mutex>& lk, bool stepping);
  float ClipCoef(double grad_norm) const;
  // Queues, marked pending, in the next forward's order: the step of every
  // trained group whose update was not kept (`restore`: the compute copy
  // of every undone one).
  void QueueDeferred(const StepParams& params, bool restore);

  // Fixed after Init.
  Engine* engine_ = nullptr;
  internal::EngineParts parts_;
  std::unique_ptr<CpuOptimizer> cpu_;
  std::vector<Group> groups_;
  bool speculates_ = false;  // some group steps speculatively
  std::thread worker_;
  std::thread writer_;

  // Owned by the worker thread.
  std::vector<Written> written_;

  // Guarded by mu_.
  StepParams current_;  // this step's, set by BeginStep
  // Each group's hyperparameters this step (BeginStep's `groups`).
  std::vector<StepHyper> group_hyper_;
  std::mutex mu_;
  std::condition_variable changed_;  // any of the below changed
  std::vector<GroupStep> this_step_;
  std::vector<Slot> slots_;
  std::vector<int> order_;       // final hand-offs of the last step
  std::vector<int> this_order_;  // ... of this step, so far
  std::deque<Task> tasks_;
  int running_ = 0;
  int consuming_ = 0;       // of running_, this step's hand-offs
  std::deque<int> writes_;  // groups whose state goes back to NVMe
  int writing_ = 0;
  bool stop_ = false;
  Status error_;
  double step_seconds_ = 0;
  double hidden_seconds_ = 0;
  double acquire_wait_ = 0;
  bool finishing_ = false;
  // FinishStep's first phase is done (it was interrupted in the second).
  std::optional<Settled> settled_;

  // How often each group's state was held for a step, for the read-ahead's
  // prefetches, which may run after the optimizer is gone (shared).
  class Counts {
   public:
    explicit Counts(size_t n) : counts_(n, 0) {}
    void Add(int group) {
      std::lock_guard<std::mutex> lk(mu_);
      ++counts_[group];
    }
    uint64_t Count(int group) const {
      std::lock_guard<std::mutex> lk(mu_);
      return counts_[group];
    }

   private:
    mutable std::mutex mu_;
    std::vector<uint64_t> counts_;  // guarded by mu_
  };
  std::shared_ptr<Counts> held_for_step_;
};

}  // namespace strata

#endif  // STRATA_SRC_OPTIM_PIPELINE_H_
