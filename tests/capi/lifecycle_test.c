/* The C ABI end to end, compiled as C: open a host-emulated engine with
 * small budgets and an NVMe tier, register groups homed on NVMe, write a
 * pattern through device views, evict it down to NVMe, read it back through
 * the device and the host and compare every byte; steps, stats, explain,
 * DLPack export, a checkpoint saved and loaded into another placement, and
 * the error paths. Exits 0 on success, 1 with a message
 * naming the failed check otherwise. */
#define _XOPEN_SOURCE 700

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "strata/strata.h"
#include "tests/capi/c_check.h"
#include "tests/capi/c_scratch.h"

#ifdef __cplusplus
#error "lifecycle_test.c tests the C ABI and must be compiled as C"
#endif

#define KIB 1024ull
#define MIB (1024ull * 1024ull)
#define NUM_GROUPS 6
#define NUM_TENSORS 3
/* Group HOST_GROUP homes its compute copy on the host instead. */
#define HOST_GROUP 2

static const char* const kNames[NUM_TENSORS] = {"w", "b", "n"};
static const int64_t kShapeW[2] = {128, 256};
static const int64_t kShapeB[1] = {128};
static const int64_t kShapeN[2] = {3, 5};

static uint64_t Elements(const int64_t* shape, int32_t ndim) {
  uint64_t n = 1;
  for (int32_t d = 0; d < ndim; ++d) n *= (uint64_t)shape[d];
  return n;
}

static size_t DTypeSize(int32_t dtype) {
  return dtype == STRATA_DTYPE_FLOAT32 ? 4 : 2;
}

/* The byte at `offset` of (group, tensor name, role): differs between
 * groups, tensors and roles so that a misplaced chunk shows. */
static uint8_t Pattern(int32_t group, const char* name, int32_t role,
                       uint64_t offset) {
  uint32_t x = (uint32_t)(group * 131 + name[0] * 31 + role * 7) * 2654435761u;
  x ^= (uint32_t)offset * 40503u;
  return (uint8_t)(x >> 13);
}

static int32_t Register(strata_engine* engine, int32_t index) {
  char name[32];
  snprintf(name, sizeof(name), "layer.%d", index);
  const uint32_t both = STRATA_ROLE_BIT(STRATA_ROLE_COMPUTE) |
                        STRATA_ROLE_BIT(STRATA_ROLE_MASTER);
  strata_tensor_spec tensors[NUM_TENSORS] = {
      {kNames[0], kShapeW, 2, STRATA_DTYPE_BFLOAT16, both, 0},
      {kNames[1], kShapeB, 1, STRATA_DTYPE_FLOAT32, both, 0},
      {kNames[2], kShapeN, 2, STRATA_DTYPE_FLOAT16,
       STRATA_ROLE_BIT(STRATA_ROLE_COMPUTE), 0},
  };
  strata_group_spec spec;
  CHECK_OK(strata_group_spec_init(&spec));
  spec.name = name;
  spec.tensors = tensors;
  spec.num_tensors = NUM_TENSORS;
  if (index == HOST_GROUP) {
    spec.use_default_placement = 0;
    spec.home[STRATA_ROLE_COMPUTE] = STRATA_TIER_HOST;
    spec.home[STRATA_ROLE_MASTER] = STRATA_TIER_NVME;
  }
  int32_t id = -1;
  CHECK_OK(strata_group_register(engine, &spec, &id));
  return id;
}

/* Checks every tensor's metadata and either writes the pattern or checks
 * that the memory holds it (or zeros, for a chunk never written). */
enum Mode { kWrite, kVerify, kZeros };

static void VisitTensors(strata_view* view, int32_t tier, enum Mode mode) {
  int32_t group = -1, view_tier = -1, count = 0;
  CHECK_OK(strata_view_get_group(view, &group, &view_tier));
  CHECK(view_tier == tier);
  CHECK_OK(strata_view_count_tensors(view, &count));
  CHECK(count > 0);
  for (int32_t i = 0; i < count; ++i) {
    strata_tensor_info info;
    info.struct_size = sizeof(info);
    CHECK_OK(strata_view_get_tensor(view, i, &info));
    CHECK(info.struct_size == sizeof(info));
    CHECK(info.tier == tier && info.on_cuda == 0 && info.data != NULL);
    CHECK(info.bytes ==
          Elements(info.shape, info.ndim) * DTypeSize(info.dtype));
    CHECK(info.role == STRATA_ROLE_COMPUTE ||
          info.dtype == STRATA_DTYPE_FLOAT32);
    int32_t found = -1;
    CHECK_OK(strata_view_find_tensor(view, info.name, info.role, &found));
    CHECK(found == i);
    uint8_t* bytes = (uint8_t*)info.data;
    for (uint64_t b = 0; b < info.bytes; ++b) {
      const uint8_t want = Pattern(group, info.name, info.role, b);
      if (mode == kWrite) {
        bytes[b] = want;
      } else if (bytes[b] != (mode == kZeros ? 0 : want)) {
        fprintf(stderr, "group %d tensor %s role %d tier %d byte %llu: %u\n",
                group, info.name, info.role, tier, (unsigned long long)b,
                bytes[b]);
        CHECK(!"bytes differ from the pattern");
      }
    }
  }
}

static void FetchAll(strata_engine* engine, int32_t tier, int32_t write,
                     enum Mode mode) {
  for (int32_t g = 0; g < NUM_GROUPS; ++g) {
    strata_view* view = NULL;
    CHECK_OK(
        strata_group_fetch(engine, g, tier, STRATA_ALL_ROLES, write, &view));
    VisitTensors(view, tier, mode);
    CHECK_OK(strata_view_release(view));
  }
}

static strata_engine* OpenEngine(void) {
  strata_engine_options options;
  CHECK_OK(strata_engine_options_init(&options));
  CHECK(options.struct_size == sizeof(options));
  options.device = STRATA_DEVICE_HOST;
  options.device_budget = 1 * MIB;
  options.host_budget = 2 * MIB;
  options.nvme_budget = 8 * MIB;
  options.swap_dir = scratch;
  options.swap_files = 2;
  options.io_threads = 2;
  options.home[STRATA_ROLE_COMPUTE] = STRATA_TIER_NVME;
  options.home[STRATA_ROLE_MASTER] = STRATA_TIER_NVME;
  strata_engine* engine = NULL;
  CHECK_OK(strata_engine_open(&options, &engine));
  CHECK(engine != NULL);

  strata_engine_info info;
  info.struct_size = sizeof(info);
  CHECK_OK(strata_engine_get_info(engine, &info));
  CHECK(info.on_cuda == 0 && strcmp(info.device, "cuda") != 0);
  CHECK(info.aio_backend != NULL && info.aio_backend[0] != '\0');
  return engine;
}

static void CheckExplain(strata_engine* engine) {
  size_t required = 0;
  CHECK_OK(strata_engine_explain(engine, NULL, 0, &required));
  CHECK(required > 1); /* a plan exists once a step has ended */
  char* text = malloc(required);
  CHECK(text != NULL);
  size_t again = 0;
  CHECK_OK(strata_engine_explain(engine, text, required, &again));
  CHECK(again == required && strlen(text) == required - 1);
  char small[8];
  CHECK_OK(strata_engine_explain(engine, small, sizeof(small), &again));
  CHECK(again == required && strlen(small) == sizeof(small) - 1);
  CHECK(memcmp(small, text, sizeof(small) - 1) == 0);
  free(text);
}

static void CheckStats(strata_engine* engine) {
  strata_engine_stats stats;
  stats.struct_size = sizeof(stats);
  CHECK_OK(strata_engine_get_stats(engine, &stats));
  CHECK(stats.struct_size == sizeof(stats));
  CHECK(stats.tiers[STRATA_TIER_DEVICE].budget == 1 * MIB);
  CHECK(stats.tiers[STRATA_TIER_HOST].budget == 2 * MIB);
  CHECK(stats.tiers[STRATA_TIER_NVME].budget == 8 * MIB);
  for (int t = 0; t < STRATA_NUM_TIERS; ++t) {
    CHECK(stats.tiers[t].peak <= stats.tiers[t].budget);
    CHECK(stats.tiers[t].used <= stats.tiers[t].peak);
  }
  /* Written on the device, evicted to NVMe, read back through the host. */
  CHECK(stats.bytes[STRATA_TIER_DEVICE][STRATA_TIER_HOST] > 0);
  CHECK(stats.bytes[STRATA_TIER_HOST][STRATA_TIER_NVME] > 0);
  CHECK(stats.bytes[STRATA_TIER_NVME][STRATA_TIER_HOST] > 0);
  CHECK(stats.bytes[STRATA_TIER_HOST][STRATA_TIER_DEVICE] > 0);
  CHECK(stats.evictions > 0 && stats.writebacks > 0);
  CHECK(stats.fetches >= 4 * NUM_GROUPS && stats.steps == 2);
  CHECK(stats.update_wait_seconds == 0); /* no optimizer */
  /* A caller built against the first layout (up to stall_seconds) gets it
   * filled, and nothing past it. */
  strata_engine_stats v1;
  memset(&v1, 0xab, sizeof(v1));
  v1.struct_size = offsetof(strata_engine_stats, update_wait_seconds);
  CHECK_OK(strata_engine_get_stats(engine, &v1));
  CHECK(v1.steps == 2 && v1.stall_seconds == stats.stall_seconds);
  const unsigned char* tail = (const unsigned char*)&v1.update_wait_seconds;
  CHECK(tail[0] == 0xab && tail[sizeof(double) - 1] == 0xab);
}

/* Drops every copy above the homes: everything but HOST_GROUP's compute
 * copy goes down to NVMe. */
static void EvictToHomes(strata_engine* engine) {
  for (int32_t g = 0; g < NUM_GROUPS; ++g) {
    CHECK_OK(strata_group_evict(engine, g, STRATA_TIER_DEVICE));
    if (g != HOST_GROUP) {
      CHECK_OK(strata_group_evict(engine, g, STRATA_TIER_HOST));
    }
  }
  CHECK_OK(strata_engine_drain(engine));
}

static void CheckRoleSubset(strata_engine* engine) {
  strata_view* view = NULL;
  CHECK_OK(strata_group_fetch(engine, 1, STRATA_TIER_HOST,
                              STRATA_ROLE_BIT(STRATA_ROLE_MASTER), 0, &view));
  int32_t count = 0, index = -1;
  CHECK_OK(strata_view_count_tensors(view, &count));
  CHECK(count == 2); /* w and b have master copies, n does not */
  VisitTensors(view, STRATA_TIER_HOST, kVerify);
  CHECK_FAILS(STRATA_NOT_FOUND,
              strata_view_find_tensor(view, "w", STRATA_ROLE_COMPUTE, &index));
  CHECK(index == -1);
  CHECK_OK(strata_view_release(view));
}

static void CheckDLPack(strata_engine* engine) {
  strata_view* view = NULL;
  CHECK_OK(strata_group_fetch(engine, 0, STRATA_TIER_DEVICE, STRATA_ALL_ROLES,
                              0, &view));
  int32_t index = -1;
  CHECK_OK(strata_view_find_tensor(view, "w", STRATA_ROLE_COMPUTE, &index));
  strata_tensor_info info;
  info.struct_size = sizeof(info);
  CHECK_OK(strata_view_get_tensor(view, index, &info));
  DLManagedTensor* managed = NULL;
  CHECK_OK(strata_view_export_dlpack(view, index, &managed));
  const DLTensor* t = &managed->dl_tensor;
  CHECK(t->data == info.data && t->byte_offset == 0);
  CHECK(t->device.device_type == kDLCPU && t->device.device_id == 0);
  CHECK(t->dtype.code == kDLBfloat && t->dtype.bits == 16 &&
        t->dtype.lanes == 1);
  CHECK(t->ndim == 2 && t->shape[0] == 128 && t->shape[1] == 256);
  CHECK(t->strides[0] == 256 && t->strides[1] == 1);
  managed->deleter(managed);

  CHECK_OK(strata_view_find_tensor(view, "b", STRATA_ROLE_MASTER, &index));
  CHECK_OK(strata_view_export_dlpack(view, index, &managed));
  CHECK(managed->dl_tensor.dtype.code == kDLFloat &&
        managed->dl_tensor.dtype.bits == 32 && managed->dl_tensor.ndim == 1);
  CHECK_OK(strata_view_release(view));
  managed->deleter(managed); /* after the release: frees only the struct */
}

/* On a GPU, a device view is CUDA memory and exports as kDLCUDA. Without
 * one the engine refuses STRATA_DEVICE_CUDA, and this says so. */
static void CheckCudaExport(void) {
  strata_engine_options options;
  CHECK_OK(strata_engine_options_init(&options));
  options.device = STRATA_DEVICE_CUDA;
  options.device_budget = 1 * MIB;
  options.host_budget = 2 * MIB;
  strata_engine* engine = NULL;
  if (strata_engine_open(&options, &engine) != STRATA_OK) {
    printf("note: kDLCUDA export not checked: %s\n", strata_last_error());
    return;
  }
  CHECK(Register(engine, 0) == 0);
  strata_view* view = NULL;
  CHECK_OK(strata_group_fetch(engine, 0, STRATA_TIER_DEVICE, STRATA_ALL_ROLES,
                              0, &view));
  strata_tensor_info info;
  info.struct_size = sizeof(info);
  CHECK_OK(strata_view_get_tensor(view, 0, &info));
  CHECK(info.on_cuda == 1);
  DLManagedTensor* managed = NULL;
  CHECK_OK(strata_view_export_dlpack(view, 0, &managed));
  CHECK(managed->dl_tensor.device.device_type == kDLCUDA);
  CHECK(managed->dl_tensor.device.device_id == options.cuda_device);
  CHECK(managed->dl_tensor.data == info.data);
  managed->deleter(managed);
  CHECK_OK(strata_view_release(view));
  CHECK_OK(strata_engine_close(engine));
}

/* Opens a host engine of `format` with one group, a bf16 tensor of
 * `elements` with every role, and checks its state1 view: `dtype` and
 * `bytes`. */
static void CheckStateView(uint32_t options_size, int32_t format,
                           int64_t elements, int32_t dtype, uint64_t bytes) {
  strata_engine_options options;
  CHECK_OK(strata_engine_options_init(&options));
  options.struct_size = options_size;
  options.device = STRATA_DEVICE_HOST;
  options.device_budget = 1 * MIB;
  options.host_budget = 2 * MIB;
  options.state_format = format;
  strata_engine* engine = NULL;
  CHECK_OK(strata_engine_open(&options, &engine));
  strata_tensor_spec tensor = {
      "w", &elements, 1, STRATA_DTYPE_BFLOAT16, STRATA_ALL_ROLES, 0};
  strata_group_spec spec;
  CHECK_OK(strata_group_spec_init(&spec));
  spec.name = "layer";
  spec.tensors = &tensor;
  spec.num_tensors = 1;
  int32_t id = -1;
  CHECK_OK(strata_group_register(engine, &spec, &id));
  strata_view* view = NULL;
  CHECK_OK(strata_group_fetch(engine, id, STRATA_TIER_HOST,
                              STRATA_ROLE_BIT(STRATA_ROLE_STATE1), 0, &view));
  strata_tensor_info info;
  info.struct_size = sizeof(info);
  CHECK_OK(strata_view_get_tensor(view, 0, &info));
  CHECK(info.role == STRATA_ROLE_STATE1 && info.dtype == dtype &&
        info.bytes == bytes);
  DLManagedTensor* managed = NULL;
  CHECK_OK(strata_view_export_dlpack(view, 0, &managed));
  CHECK(managed->dl_tensor.dtype.bits == (dtype == STRATA_DTYPE_UINT8 ? 8
                                          : dtype == STRATA_DTYPE_FLOAT32
                                              ? 32
                                              : 16));
  managed->deleter(managed);
  CHECK_OK(strata_view_release(view));
  CHECK_OK(strata_engine_close(engine));
}

/* The state roles are stored in the engine's strata_state_format: bf16
 * views are 2 bytes an element, int8 ones bytes (codes and a scale per
 * 256 elements); a value outside the enum is refused at open. */
static void CheckStateFormat(void) {
  strata_engine_options options;
  CHECK_OK(strata_engine_options_init(&options));
  CHECK(options.state_format == STRATA_STATE_FP32);
  options.device = STRATA_DEVICE_HOST;
  options.device_budget = 1 * MIB;
  options.host_budget = 2 * MIB;
  options.state_format = 7;
  strata_engine* engine = NULL;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_engine_open(&options, &engine));
  CHECK(strstr(strata_last_error(), "strata_state_format") != NULL);
  CheckStateView(sizeof(options), STRATA_STATE_BF16, 1000,
                 STRATA_DTYPE_BFLOAT16, 2000);
  CheckStateView(sizeof(options), STRATA_STATE_INT8, 5000, STRATA_DTYPE_UINT8,
                 20 * 260);
  /* A caller built against the first layout has no state_format: what
   * lies past its struct_size (here an invalid format) is not read, and
   * the state is fp32. */
  CheckStateView(offsetof(strata_engine_options, state_format), 7, 1000,
                 STRATA_DTYPE_FLOAT32, 4000);
}

static void* FailInThread(void* arg) {
  (void)arg;
  if (strata_last_error()[0] != '\0') return "inherited another thread's error";
  if (strata_engine_close(NULL) != STRATA_INVALID_ARGUMENT) return "no error";
  if (strstr(strata_last_error(), "engine") == NULL) return "wrong message";
  return NULL;
}

static void CheckErrors(strata_engine* engine) {
  strata_view* view = NULL;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_group_fetch(engine, -1, STRATA_TIER_DEVICE,
                                 STRATA_ALL_ROLES, 0, &view));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_group_fetch(engine, NUM_GROUPS, STRATA_TIER_DEVICE,
                                 STRATA_ALL_ROLES, 0, &view));
  CHECK(strstr(strata_last_error(), "strata_group_fetch") != NULL);
  CHECK(strstr(strata_last_error(), "group 6") != NULL);
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_group_fetch(engine, 0, 3, STRATA_ALL_ROLES, 0, &view));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_group_fetch(engine, 0, STRATA_TIER_NVME, STRATA_ALL_ROLES,
                                 0, &view));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_group_fetch(engine, 0, STRATA_TIER_HOST, 0, 0, &view));
  CHECK_FAILS(
      STRATA_INVALID_ARGUMENT,
      strata_group_fetch(engine, 0, STRATA_TIER_HOST, 1u << 9, 0, &view));
  CHECK(view == NULL); /* out parameters stay untouched on failure */
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_group_fetch(NULL, 0, STRATA_TIER_HOST, STRATA_ALL_ROLES, 0,
                                 &view));
  CHECK(strstr(strata_last_error(), "'engine'") != NULL);
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_group_fetch(engine, 0, STRATA_TIER_HOST, STRATA_ALL_ROLES,
                                 0, NULL));
  CHECK(strstr(strata_last_error(), "'view'") != NULL);
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_engine_open(NULL, NULL));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_engine_options_init(NULL));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_view_release(NULL));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_step_end(NULL));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_engine_get_stats(engine, NULL));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_group_evict(engine, 99, STRATA_TIER_HOST));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_group_prefetch(engine, 0, -1, STRATA_ALL_ROLES));
  size_t required = 0;
  char buffer[4];
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_engine_explain(engine, NULL, sizeof(buffer), &required));

  strata_engine_options options;
  CHECK_OK(strata_engine_options_init(&options));
  options.struct_size = 8;
  strata_engine* other = NULL;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_engine_open(&options, &other));
  CHECK(strstr(strata_last_error(), "struct_size") != NULL);
  CHECK(other == NULL);

  strata_group_spec spec;
  CHECK_OK(strata_group_spec_init(&spec));
  int32_t id = -1, count = 0;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_group_register(engine, &spec, &id)); /* no name */
  /* 4 MiB of fp32 can never fit the 1 MiB device budget. */
  static const int64_t kHuge[2] = {1024, 1024};
  strata_tensor_spec huge = {"huge",
                             kHuge,
                             2,
                             STRATA_DTYPE_FLOAT32,
                             STRATA_ROLE_BIT(STRATA_ROLE_COMPUTE),
                             0};
  spec.name = "too.big";
  spec.tensors = &huge;
  spec.num_tensors = 1;
  CHECK(strata_group_register(engine, &spec, &id) != STRATA_OK);
  CHECK(strata_last_error()[0] != '\0' && id == -1);
  CHECK_OK(strata_group_count(engine, &count));
  CHECK(count == NUM_GROUPS);

  /* A close with an unreleased view fails and closes nothing. */
  CHECK_OK(strata_group_fetch(engine, 0, STRATA_TIER_HOST, STRATA_ALL_ROLES, 0,
                              &view));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_view_get_tensor(view, 99, NULL));
  strata_tensor_info info;
  info.struct_size = sizeof(info);
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_view_get_tensor(view, 99, &info));
  DLManagedTensor* managed = NULL;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_view_export_dlpack(view, -1, &managed));
  CHECK_FAILS(STRATA_FAILED_PRECONDITION,
              strata_group_evict(engine, 0, STRATA_TIER_HOST));
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_engine_close(engine));
  CHECK_OK(strata_view_release(view));

  /* The last error is per thread. */
  char before[256];
  snprintf(before, sizeof(before), "%s", strata_last_error());
  pthread_t thread;
  void* why = NULL;
  CHECK(pthread_create(&thread, NULL, FailInThread, NULL) == 0);
  CHECK(pthread_join(thread, &why) == 0);
  if (why != NULL) Die(__FILE__, __LINE__, (const char*)why, STRATA_OK);
  CHECK(strcmp(before, strata_last_error()) == 0);
}

/* Saves the engine's groups with a user state, loads them into a second
 * engine that homes every role on the host, and checks every byte and the
 * state; then the error paths. */
static void CheckCheckpoint(strata_engine* engine) {
  static const char kState[] = "{\"step\": 2, \"lr\": 0.001}";
  char dir[4200], swap[4200], state[64];
  snprintf(dir, sizeof(dir), "%s/ckpt", scratch);
  snprintf(swap, sizeof(swap), "%s/swap2", scratch);
  CHECK(mkdir(swap, 0755) == 0);
  CHECK_OK(strata_engine_save(engine, dir, kState));
  CHECK_OK(strata_checkpoint_verify(dir));

  strata_engine_options options;
  CHECK_OK(strata_engine_options_init(&options));
  options.device = STRATA_DEVICE_HOST;
  options.device_budget = 1 * MIB;
  options.host_budget = 4 * MIB;
  options.nvme_budget = 8 * MIB; /* HOST_GROUP's master stays on NVMe */
  options.swap_dir = swap;
  strata_engine* other = NULL;
  CHECK_OK(strata_engine_open(&options, &other));
  for (int32_t g = 0; g < NUM_GROUPS; ++g) CHECK(Register(other, g) == g);
  FetchAll(other, STRATA_TIER_HOST, 0, kZeros);

  size_t needed = 0;
  CHECK_OK(strata_engine_load(other, dir, state, 5, &needed));
  CHECK(needed == sizeof(kState) && strcmp(state, "{\"st") == 0);
  CHECK_OK(strata_engine_load(other, dir, NULL, 0, &needed));
  CHECK_OK(strata_engine_load(other, dir, state, sizeof(state), &needed));
  CHECK(needed == sizeof(kState) && strcmp(state, kState) == 0);
  FetchAll(other, STRATA_TIER_HOST, 0, kVerify);

  char missing[4200];
  snprintf(missing, sizeof(missing), "%s/no-such-ckpt", scratch);
  needed = 0;
  CHECK_FAILS(STRATA_NOT_FOUND, strata_engine_load(other, missing, state,
                                                   sizeof(state), &needed));
  CHECK(needed == 0 && strstr(strata_last_error(), "no-such-ckpt") != NULL);
  CHECK_FAILS(STRATA_NOT_FOUND, strata_checkpoint_verify(missing));
  CHECK(strstr(strata_last_error(), "no-such-ckpt") != NULL);
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_checkpoint_verify(NULL));
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_engine_load(other, dir, NULL, 4, &needed));
  CHECK(strstr(strata_last_error(), "'user_state_buf'") != NULL);
  CHECK_FAILS(STRATA_INVALID_ARGUMENT, strata_engine_save(other, NULL, ""));
  CHECK(strstr(strata_last_error(), "'dir'") != NULL);
  strata_view* view = NULL;
  CHECK_OK(strata_group_fetch(other, 1, STRATA_TIER_HOST, STRATA_ALL_ROLES, 0,
                              &view));
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_engine_save(other, dir, ""));
  CHECK(strstr(strata_last_error(), "layer.1") != NULL);
  CHECK_OK(strata_view_release(view));
  CHECK_OK(strata_engine_close(other));
}

int main(void) {
  MakeScratch();
  int32_t major = -1, minor = -1, patch = -1;
  CHECK_OK(strata_version_get(&major, &minor, &patch));
  CHECK(major == STRATA_VERSION_MAJOR && minor == STRATA_VERSION_MINOR &&
        patch == STRATA_VERSION_PATCH);
  CHECK(strcmp(strata_status_name(STRATA_OK), "OK") == 0);
  CHECK(strcmp(strata_status_name(STRATA_DATA_LOSS), "data loss") == 0);
  CHECK(strcmp(strata_last_error(), "") == 0);

  strata_engine* engine = OpenEngine();
  for (int32_t g = 0; g < NUM_GROUPS; ++g) CHECK(Register(engine, g) == g);
  int32_t count = 0;
  CHECK_OK(strata_group_count(engine, &count));
  CHECK(count == NUM_GROUPS);
  uint64_t device_bytes = 0;
  CHECK_OK(
      strata_group_get_bytes(engine, 0, STRATA_TIER_DEVICE, &device_bytes));
  CHECK(device_bytes >= 192 * KIB + 1 * KIB + 30);

  /* Step 1: new chunks read as zeros; write the pattern on the device. The
   * groups together exceed the device budget, so the device evicts. */
  CHECK_OK(strata_step_begin(engine));
  for (int32_t g = 0; g < NUM_GROUPS; ++g) {
    strata_view* view = NULL;
    CHECK_OK(strata_group_fetch(engine, g, STRATA_TIER_DEVICE, STRATA_ALL_ROLES,
                                1, &view));
    VisitTensors(view, STRATA_TIER_DEVICE, kZeros);
    VisitTensors(view, STRATA_TIER_DEVICE, kWrite);
    CHECK_OK(strata_view_release(view));
  }
  CHECK_OK(strata_step_end(engine));
  CheckExplain(engine);
  EvictToHomes(engine);

  /* Step 2: the same order, read-only, back from NVMe; then via the host. */
  CHECK_OK(strata_step_begin(engine));
  FetchAll(engine, STRATA_TIER_DEVICE, 0, kVerify);
  CHECK_OK(strata_step_end(engine));
  EvictToHomes(engine);
  FetchAll(engine, STRATA_TIER_HOST, 0, kVerify);
  CHECK_OK(
      strata_group_prefetch(engine, 3, STRATA_TIER_DEVICE, STRATA_ALL_ROLES));
  CHECK_OK(strata_engine_drain(engine));
  CheckStats(engine);
  CheckRoleSubset(engine);
  CheckDLPack(engine);
  CheckErrors(engine);
  CheckCheckpoint(engine);
  CHECK_OK(strata_engine_close(engine));
  CheckCudaExport();
  CheckStateFormat();
  printf("capi_lifecycle_test: OK\n");
  return 0;
}
