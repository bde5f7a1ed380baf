/* examples/train_c.c: training through strata's C ABI alone (strata.h),
 * as a framework in C would embed strata: a linear least-squares fit
 * y = W x + b with AdamW, its optimizer state on NVMe.
 *
 * What it shows, in order:
 * - an engine on the host-emulated device that holds only the compute
 *   copies (device_roles), with the master, both AdamW moments and the
 *   gradient accumulator homed in swap files under the directory given;
 * - one group of two fp32 tensors (W and b), its initial weights written
 *   into the compute copy only (the master takes their exact widening
 *   before the first step; STRATA_ROLE_MASTER in strata.h);
 * - each step: the compute copy fetched to the device for reading (host
 *   memory here), the gradients written into the buffer the optimizer
 *   lends (strata_gradients_get_tensor's data) and handed off with NULL
 *   fences (the host-emulated device: the work is done when strata is
 *   called), then finish_step;
 * - strata_optimizer_save after RESUME_AT steps, everything closed, a new
 *   engine and optimizer opened, strata_optimizer_load, and the rest;
 * - the final weights compared, bit for bit, with a reference AdamW in C
 *   written from include/strata/cpu_adam.h. That comparison needs the
 *   reference compiled without fused multiply-adds, as cpu_adam is:
 *   -ffp-contract=off (GCC contracts a * b + c by default where the target
 *   has FMA).
 * Every call is checked; a failure prints strata_last_error() and exits 1
 * (strata removes the swap files it left at the next open of the
 * directory).
 *
 *   gcc -std=c11 -O2 -ffp-contract=off -Iinclude examples/train_c.c \
 *       -Lbuild/lib -lstrata -lm -Wl,-rpath,$PWD/build/lib -o train_c
 *   mkdir -p /mnt/nvme/swap && ./train_c /mnt/nvme/swap
 *
 * The directory must exist (the swap files use O_DIRECT where its file
 * system allows it); the checkpoint goes to <dir>/checkpoint. Exits 0 when
 * the weights match. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/strata.h"

#define IN 8       /* features */
#define OUT 3      /* outputs */
#define SAMPLES 64 /* the whole data set, one batch */
#define STEPS 12
#define RESUME_AT 5

/* AdamW's hyperparameters, the same every step. */
static const double kLr = 1e-2;
static const double kBeta1 = 0.9;
static const double kBeta2 = 0.999;
static const double kEps = 1e-8;
static const double kWeightDecay = 0.1;

/* The model's parameters, in the group's tensor order. */
typedef struct Params {
  float w[OUT * IN]; /* row-major (OUT, IN) */
  float b[OUT];
} Params;

typedef struct Data {
  float x[SAMPLES][IN];
  float y[SAMPLES][OUT];
} Data;

/* ---- Errors ---------------------------------------------------------- */

static void Fail(const char* call, strata_status status, int line) {
  fprintf(stderr, "train_c.c:%d: %s failed: %s: %s\n", line, call,
          strata_status_name(status), strata_last_error());
  exit(1);
}

/* Every strata call goes through CHECK. */
#define CHECK(call)                                           \
  do {                                                        \
    strata_status status_ = (call);                           \
    if (status_ != STRATA_OK) Fail(#call, status_, __LINE__); \
  } while (0)

static void Require(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "train_c: %s\n", what);
    exit(1);
  }
}

/* ---- The problem ----------------------------------------------------- */

/* A uniform number in [-1, 1) from a 32-bit LCG (the same on every libc). */
static float Uniform(uint32_t* state) {
  *state = *state * 1664525u + 1013904223u;
  return (float)(*state >> 8) / 8388608.0f - 1.0f;
}

/* Targets of a random linear map plus offset, on random inputs. */
static void MakeData(Data* d) {
  uint32_t rng = 12345;
  float w[OUT][IN], b[OUT];
  for (int o = 0; o < OUT; ++o) {
    for (int i = 0; i < IN; ++i) w[o][i] = Uniform(&rng);
    b[o] = Uniform(&rng);
  }
  for (int s = 0; s < SAMPLES; ++s) {
    for (int i = 0; i < IN; ++i) d->x[s][i] = Uniform(&rng);
    for (int o = 0; o < OUT; ++o) {
      float y = b[o];
      for (int i = 0; i < IN; ++i) y += w[o][i] * d->x[s][i];
      d->y[s][o] = y;
    }
  }
}

/* Small random weights and zero biases. */
static void InitialWeights(Params* p) {
  uint32_t rng = 777;
  for (int k = 0; k < OUT * IN; ++k) p->w[k] = 0.1f * Uniform(&rng);
  for (int o = 0; o < OUT; ++o) p->b[o] = 0.0f;
}

/* The loss, mean over samples of |W x + b - y|^2 / 2, and its gradients
 * with respect to w (OUT * IN) and b (OUT), written to gw and gb. */
static float LossAndGradients(const Data* d, const float* w, const float* b,
                              float* gw, float* gb) {
  const float inv_n = 1.0f / SAMPLES;
  float loss = 0.0f;
  memset(gw, 0, sizeof(float) * OUT * IN);
  memset(gb, 0, sizeof(float) * OUT);
  for (int s = 0; s < SAMPLES; ++s) {
    for (int o = 0; o < OUT; ++o) {
      float r = b[o] - d->y[s][o];
      for (int i = 0; i < IN; ++i) r += w[o * IN + i] * d->x[s][i];
      loss += 0.5f * r * r;
      gb[o] += r * inv_n;
      for (int i = 0; i < IN; ++i) {
        gw[o * IN + i] += r * inv_n * d->x[s][i];
      }
    }
  }
  return loss * inv_n;
}

/* ---- The reference: AdamW as include/strata/cpu_adam.h states it ----- */

/* One AdamW step (t is 1-based) of n elements in place: the step scalars
 * computed in double and rounded to fp32 once, then fp32 operations in
 * torch 1.13's order, bias-corrected sqrt(v) multiplied by
 * 1 / sqrt(1 - beta2^t), weight decay decoupled. */
static void ReferenceAdamW(float* p, const float* g, float* m, float* v, int n,
                           int64_t t) {
  const float decay = (float)(1.0 - kLr * kWeightDecay);
  const float beta1 = (float)kBeta1, one_minus_beta1 = (float)(1.0 - kBeta1);
  const float beta2 = (float)kBeta2, one_minus_beta2 = (float)(1.0 - kBeta2);
  const float neg_lr = (float)(-(kLr / (1.0 - pow(kBeta1, (double)t))));
  const float inv_bc2_sqrt = (float)(1.0 / sqrt(1.0 - pow(kBeta2, (double)t)));
  const float eps = (float)kEps;
  for (int i = 0; i < n; ++i) {
    const float decayed = p[i] * decay;
    m[i] = m[i] * beta1 + one_minus_beta1 * g[i];
    v[i] = v[i] * beta2 + (one_minus_beta2 * g[i]) * g[i];
    const float denom = sqrtf(v[i]) * inv_bc2_sqrt + eps;
    p[i] = decayed + (neg_lr * m[i]) / denom;
  }
}

/* STEPS steps of the same training, without strata. */
static void ReferenceRun(const Data* d, Params* p) {
  Params g, m, v;
  memset(&m, 0, sizeof(m));
  memset(&v, 0, sizeof(v));
  InitialWeights(p);
  for (int64_t t = 1; t <= STEPS; ++t) {
    LossAndGradients(d, p->w, p->b, g.w, g.b);
    ReferenceAdamW(p->w, g.w, m.w, v.w, OUT * IN, t);
    ReferenceAdamW(p->b, g.b, m.b, v.b, OUT, t);
  }
}

/* ---- strata ---------------------------------------------------------- */

static const uint32_t kCompute = STRATA_ROLE_BIT(STRATA_ROLE_COMPUTE);

/* A host-emulated engine whose device holds only compute copies, every
 * other role homed on NVMe under swap_dir, and the group "linear" (id 0):
 * w (OUT, IN) and b (OUT), fp32, with every role. */
static strata_engine* OpenEngine(const char* swap_dir) {
  strata_engine_options options;
  CHECK(strata_engine_options_init(&options));
  options.device = STRATA_DEVICE_HOST;
  options.device_budget = 1u << 20;
  options.host_budget = 8u << 20;
  options.nvme_budget = 16u << 20;
  options.swap_dir = swap_dir;
  options.io_threads = 1;
  for (int role = STRATA_ROLE_MASTER; role < STRATA_NUM_ROLES; ++role) {
    options.home[role] = STRATA_TIER_NVME;
  }
  options.device_roles = kCompute;
  strata_engine* engine = NULL;
  CHECK(strata_engine_open(&options, &engine));
  static const int64_t shape_w[2] = {OUT, IN};
  static const int64_t shape_b[1] = {OUT};
  const strata_tensor_spec tensors[2] = {
      {"w", shape_w, 2, STRATA_DTYPE_FLOAT32, STRATA_ALL_ROLES, 0},
      {"b", shape_b, 1, STRATA_DTYPE_FLOAT32, STRATA_ALL_ROLES, 0}};
  strata_group_spec spec;
  CHECK(strata_group_spec_init(&spec));
  spec.name = "linear";
  spec.tensors = tensors;
  spec.num_tensors = 2;
  int32_t group = -1;
  CHECK(strata_group_register(engine, &spec, &group));
  Require(group == 0, "the first group registered is not group 0");
  return engine;
}

static strata_optimizer* CreateOptimizer(strata_engine* engine) {
  strata_optimizer_options options;
  CHECK(strata_optimizer_options_init(&options));
  options.algo = STRATA_ALGO_ADAMW;
  options.threads = 1;
  strata_optimizer* optimizer = NULL;
  CHECK(strata_optimizer_create(engine, &options, &optimizer));
  return optimizer;
}

/* The host memory of tensor `name` (role `role`) of a view. */
static float* ViewTensor(const strata_view* view, const char* name,
                         int32_t role, size_t elements) {
  int32_t index = -1;
  CHECK(strata_view_find_tensor(view, name, role, &index));
  strata_tensor_info info = {.struct_size = sizeof(info)};
  CHECK(strata_view_get_tensor(view, index, &info));
  Require(!info.on_cuda && info.dtype == STRATA_DTYPE_FLOAT32 &&
              info.bytes == elements * sizeof(float),
          "a view tensor is not the fp32 host memory registered");
  return (float*)info.data;
}

/* Copies `p` into, or (write = 0) out of, the group's `role` at `tier`:
 * a write fetch of the compute copy alone is how initial weights go in. */
static void Transfer(strata_engine* engine, int32_t tier, int32_t role,
                     int write, Params* p) {
  strata_view* view = NULL;
  CHECK(
      strata_group_fetch(engine, 0, tier, STRATA_ROLE_BIT(role), write, &view));
  float* w = ViewTensor(view, "w", role, OUT * IN);
  float* b = ViewTensor(view, "b", role, OUT);
  if (write) {
    memcpy(w, p->w, sizeof(p->w));
    memcpy(b, p->b, sizeof(p->b));
  } else {
    memcpy(p->w, w, sizeof(p->w));
    memcpy(p->b, b, sizeof(p->b));
  }
  CHECK(strata_view_release(view));
}

/* Tensor `index` of a gradient buffer, checked to be `name`. */
static float* GradientTensor(const strata_gradients* grads, int32_t index,
                             const char* name) {
  strata_tensor_info info = {.struct_size = sizeof(info)};
  CHECK(strata_gradients_get_tensor(grads, index, &info));
  Require(strcmp(info.name, name) == 0 && !info.on_cuda &&
              info.dtype == STRATA_DTYPE_FLOAT32,
          "the gradient buffer's tensors are not the group's, in order");
  return (float*)info.data;
}

/* One training step (the `step`-th, 1-based); returns the loss. */
static float Step(strata_engine* engine, strata_optimizer* optimizer,
                  const Data* d, int64_t step) {
  strata_step_hyper hyper;
  CHECK(strata_step_hyper_init(&hyper));
  hyper.lr = kLr;
  hyper.beta1 = kBeta1;
  hyper.beta2 = kBeta2;
  hyper.eps = kEps;
  hyper.weight_decay = kWeightDecay;
  CHECK(strata_step_begin(engine));
  CHECK(strata_optimizer_begin_step(optimizer, &hyper));
  strata_view* view = NULL;
  CHECK(strata_group_fetch(engine, 0, STRATA_TIER_DEVICE, kCompute, 0, &view));
  strata_gradients* grads = NULL;
  CHECK(strata_optimizer_acquire_gradients(optimizer, 0, &grads));
  const float loss = LossAndGradients(
      d, ViewTensor(view, "w", STRATA_ROLE_COMPUTE, OUT * IN),
      ViewTensor(view, "b", STRATA_ROLE_COMPUTE, OUT),
      GradientTensor(grads, 0, "w"), GradientTensor(grads, 1, "b"));
  CHECK(strata_view_release(view));
  CHECK(strata_optimizer_hand_off(optimizer, grads, NULL, NULL));
  strata_step_report report = {.struct_size = sizeof(report)};
  CHECK(strata_optimizer_finish_step(optimizer, &report));
  CHECK(strata_step_end(engine));
  Require(!report.skipped && report.step == step,
          "the optimizer skipped a step or counted it wrong");
  return loss;
}

static void Train(strata_engine* engine, strata_optimizer* optimizer,
                  const Data* d, int64_t first, int64_t last) {
  for (int64_t step = first; step <= last; ++step) {
    printf("step %2lld  loss %.6f\n", (long long)step,
           (double)Step(engine, optimizer, d, step));
  }
}

/* Saves a checkpoint with the next step in its user_state, and closes. */
static void SaveAndClose(strata_engine* engine, strata_optimizer* optimizer,
                         const char* checkpoint, int64_t next_step) {
  char user_state[64];
  snprintf(user_state, sizeof(user_state), "{\"next_step\": %lld}",
           (long long)next_step);
  CHECK(strata_optimizer_save(optimizer, checkpoint, user_state));
  CHECK(strata_optimizer_close(optimizer));
  CHECK(strata_engine_close(engine));
  printf("saved %s after step %lld; closed; reopening\n", checkpoint,
         (long long)(next_step - 1));
}

/* Loads the checkpoint into a new optimizer; returns the next step. */
static int64_t Load(strata_optimizer* optimizer, const char* checkpoint) {
  char user_state[64];
  size_t needed = 0;
  CHECK(strata_optimizer_load(optimizer, checkpoint, user_state,
                              sizeof(user_state), &needed));
  long long next_step = -1;
  Require(needed <= sizeof(user_state) &&
              sscanf(user_state, "{\"next_step\": %lld}", &next_step) == 1,
          "the checkpoint's user_state is not the one saved");
  int64_t applied = -1;
  CHECK(strata_optimizer_get_step(optimizer, &applied));
  Require(applied == next_step - 1, "the loaded step count is not saved's");
  return next_step;
}

/* Bit equality of n floats; prints the first difference. */
static int SameBits(const float* got, const float* want, int n,
                    const char* what) {
  for (int k = 0; k < n; ++k) {
    if (memcmp(&got[k], &want[k], sizeof(float)) != 0) {
      fprintf(stderr, "train_c: %s[%d] is %.9g, the reference's %.9g\n", what,
              k, (double)got[k], (double)want[k]);
      return 0;
    }
  }
  return 1;
}

/* The compute copy and the master after training, against the reference. */
static int MatchesReference(strata_engine* engine, const Data* d) {
  Params compute, master, want;
  Transfer(engine, STRATA_TIER_HOST, STRATA_ROLE_COMPUTE, 0, &compute);
  Transfer(engine, STRATA_TIER_HOST, STRATA_ROLE_MASTER, 0, &master);
  ReferenceRun(d, &want);
  return SameBits(compute.w, want.w, OUT * IN, "w (compute)") &&
         SameBits(compute.b, want.b, OUT, "b (compute)") &&
         SameBits(master.w, want.w, OUT * IN, "w (master)") &&
         SameBits(master.b, want.b, OUT, "b (master)");
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SWAP_DIR (an existing directory)\n", argv[0]);
    return 1;
  }
  char checkpoint[4096];
  Require(snprintf(checkpoint, sizeof(checkpoint), "%s/checkpoint", argv[1]) <
              (int)sizeof(checkpoint),
          "the directory's path is too long");
  static Data data;
  MakeData(&data);
  Params initial;
  InitialWeights(&initial);

  strata_engine* engine = OpenEngine(argv[1]);
  strata_optimizer* optimizer = CreateOptimizer(engine);
  Transfer(engine, STRATA_TIER_HOST, STRATA_ROLE_COMPUTE, 1, &initial);
  Train(engine, optimizer, &data, 1, RESUME_AT);
  SaveAndClose(engine, optimizer, checkpoint, RESUME_AT + 1);

  engine = OpenEngine(argv[1]);
  optimizer = CreateOptimizer(engine);
  Train(engine, optimizer, &data, Load(optimizer, checkpoint), STEPS);
  CHECK(strata_optimizer_close(optimizer));
  const int ok = MatchesReference(engine, &data);
  CHECK(strata_engine_close(engine));
  if (!ok) return 1;
  printf("the weights after %d steps match the reference AdamW bit for bit\n",
         STEPS);
  return 0;
}
