/* The optimizer's C ABI (strata/strata_optimizer.h), compiled as C: the
 * header's example step, the report, the step count, save and load, the
 * gradient buffers' tensors and DLPack exports, and every misuse: NULL
 * arguments, bad enum values and struct sizes, a buffer handed off twice,
 * to another optimizer, or never acquired, closing with buffers or
 * optimizers outstanding. Host-emulated device, no NVMe. Exits 0 on
 * success, 1 naming the failed check otherwise. */
#define _XOPEN_SOURCE 700

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strata/strata.h"
#include "tests/capi/c_check.h"
#include "tests/capi/c_scratch.h"

#ifdef __cplusplus
#error "optim_test.c tests the C ABI and must be compiled as C"
#endif

#define GROUPS 3
#define ELEMENTS 1000 /* a tensor: not a multiple of the alignment */
#define BF16_ONE 0x3f80

static const uint32_t kMaster = STRATA_ROLE_BIT(STRATA_ROLE_MASTER);

static strata_engine* Open(void) {
  strata_engine_options options;
  CHECK_OK(strata_engine_options_init(&options));
  options.device = STRATA_DEVICE_HOST;
  options.device_budget = 1 << 20;
  options.host_budget = 8 << 20;
  options.io_threads = 1;
  strata_engine* engine = NULL;
  CHECK_OK(strata_engine_open(&options, &engine));
  static const int64_t shape[1] = {ELEMENTS};
  for (int g = 0; g < GROUPS; ++g) {
    char name[16];
    snprintf(name, sizeof(name), "layer.%d", g);
    strata_tensor_spec tensors[2] = {
        {"w", shape, 1, STRATA_DTYPE_BFLOAT16, STRATA_ALL_ROLES, 0},
        {"b", shape, 1, STRATA_DTYPE_BFLOAT16, STRATA_ALL_ROLES, 0}};
    strata_group_spec spec;
    CHECK_OK(strata_group_spec_init(&spec));
    spec.name = name;
    spec.tensors = tensors;
    spec.num_tensors = 2;
    int32_t id = -1;
    CHECK_OK(strata_group_register(engine, &spec, &id));
  }
  return engine;
}

static strata_optimizer* Create(strata_engine* engine) {
  strata_optimizer_options o;
  CHECK_OK(strata_optimizer_options_init(&o));
  CHECK(o.algo == STRATA_ALGO_ADAMW && o.mode == STRATA_MODE_OVERLAP);
  CHECK(o.micro_batches == 1 && o.speculate == 1 && o.clip_norm == 0);
  o.threads = 1;
  strata_optimizer* opt = NULL;
  CHECK_OK(strata_optimizer_create(engine, &o, &opt));
  return opt;
}

/* Every gradient element is 1.0 (bf16), written through tensor slices. */
static void FillOnes(strata_gradients* grads) {
  strata_gradients_info info = {.struct_size = sizeof(info)};
  CHECK_OK(strata_gradients_get_info(grads, &info));
  CHECK(info.num_tensors == 2 && info.on_cuda == 0);
  for (int32_t t = 0; t < info.num_tensors; ++t) {
    strata_tensor_info tensor = {.struct_size = sizeof(tensor)};
    CHECK_OK(strata_gradients_get_tensor(grads, t, &tensor));
    CHECK(tensor.role == STRATA_ROLE_COMPUTE && tensor.bytes == 2 * ELEMENTS);
    CHECK((char*)tensor.data >= (char*)info.data &&
          (char*)tensor.data + tensor.bytes <= (char*)info.data + info.bytes);
    uint16_t* g = (uint16_t*)tensor.data;
    for (int i = 0; i < ELEMENTS; ++i) g[i] = BF16_ONE;
  }
}

/* The header's example: one step, every group's gradients 1.0. */
static strata_step_report Step(strata_engine* engine, strata_optimizer* opt) {
  strata_step_hyper h;
  CHECK_OK(strata_step_hyper_init(&h));
  CHECK(h.lr == 1e-3 && h.beta1 == 0.9 && h.loss_scale == 1.0);
  CHECK_OK(strata_step_begin(engine));
  CHECK_OK(strata_optimizer_begin_step(opt, &h));
  for (int32_t g = GROUPS - 1; g >= 0; --g) {
    strata_gradients* grads = NULL;
    CHECK_OK(strata_optimizer_acquire_gradients(opt, g, &grads));
    FillOnes(grads);
    CHECK_OK(strata_optimizer_hand_off(opt, grads, NULL, NULL));
  }
  strata_step_report r = {.struct_size = sizeof(r)};
  CHECK_OK(strata_optimizer_finish_step(opt, &r));
  CHECK_OK(strata_step_end(engine));
  CHECK(r.struct_size == sizeof(r) && r.skipped == 0 && r.clip_coef == 1.0);
  return r;
}

/* Group g's first master weight. */
static float Master(strata_engine* engine, int32_t g) {
  strata_view* view = NULL;
  CHECK_OK(strata_group_fetch(engine, g, STRATA_TIER_HOST, kMaster, 0, &view));
  strata_tensor_info t = {.struct_size = sizeof(t)};
  CHECK_OK(strata_view_get_tensor(view, 0, &t));
  CHECK(t.role == STRATA_ROLE_MASTER && t.dtype == STRATA_DTYPE_FLOAT32);
  const float w = *(const float*)t.data;
  CHECK_OK(strata_view_release(view));
  return w;
}

/* AdamW's first step from zero with gradient 1 moves each weight by -lr;
 * then the step count, save, a second step, and load back. */
static void CheckSteps(const char* dir) {
  strata_engine* engine = Open();
  strata_optimizer* opt = Create(engine);
  CHECK(Step(engine, opt).step == 1);
  for (int32_t g = 0; g < GROUPS; ++g) {
    CHECK(fabs(Master(engine, g) + 1e-3) < 1e-7);
  }
  CHECK_OK(strata_optimizer_save(opt, dir, "scheduler at 1"));
  const float after_one = Master(engine, 0);
  CHECK(Step(engine, opt).step == 2);
  CHECK(Master(engine, 0) != after_one);
  char user_state[8];
  size_t needed = 0;
  CHECK_OK(
      strata_optimizer_load(opt, dir, user_state, sizeof(user_state), &needed));
  CHECK(needed == strlen("scheduler at 1") + 1);
  CHECK(strcmp(user_state, "schedul") == 0); /* cut, NUL-terminated */
  int64_t step = -1;
  CHECK_OK(strata_optimizer_get_step(opt, &step));
  CHECK(step == 1 && Master(engine, 0) == after_one);
  CHECK_OK(strata_optimizer_load(opt, dir, NULL, 0, &needed));
  CHECK_OK(strata_optimizer_set_step(opt, 7));
  CHECK_OK(strata_optimizer_get_step(opt, &step));
  CHECK(step == 7);
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_engine_close(engine));
  CHECK(strstr(strata_last_error(), "strata_optimizer_close") != NULL);
  CHECK_OK(strata_optimizer_close(opt));
  CHECK_OK(strata_engine_close(engine));
}

/* The whole buffer and one tensor's slice as DLPack, zero-copy. */
static void CheckExports(void) {
  strata_engine* engine = Open();
  strata_optimizer* opt = Create(engine);
  strata_step_hyper h;
  CHECK_OK(strata_step_hyper_init(&h));
  CHECK_OK(strata_optimizer_begin_step(opt, &h));
  strata_gradients* grads = NULL;
  CHECK_OK(strata_optimizer_acquire_gradients(opt, 2, &grads));
  strata_gradients_info info = {.struct_size = sizeof(info)};
  CHECK_OK(strata_gradients_get_info(grads, &info));
  CHECK(info.group == 2);
  DLManagedTensor* whole = NULL;
  CHECK_OK(strata_gradients_export_dlpack(grads, STRATA_WHOLE_BUFFER, &whole));
  CHECK(whole->dl_tensor.data == info.data && whole->dl_tensor.ndim == 1);
  CHECK(whole->dl_tensor.shape[0] * 2 == (int64_t)info.bytes);
  CHECK(whole->dl_tensor.dtype.code == kDLBfloat);
  whole->deleter(whole);
  DLManagedTensor* b = NULL;
  CHECK_OK(strata_gradients_export_dlpack(grads, 1, &b));
  strata_tensor_info t = {.struct_size = sizeof(t)};
  CHECK_OK(strata_gradients_get_tensor(grads, 1, &t));
  CHECK(b->dl_tensor.data == t.data && b->dl_tensor.shape[0] == ELEMENTS);
  b->deleter(b);
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_gradients_export_dlpack(grads, 2, &b));
  CHECK(strstr(strata_last_error(), "out of range") != NULL);
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_gradients_get_tensor(grads, -2, &t));
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_optimizer_close(opt));
  CHECK(strstr(strata_last_error(), "hand each off") != NULL);
  CHECK_OK(strata_optimizer_hand_off(opt, grads, NULL, NULL));
  CHECK_FAILS(STRATA_FAILED_PRECONDITION,
              strata_gradients_export_dlpack(grads, 0, &b));
  CHECK(strstr(strata_last_error(), "handed off already") != NULL);
  CHECK_OK(strata_optimizer_close(opt));
  CHECK_OK(strata_engine_close(engine));
}

static void CheckBadOptions(strata_engine* engine) {
  strata_optimizer* opt = NULL;
  strata_optimizer_options o;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_optimizer_options_init(NULL));
  CHECK_OK(strata_optimizer_options_init(&o));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_optimizer_create(NULL, &o, &opt));
  CHECK(strstr(strata_last_error(), "engine") != NULL);
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_optimizer_create(engine, NULL, &opt));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_optimizer_create(engine, &o, NULL));
  o.algo = 9;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_optimizer_create(engine, &o, &opt));
  CHECK(strstr(strata_last_error(), "algo is 9") != NULL);
  CHECK_OK(strata_optimizer_options_init(&o));
  o.mode = -1;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_optimizer_create(engine, &o, &opt));
  CHECK(strstr(strata_last_error(), "mode is -1") != NULL);
  CHECK_OK(strata_optimizer_options_init(&o));
  o.struct_size = sizeof(o) + 8;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_optimizer_create(engine, &o, &opt));
  CHECK(strstr(strata_last_error(), "struct_size") != NULL);
  CHECK_OK(strata_optimizer_options_init(&o));
  o.micro_batches = 0;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_optimizer_create(engine, &o, &opt));
  CHECK(opt == NULL);
}

static void CheckBadCalls(strata_optimizer* opt, strata_optimizer* other,
                          const char* ckpt) {
  strata_step_hyper h;
  CHECK_OK(strata_step_hyper_init(&h));
  h.loss_scale = 0;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_optimizer_begin_step(opt, &h));
  CHECK(strstr(strata_last_error(), "loss_scale") != NULL);
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_optimizer_begin_step(opt, NULL));
  CHECK_OK(strata_step_hyper_init(&h));
  CHECK_OK(strata_optimizer_begin_step(opt, &h));
  strata_gradients* grads = NULL;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_optimizer_acquire_gradients(opt, GROUPS, &grads));
  CHECK(strstr(strata_last_error(), "does not exist") != NULL);
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_optimizer_acquire_gradients(opt, 0, NULL));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_optimizer_acquire_gradients_filled(opt, 0, 2, &grads));
  CHECK(strstr(strata_last_error(),
               "fill is 2; use STRATA_GRADIENTS_ZEROED "
               "or STRATA_GRADIENTS_UNWRITTEN") != NULL);
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_optimizer_hand_off(
                  opt, (strata_gradients*)(uintptr_t)0x7fffffffff, NULL, NULL));
  CHECK(strstr(strata_last_error(), "is no gradient buffer handle") != NULL);
  for (int32_t g = GROUPS - 1; g >= 0; --g) {
    CHECK_OK(strata_optimizer_acquire_gradients(opt, g, &grads));
    CHECK_FAILS(STRATA_INVALID_ARGUMENT,
                strata_optimizer_hand_off(other, grads, NULL, NULL));
    CHECK(strstr(strata_last_error(), "another optimizer") != NULL);
    CHECK_OK(strata_optimizer_hand_off(opt, grads, NULL, NULL));
  }
  CHECK_FAILS(STRATA_FAILED_PRECONDITION,
              strata_optimizer_hand_off(opt, grads, NULL, NULL));
  strata_step_report r = {.struct_size = 4};
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_optimizer_finish_step(opt, &r));
  CHECK(strstr(strata_last_error(), "sizeof(strata_step_report)") != NULL);
  r.struct_size = sizeof(r); /* the step was not lost */
  CHECK_OK(strata_optimizer_finish_step(opt, &r));
  CHECK(r.step == 1);
  CHECK_FAILS(STRATA_FAILED_PRECONDITION,
              strata_optimizer_finish_step(opt, &r));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_optimizer_get_step(opt, NULL));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_optimizer_set_step(opt, -1));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_optimizer_save(opt, ckpt, NULL));
  size_t needed = 0;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_optimizer_load(opt, ckpt, NULL, 4, &needed));
  CHECK(strstr(strata_last_error(), "user_state_buf") != NULL);
  CHECK_FAILS(STRATA_NOT_FOUND, strata_optimizer_load(opt, "/nonexistent/ckpt",
                                                      NULL, 0, &needed));
}

static void CheckMisuse(const char* ckpt) {
  strata_engine* engine = Open();
  strata_engine* second = Open();
  CheckBadOptions(engine);
  strata_optimizer* opt = Create(engine);
  strata_optimizer* other = Create(second);
  CheckBadCalls(opt, other, ckpt);
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_optimizer_close(NULL));
  CHECK_OK(strata_optimizer_close(other));
  CHECK_OK(strata_optimizer_close(opt));
  CHECK_OK(strata_engine_close(second));
  CHECK_OK(strata_engine_close(engine));
}

int main(void) {
  MakeScratch();
  char ckpt[sizeof(scratch) + 8];
  snprintf(ckpt, sizeof(ckpt), "%s/ckpt", scratch);
  CheckSteps(ckpt);
  CheckExports();
  CheckMisuse(ckpt);
  printf("optim_test: all checks passed\n");
  return 0;
}
