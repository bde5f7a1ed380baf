// strata-sim: drives the whole engine through training steps of a synthetic
// model (one group per layer) and reports where the time went.
//
// One step: BeginStep; per micro-batch, forward fetches every layer's
// compute copy to the device and computes; backward fetches each layer in
// reverse, computes, writes its gradients into a buffer from the optimizer
// and hands them off; then FinishStep runs or waits for the optimizer.
// Compute is synthetic: 2 * params * tokens FLOPs per layer forward and
// twice that backward, at --tflops, spent by Busy() (busy.h): a kernel
// spinning on a CUDA device, a timed busy loop on the host-emulated one.
//
// Each optimizer mode asked for runs the offloaded model from scratch, in
// the order given, so the modes compare on the same machine minutes apart;
// with compare_unclipped, overlap mode without clipping runs last.
// With clipping on, the synthetic gradients have a global norm of half the
// clip norm (clipping fires on no step) or, every clip_fires_every-th step,
// twice it; overflow_every puts a NaN in them (the step is skipped).
// offload_efficiency is the step time of the same model and compute run
// fully resident (every role in memory, unlimited budgets, overlap mode:
// the fastest it trains without offload), measured once in the same
// invocation, divided by the mode's offloaded step time (means over the
// steps after the first two: step 0 records the trace, step 1 is the first
// to read the state back; means, so that a cost paid every few steps, as
// the redo after a clipped step, counts).
//
// Failure: every error comes back as a Status naming what failed; a model
// that does not fit its budgets fails at registration with the bytes.
// Not thread-safe; one simulation per process at a time.
#ifndef STRATA_TOOLS_SIM_SIM_H_
#define STRATA_TOOLS_SIM_SIM_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "strata/engine.h"
#include "strata/offload_optimizer.h"
#include "strata/status.h"

namespace strata::sim {

struct SimOptions {
  uint64_t params = 0;  // total, split evenly over the layers
  int layers = 0;
  DType dtype = DType::kBFloat16;
  StateFormat state_format = StateFormat::kF32;  // of m and v
  std::string device = "host";
  uint64_t device_budget = 0;
  uint64_t host_budget = 0;
  std::string nvme_dir;  // empty: no NVMe tier
  uint64_t nvme_budget = 0;
  Tier params_home = Tier::kHost;  // the compute copy
  Tier state_home = Tier::kNvme;   // master, m, v (and gradients kept)
  int steps = 6;
  double tflops = 0;  // synthetic device speed; 0: no compute
  uint64_t tokens = 2048;
  std::vector<OptimMode> modes = {OptimMode::kOverlap};
  OffloadOptimizerOptions optimizer;  // its mode is each of `modes` in turn
  bool resident_baseline = true;
  // With clipping on, the gradients' global norm is half of clip_norm, and
  // twice it on every clip_fires_every-th step (0: never).
  int clip_fires_every = 0;
  // A NaN in the first layer's gradients every overflow_every-th step (0:
  // never); needs optimizer.skip_on_overflow.
  int overflow_every = 0;
  // Also runs overlap mode with clipping and skipping off, for the cost of
  // exactness in the same invocation.
  bool compare_unclipped = false;
};

struct StepFigures {
  double seconds = 0;
  double compute_seconds = 0;
  double fetch_stall = 0;     // Fetch() waited (includes write-backs)
  double gradient_wait = 0;   // a gradient buffer was not free yet
  double optimizer_wait = 0;  // FinishStep() waited for the optimizer
  double update_wait = 0;     // forward waited for a step's updates
  double optimizer_seconds = 0;
  double hidden_fraction = 0;  // of optimizer_seconds, under compute
  bool clipped = false;        // the clip coefficient was below 1
  bool skipped = false;        // non-finite gradients: skipped
  // Groups stepped speculatively under backward, and of those undone
  // (OptimStepReport): each undone one steps again, or gets its compute
  // copy back, under the next forward (stall:u of the next step).
  int speculated = 0;
  int undone = 0;
  // Bytes moved during the step, [from][to], and by role (EngineStats::
  // role_bytes): [role][from][to].
  EngineStats::TierBytes bytes = {};
  std::array<EngineStats::TierBytes, kNumRoles> role_bytes = {};
  // Dirty bytes dropped unwritten because their contents ended
  // (EngineStats::discarded_bytes).
  uint64_t discarded_bytes = 0;
};

// One optimizer mode's offloaded run.
struct ModeRun {
  OptimMode mode = OptimMode::kOverlap;
  bool clipping = false;   // clipping or skipping on
  bool unclipped = false;  // the compare_unclipped run
  std::vector<StepFigures> steps;
  std::array<uint64_t, kNumTiers> peak = {};
  std::array<uint64_t, kNumTiers> budget = {};
  double offload_efficiency = 0;  // 0 without the baseline
};

struct SimResult {
  std::vector<ModeRun> runs;          // SimOptions::modes, in order
  std::vector<StepFigures> resident;  // empty without the baseline
};

// Mean step time over the steps after the first two (all when fewer).
double SteadySeconds(const std::vector<StepFigures>& steps);

// Runs the offloaded model in each mode, then (when asked) the resident
// baseline.
// `progress` gets one line per step.
Result<SimResult> Simulate(
    const SimOptions& options,
    const std::function<void(const std::string&)>& progress);

}  // namespace strata::sim

#endif  // STRATA_TOOLS_SIM_SIM_H_
