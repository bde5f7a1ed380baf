/* strata/strata_optimizer.h: the C ABI of the offloaded optimizer
 * (strata/offload_optimizer.h). Library `strata`; included by
 * strata/strata.h, whose conventions hold here too (statuses, last error,
 * struct_size, checked pointers, no exception across the boundary).
 *
 * Example: one step over the groups of an engine (tests/capi/optim_test.c
 * runs this code; error checks left out).
 *
 *   strata_optimizer_options o;
 *   strata_optimizer_options_init(&o);     // AdamW, overlap mode
 *   o.clip_norm = 1.0;
 *   strata_optimizer* opt;
 *   strata_optimizer_create(engine, &o, &opt);
 *   strata_step_hyper h;
 *   strata_step_hyper_init(&h);
 *   h.lr = 1e-4;
 *   strata_step_begin(engine);
 *   strata_optimizer_begin_step(opt, &h);
 *   for (int32_t g = groups - 1; g >= 0; --g) {  // backward
 *     strata_gradients* grads;
 *     strata_optimizer_acquire_gradients(opt, g, &grads);
 *     DLManagedTensor* whole;                     // or one tensor's slice
 *     strata_gradients_export_dlpack(grads, STRATA_WHOLE_BUFFER, &whole);
 *     ...  // kernels on `stream` write the group's gradients into it
 *     whole->deleter(whole);
 *     strata_optimizer_hand_off(opt, grads, stream, NULL);
 *   }
 *   strata_step_report r = {.struct_size = sizeof r};
 *   strata_optimizer_finish_step(opt, &r);
 *   strata_step_end(engine);
 *   strata_optimizer_close(opt);
 *
 * Ownership and lifetime
 * - A strata_optimizer borrows its engine: strata_engine_close fails with
 *   STRATA_FAILED_PRECONDITION while an optimizer of it is open.
 * - A strata_gradients handle is one acquired gradient buffer (device
 *   memory in the group's compute dtype, zeroed unless acquired
 *   STRATA_GRADIENTS_UNWRITTEN, each tensor at its compute-chunk offset).
 *   It and everything read from it are valid until
 *   strata_optimizer_hand_off(it), which ends the handle whether or not it
 *   succeeds; DLPack tensors exported from it must not be used after that.
 *   Handles are numbers, never reused (Note [View handles] in
 *   src/capi/handles.h): a handle handed off already fails with
 *   STRATA_FAILED_PRECONDITION, one that never was a handle with
 *   STRATA_INVALID_ARGUMENT.
 * - strata_optimizer_close fails with STRATA_FAILED_PRECONDITION while
 *   gradient buffers are acquired and not handed off.
 *
 * Thread safety: as strata::OffloadOptimizer: one training thread calls
 * begin_step, acquire_gradients, hand_off and finish_step in order;
 * strata_gradients_* may be called from any thread.
 */
#ifndef STRATA_STRATA_OPTIMIZER_H_
#define STRATA_STRATA_OPTIMIZER_H_

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/export.h"
#include "strata/strata.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum strata_optim_algo {
  STRATA_ALGO_ADAM = 0,
  STRATA_ALGO_ADAMW = 1,
  STRATA_ALGO_ADAGRAD = 2,
  STRATA_ALGO_LION = 3
} strata_optim_algo;

typedef enum strata_optim_mode {
  STRATA_MODE_OVERLAP = 0,       /* each group steps once its gradients are
                                    final, under the rest of backward */
  STRATA_MODE_AFTER_BACKWARD = 1 /* every step waits for finish_step */
} strata_optim_mode;

/* What strata_optimizer_acquire_gradients_filled leaves in the tensors;
 * see strata::GradientFill. */
typedef enum strata_gradient_fill {
  STRATA_GRADIENTS_ZEROED = 0,   /* accumulate into them */
  STRATA_GRADIENTS_UNWRITTEN = 1 /* the caller writes every element of
                                    every tensor before hand_off */
} strata_gradient_fill;

/* The index of the whole buffer, for strata_gradients_export_dlpack. */
#define STRATA_WHOLE_BUFFER (-1)

typedef struct strata_optimizer strata_optimizer;
typedef struct strata_gradients strata_gradients;

/* strata::OffloadOptimizerOptions; the defaults are its defaults. */
typedef struct strata_optimizer_options {
  uint32_t struct_size;     /* sizeof(strata_optimizer_options), by _init */
  int32_t algo;             /* strata_optim_algo; default ADAMW */
  int32_t mode;             /* strata_optim_mode; default OVERLAP */
  int32_t micro_batches;    /* hand-offs per group per step; default 1 */
  int32_t skip_on_overflow; /* 1: non-finite gradients skip the step */
  int32_t threads;          /* CPU optimizer threads; 0: all cores but one
                               (of those the CPU affinity allows) */
  int32_t grad_buffers;     /* device gradient buffers; default 2 */
  int32_t read_ahead;       /* groups of state fetched ahead; default 1 */
  int32_t speculate;        /* 1 (default): see offload_optimizer.h */
  int32_t reserved;         /* 0 */
  double clip_norm;         /* global L2 norm clipping; 0 (default): off */
} strata_optimizer_options;

/* strata::StepHyper: one step's hyperparameters and loss scale. */
typedef struct strata_step_hyper {
  uint32_t struct_size; /* sizeof(strata_step_hyper), set by _init */
  uint32_t reserved;    /* 0 */
  double lr;            /* default 1e-3 */
  double beta1;         /* 0.9 */
  double beta2;         /* 0.999 */
  double eps;           /* 1e-8 */
  double weight_decay;  /* 0 */
  double lr_decay;      /* 0 (Adagrad) */
  double loss_scale;    /* 1; the gradients are multiplied by 1/loss_scale */
} strata_step_hyper;

/* strata::OptimStepReport; the caller sets struct_size. */
typedef struct strata_step_report {
  uint32_t struct_size;
  int32_t skipped; /* 1: non-finite gradients, the step changed nothing */
  int64_t step;    /* steps applied so far, after this one */
  double grad_norm;
  double clip_coef;
  double step_seconds;
  double hidden_seconds;
  double finish_wait_seconds;
  double acquire_wait_seconds;
  int32_t speculated; /* groups stepped speculatively under backward */
  int32_t undone;     /* of those, undone (clipped or skipped) */
  /* Since 0.2: the first group whose gradients were not finite, -1 none. */
  int32_t overflow_group;
  int32_t reserved;
} strata_step_report;

/* strata::StepChecks (since 0.2): one step's gradient checks; the caller
 * sets struct_size. */
typedef struct strata_step_checks {
  uint32_t struct_size;
  int32_t overflow;   /* 1: some gradient is not finite */
  double sum_squares; /* of the scaled gradients, in group order */
} strata_step_checks;

/* strata::OptimAbortReport; the caller sets struct_size. */
typedef struct strata_abort_report {
  uint32_t struct_size;
  int32_t applied;        /* groups whose update stays: the model mixes steps */
  int32_t completed;      /* 1: the step had settled and stands; then: */
  int32_t skipped;        /* ... whether it skipped (non-finite gradients), */
  int32_t overflow_group; /* ... the first such group (-1 none), */
  int32_t reserved;
  double grad_norm; /* ... and its gradient norm */
} strata_abort_report;

/* strata::GradientBuffer, without its tensors (strata_gradients_get_tensor);
 * the caller sets struct_size. */
typedef struct strata_gradients_info {
  uint32_t struct_size;
  int32_t group;
  void* data; /* CUDA memory when on_cuda, else host memory */
  uint64_t bytes;
  int32_t on_cuda;
  int32_t num_tensors;
} strata_gradients_info;

STRATA_EXPORT strata_status
strata_optimizer_options_init(strata_optimizer_options* options);
STRATA_EXPORT strata_status strata_step_hyper_init(strata_step_hyper* hyper);

/* Creates the optimizer over every group of `engine` (see
 * strata::OffloadOptimizer::Create for what a trainable group needs). */
STRATA_EXPORT strata_status strata_optimizer_create(
    strata_engine* engine, const strata_optimizer_options* options,
    strata_optimizer** optimizer);
STRATA_EXPORT strata_status strata_optimizer_close(strata_optimizer* optimizer);

STRATA_EXPORT strata_status strata_optimizer_begin_step(
    strata_optimizer* optimizer, const strata_step_hyper* hyper);
/* strata_optimizer_begin_step with per-group hyperparameters: group
 * groups[i] steps with group_hypers[i] (the same loss_scale as `hyper`),
 * every other trained group with `hyper`; see strata::GroupHyper. */
STRATA_EXPORT strata_status strata_optimizer_begin_step_groups(
    strata_optimizer* optimizer, const strata_step_hyper* hyper,
    const int32_t* groups, const strata_step_hyper* group_hypers,
    int32_t count);
/* A zeroed gradient buffer for `group`; blocks while every buffer is still
 * being copied to the host. STRATA_FAILED_PRECONDITION, naming the groups
 * that hold them, when every buffer is acquired by the calling thread and
 * not handed off (it would wait for itself). */
STRATA_EXPORT strata_status strata_optimizer_acquire_gradients(
    strata_optimizer* optimizer, int32_t group, strata_gradients** gradients);
/* strata_optimizer_acquire_gradients with the tensors filled as `fill` (a
 * strata_gradient_fill) says: with STRATA_GRADIENTS_UNWRITTEN they hold what
 * the buffer's last user left, and the caller must overwrite every element
 * (a first gradient copied in rather than added saves a pass); the bytes
 * between the tensors are zeroed either way. */
STRATA_EXPORT strata_status strata_optimizer_acquire_gradients_filled(
    strata_optimizer* optimizer, int32_t group, int32_t fill,
    strata_gradients** gradients);
/* Hands the buffer back with this micro-batch's gradients in it, and ends
 * the handle. Kernels still writing them were queued on `stream` (a
 * cudaStream_t; a strata::HostStream* on the host-emulated device) or, when
 * stream is NULL, before `event` (a recorded cudaEvent_t): the copy to the
 * host waits for them on the device, and the call does not. Both NULL: the
 * gradients are written already. */
STRATA_EXPORT strata_status strata_optimizer_hand_off(
    strata_optimizer* optimizer, strata_gradients* gradients, void* stream,
    void* event);
/* After backward; see strata::OffloadOptimizer::FinishStep. */
STRATA_EXPORT strata_status strata_optimizer_finish_step(
    strata_optimizer* optimizer, strata_step_report* report);
/* After every hand-off: this process's gradient checks, the step left open;
 * see strata::OffloadOptimizer::LocalChecks. Ranks holding partitions of
 * the groups combine theirs (sum, or) and pass the result to
 * strata_optimizer_finish_step_global. */
STRATA_EXPORT strata_status strata_optimizer_local_checks(
    strata_optimizer* optimizer, strata_step_checks* checks);
/* strata_optimizer_finish_step deciding from every rank's checks. */
STRATA_EXPORT strata_status strata_optimizer_finish_step_global(
    strata_optimizer* optimizer, const strata_step_checks* global,
    strata_step_report* report);
/* Ends the open step without finishing it, after an error or an interrupt
 * in the caller's forward or backward; see
 * strata::OffloadOptimizer::AbortStep. Every gradient handle of the
 * optimizer not handed off ends with it. Between steps it does nothing. */
STRATA_EXPORT strata_status strata_optimizer_abort_step(
    strata_optimizer* optimizer, strata_abort_report* report);

STRATA_EXPORT strata_status
strata_optimizer_get_step(const strata_optimizer* optimizer, int64_t* step);
/* For a resume: the steps already applied; no step may be in progress. */
STRATA_EXPORT strata_status
strata_optimizer_set_step(strata_optimizer* optimizer, int64_t step);

/* strata_engine_save and _load with the optimizer's step and algorithm
 * (strata::OffloadOptimizer::Save/Load); user_state as there. */
STRATA_EXPORT strata_status strata_optimizer_save(strata_optimizer* optimizer,
                                                  const char* dir,
                                                  const char* user_state);
STRATA_EXPORT strata_status strata_optimizer_load(strata_optimizer* optimizer,
                                                  const char* dir,
                                                  char* user_state_buf,
                                                  size_t capacity,
                                                  size_t* needed);

STRATA_EXPORT strata_status strata_gradients_get_info(
    const strata_gradients* gradients, strata_gradients_info* info);
/* Tensor `index` of the buffer: role COMPUTE, the group's compute dtype. */
STRATA_EXPORT strata_status strata_gradients_get_tensor(
    const strata_gradients* gradients, int32_t index, strata_tensor_info* info);
/* Exports tensor `index`, or with STRATA_WHOLE_BUFFER the whole buffer (a
 * 1-D tensor of bytes / element size elements, padding included), as
 * DLPack, zero-copy, as strata_view_export_dlpack does. The padding between
 * tensors must stay zero: the gradient norm (clipping, overflow) counts
 * every element of the buffer.
 * The export holds the optimizer's memory until its deleter runs
 * (strata_optimizer_close fails while exports live), but the buffer is the
 * caller's only until its hand-off: from then on strata copies it and
 * reuses it for other groups, so the caller must neither write it nor
 * trust what it reads there. strata cannot stop a write through a
 * pointer; delete the exports (or make them read-only, as the Python
 * binding does with its arrays) at the hand-off. */
STRATA_EXPORT strata_status strata_gradients_export_dlpack(
    const strata_gradients* gradients, int32_t index, DLManagedTensor** out);
/* strata_gradients_export_dlpack as DLPack 1.0's versioned tensor
 * (writable; see strata_dlpack_versioned in strata.h). */
STRATA_EXPORT strata_status strata_gradients_export_dlpack_versioned(
    const strata_gradients* gradients, int32_t index,
    strata_dlpack_versioned** out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_STRATA_OPTIMIZER_H_ */
