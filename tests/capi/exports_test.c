/* What the C ABI hands out cannot outlive its memory (issue #31 §2, §3,
 * §4), compiled as C: a DLPack export holds its view's fetch past the
 * view's release, so it neither reads nor writes memory given to another
 * group; engines and optimizers refuse to close under live exports
 * (strata_engine_close_after_exports lets an exiting process let go of an
 * engine anyway); engine and optimizer handles closed twice or used after
 * close are clear errors; versioned exports carry the read-only flag of
 * read views; the device budget counts only device_roles. Host-emulated device,
 * no NVMe. Exits 0 on success, 1 naming the failed check otherwise. */
#define _XOPEN_SOURCE 700

#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "strata/strata.h"
#include "tests/capi/c_check.h"

#ifdef __cplusplus
#error "exports_test.c tests the C ABI and must be compiled as C"
#endif

#define KIB 1024ull
#define ELEMENTS (16 * 1024) /* fp32: 64 KiB a group */

static const uint32_t kCompute = STRATA_ROLE_BIT(STRATA_ROLE_COMPUTE);
static const uint32_t kTrained = STRATA_ROLE_BIT(STRATA_ROLE_COMPUTE) |
                                 STRATA_ROLE_BIT(STRATA_ROLE_STATE1) |
                                 STRATA_ROLE_BIT(STRATA_ROLE_STATE2);

static int32_t Register(strata_engine* engine, const char* name,
                        int64_t elements, int32_t dtype, uint32_t roles) {
  int32_t id = -1;
  CHECK_OK(RegisterOne(engine, name, elements, dtype, roles, &id));
  return id;
}

/* A host-emulated engine whose device holds one group's fetch at a time
 * (and two gradient buffers of a small group). */
static strata_engine* Open(void) {
  strata_engine_options options;
  CHECK_OK(strata_engine_options_init(&options));
  options.device = STRATA_DEVICE_HOST;
  options.device_budget = ELEMENTS * 4 + 32 * KIB; /* + gradient buffers */
  options.host_budget = 1024 * KIB;
  options.io_threads = 1;
  strata_engine* engine = NULL;
  CHECK_OK(strata_engine_open(&options, &engine));
  CHECK(Register(engine, "a", ELEMENTS, STRATA_DTYPE_FLOAT32, kCompute) == 0);
  CHECK(Register(engine, "c", ELEMENTS, STRATA_DTYPE_FLOAT32, kCompute) == 1);
  return engine;
}

static float* Floats(DLManagedTensor* managed) {
  return (float*)managed->dl_tensor.data;
}

static void Fill(strata_engine* engine, int32_t group, int32_t tier,
                 float value) {
  strata_view* view = NULL;
  CHECK_OK(strata_group_fetch(engine, group, tier, kCompute, 1, &view));
  DLManagedTensor* managed = NULL;
  CHECK_OK(strata_view_export_dlpack(view, 0, &managed));
  for (int i = 0; i < ELEMENTS; ++i) Floats(managed)[i] = value;
  managed->deleter(managed);
  CHECK_OK(strata_view_release(view));
}

/* 1 when every element of the group's compute copy is `value`. */
static int Holds(strata_engine* engine, int32_t group, float value) {
  strata_view* view = NULL;
  CHECK_OK(
      strata_group_fetch(engine, group, STRATA_TIER_HOST, kCompute, 0, &view));
  strata_tensor_info info;
  info.struct_size = sizeof(info);
  CHECK_OK(strata_view_get_tensor(view, 0, &info));
  int same = 1;
  for (int i = 0; i < ELEMENTS; ++i) same &= ((float*)info.data)[i] == value;
  CHECK_OK(strata_view_release(view));
  return same;
}

/* The case: an array exported from group a's device view, kept
 * past the release, while group c needs the device memory. */
static void CheckExportOutlivesRelease(void) {
  strata_engine* engine = Open();
  Fill(engine, 0, STRATA_TIER_HOST, 5.0f);
  Fill(engine, 1, STRATA_TIER_HOST, 1.0f);
  strata_view* view = NULL;
  CHECK_OK(
      strata_group_fetch(engine, 0, STRATA_TIER_DEVICE, kCompute, 1, &view));
  DLManagedTensor* kept = NULL;
  CHECK_OK(strata_view_export_dlpack(view, 0, &kept));
  CHECK_OK(strata_view_release(view));
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_view_release(view));
  /* The fetch stays pinned: c cannot have a's memory. */
  strata_view* other = NULL;
  CHECK_FAILS(
      STRATA_RESOURCE_EXHAUSTED,
      strata_group_fetch(engine, 1, STRATA_TIER_DEVICE, kCompute, 1, &other));
  CHECK_FAILS(STRATA_FAILED_PRECONDITION,
              strata_group_evict(engine, 0, STRATA_TIER_DEVICE));
  CHECK(strstr(strata_last_error(), "DLPack exports") != NULL);
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_engine_close(engine));
  CHECK(strstr(strata_last_error(), "pinned by DLPack exports") != NULL);
  CHECK(Floats(kept)[7] == 5.0f);
  for (int i = 0; i < ELEMENTS; ++i) Floats(kept)[i] = 6.0f; /* a late write */
  kept->deleter(kept); /* releases the fetch */
  Fill(engine, 1, STRATA_TIER_DEVICE, 99.0f);
  CHECK_OK(strata_engine_drain(engine));
  CHECK(Holds(engine, 0, 6.0f)); /* the late write landed in a */
  CHECK(Holds(engine, 1, 99.0f));
  CHECK_OK(strata_engine_close(engine));
}

/* strata_engine_close_after_exports: the handle ends at once, the export
 * still reads its bytes, and its deleter frees the engine (LeakSanitizer
 * sees it otherwise). */
static void CheckCloseAfterExports(void) {
  strata_engine* engine = Open();
  Fill(engine, 0, STRATA_TIER_HOST, 4.0f);
  strata_view* view = NULL;
  CHECK_OK(strata_group_fetch(engine, 0, STRATA_TIER_HOST, kCompute, 0, &view));
  DLManagedTensor* kept = NULL;
  CHECK_OK(strata_view_export_dlpack(view, 0, &kept));
  CHECK_FAILS(STRATA_FAILED_PRECONDITION,
              strata_engine_close_after_exports(engine)); /* a view held */
  CHECK_OK(strata_view_release(view));
  CHECK_OK(strata_engine_close_after_exports(engine));
  int32_t count = 0;
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_group_count(engine, &count));
  CHECK(Floats(kept)[ELEMENTS - 1] == 4.0f);
  kept->deleter(kept);
}

/* A forked child inherits the parent's exports but not its threads: an
 * export deleted there lets go of nothing (its engine's locks may have
 * been held at the fork, and closing it would join threads the child does
 * not have), and the parent goes on as before. */
static void CheckForkedChildLetsGoOfNothing(void) {
  strata_engine* engine = Open();
  strata_view* view = NULL;
  CHECK_OK(strata_group_fetch(engine, 0, STRATA_TIER_HOST, kCompute, 0, &view));
  DLManagedTensor* kept = NULL;
  CHECK_OK(strata_view_export_dlpack(view, 0, &kept));
  CHECK_OK(strata_view_release(view));
  const pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    kept->deleter(kept);
    /* Still pinned in the child's copy of the engine: nothing ran. */
    _exit(strata_engine_close(engine) == STRATA_FAILED_PRECONDITION ? 0 : 3);
  }
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  kept->deleter(kept);
  CHECK_OK(strata_engine_close(engine));
}

/* Versioned exports: DLPack 1.0, read-only exactly for read views. */
static void CheckVersioned(void) {
  strata_engine* engine = Open();
  for (int write = 0; write <= 1; ++write) {
    strata_view* view = NULL;
    CHECK_OK(strata_group_fetch(engine, 0, STRATA_TIER_HOST, kCompute, write,
                                &view));
    strata_dlpack_versioned* managed = NULL;
    CHECK_OK(strata_view_export_dlpack_versioned(view, 0, &managed));
    CHECK(managed->version.major == 1 && managed->version.minor == 0);
    CHECK(managed->flags == (write ? 0 : STRATA_DLPACK_FLAG_READ_ONLY));
    CHECK(managed->dl_tensor.ndim == 1 &&
          managed->dl_tensor.shape[0] == ELEMENTS);
    CHECK(managed->dl_tensor.dtype.code == kDLFloat);
    CHECK_OK(strata_view_release(view));
    managed->deleter(managed);
  }
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_view_export_dlpack_versioned(NULL, 0, NULL));
  CHECK_OK(strata_engine_close(engine));
}

/* Engine and optimizer handles: closed twice, used after close, foreign. */
static void CheckClosedHandles(void) {
  strata_engine* engine = Open();
  Register(engine, "trained", ELEMENTS / 4, STRATA_DTYPE_FLOAT32, kTrained);
  /* A handle of another kind never reaches an object of this one. */
  strata_view* a_view = NULL;
  CHECK_OK(
      strata_group_fetch(engine, 0, STRATA_TIER_HOST, kCompute, 0, &a_view));
  int32_t groups = 0;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_group_count((strata_engine*)a_view, &groups));
  CHECK(strstr(strata_last_error(), "is no engine handle") != NULL);
  CHECK_OK(strata_view_release(a_view));
  strata_optimizer_options options;
  CHECK_OK(strata_optimizer_options_init(&options));
  strata_optimizer* optimizer = NULL;
  CHECK_OK(strata_optimizer_create(engine, &options, &optimizer));
  CHECK_OK(strata_optimizer_close(optimizer));
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_optimizer_close(optimizer));
  CHECK(strstr(strata_last_error(), "optimizer") != NULL &&
        strstr(strata_last_error(), "closed already") != NULL);
  int64_t step = 0;
  CHECK_FAILS(STRATA_FAILED_PRECONDITION,
              strata_optimizer_get_step(optimizer, &step));
  CHECK_OK(strata_engine_close(engine));
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_engine_close(engine));
  CHECK(strstr(strata_last_error(), "closed already") != NULL);
  int32_t count = 0;
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_group_count(engine, &count));
  strata_view* view = NULL;
  CHECK_FAILS(
      STRATA_FAILED_PRECONDITION,
      strata_group_fetch(engine, 0, STRATA_TIER_HOST, kCompute, 0, &view));
  CHECK_FAILS(STRATA_FAILED_PRECONDITION,
              strata_optimizer_create(engine, &options, &optimizer));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_group_count((strata_engine*)&count, &count));
  CHECK(strstr(strata_last_error(), "strata_engine_open") != NULL);
}

/* A gradient buffer's export holds the optimizer's memory; it stays
 * writable (versioned, no read-only flag). */
static void CheckGradientExports(void) {
  strata_engine* engine = Open();
  const int32_t g =
      Register(engine, "trained", ELEMENTS / 4, STRATA_DTYPE_FLOAT32, kTrained);
  strata_optimizer_options options;
  CHECK_OK(strata_optimizer_options_init(&options));
  strata_optimizer* optimizer = NULL;
  CHECK_OK(strata_optimizer_create(engine, &options, &optimizer));
  strata_step_hyper hyper;
  CHECK_OK(strata_step_hyper_init(&hyper));
  CHECK_OK(strata_step_begin(engine));
  CHECK_OK(strata_optimizer_begin_step(optimizer, &hyper));
  strata_gradients* grads = NULL;
  CHECK_OK(strata_optimizer_acquire_gradients(optimizer, g, &grads));
  strata_dlpack_versioned* managed = NULL;
  CHECK_OK(strata_gradients_export_dlpack_versioned(grads, STRATA_WHOLE_BUFFER,
                                                    &managed));
  CHECK(managed->flags == 0 && managed->version.major == 1);
  CHECK_OK(strata_optimizer_hand_off(optimizer, grads, NULL, NULL));
  strata_step_report report;
  memset(&report, 0, sizeof(report));
  report.struct_size = sizeof(report);
  CHECK_OK(strata_optimizer_finish_step(optimizer, &report));
  CHECK_OK(strata_step_end(engine));
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_optimizer_close(optimizer));
  CHECK(strstr(strata_last_error(), "exports of gradient buffers") != NULL);
  managed->deleter(managed);
  CHECK_OK(strata_optimizer_close(optimizer));
  CHECK_OK(strata_engine_close(engine));
}

/* A 1M-parameter bf16 layer with every role: 2 MiB of weights. With
 * device_roles = compute a 3 MiB device budget holds it; without, the
 * error names device_roles as the fix, and it is. */
static void CheckDeviceRoles(void) {
  for (int compute_only = 0; compute_only <= 1; ++compute_only) {
    strata_engine_options options;
    CHECK_OK(strata_engine_options_init(&options));
    CHECK(options.device_roles == 0); /* every role */
    options.device = STRATA_DEVICE_HOST;
    options.device_budget = 3 * 1024 * KIB;
    options.host_budget = 64 * 1024 * KIB;
    options.io_threads = 1;
    if (compute_only) options.device_roles = kCompute;
    strata_engine* engine = NULL;
    CHECK_OK(strata_engine_open(&options, &engine));
    int32_t id = -1; /* 1M bf16 parameters with every role */
    if (!compute_only) {
      CHECK_FAILS(STRATA_RESOURCE_EXHAUSTED,
                  RegisterOne(engine, "layer", 1 << 20, STRATA_DTYPE_BFLOAT16,
                              STRATA_ALL_ROLES, &id));
      CHECK(strstr(strata_last_error(), "device_roles") != NULL);
    } else {
      id = Register(engine, "layer", 1 << 20, STRATA_DTYPE_BFLOAT16,
                    STRATA_ALL_ROLES);
      strata_view* view = NULL;
      CHECK_OK(strata_group_fetch(engine, id, STRATA_TIER_DEVICE, kCompute, 0,
                                  &view));
      CHECK_OK(strata_view_release(view));
      CHECK_FAILS(STRATA_INVALID_ARGUMENT,
                  strata_group_fetch(engine, id, STRATA_TIER_DEVICE,
                                     STRATA_ALL_ROLES, 0, &view));
      CHECK(strstr(strata_last_error(), "device_roles") != NULL);
    }
    CHECK_OK(strata_engine_close(engine));
  }
  strata_engine_options bad;
  CHECK_OK(strata_engine_options_init(&bad));
  bad.device = STRATA_DEVICE_HOST;
  bad.device_roles = 1u << 7;
  strata_engine* engine = NULL;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_engine_open(&bad, &engine));
  CHECK(strstr(strata_last_error(), "device_roles") != NULL);
}

int main(void) {
  CheckExportOutlivesRelease();
  CheckCloseAfterExports();
  CheckForkedChildLetsGoOfNothing();
  CheckVersioned();
  CheckClosedHandles();
  CheckGradientExports();
  CheckDeviceRoles();
  return 0;
}
