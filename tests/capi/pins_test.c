/* Views as pins through the C ABI (issue #17 §1), compiled as C: each
 * strata_view releases exactly its own fetch, in any order and from any
 * thread; a handle released twice, or one that never was a view, is a clear
 * error; releasing a write view ends the write while a read view is held;
 * nothing waits on the calling thread's own views (issue #30).
 * Host-emulated device, no NVMe. Exits 0 on success, 1 naming the failed
 * check otherwise. */
#define _XOPEN_SOURCE 700

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "strata/strata.h"
#include "tests/capi/c_check.h"

#ifdef __cplusplus
#error "pins_test.c tests the C ABI and must be compiled as C"
#endif

#define KIB 1024ull
#define NUM_GROUPS 10
#define CHUNK (64 * KIB) /* each group: one bf16 compute chunk */
#define THREADS 4
#define ROUNDS 300
#define MAILBOX 2

static const uint32_t kCompute = STRATA_ROLE_BIT(STRATA_ROLE_COMPUTE);

/* Registers a group of one compute tensor "w" of `elements` in `dtype`. */
static int32_t Register(strata_engine* engine, const char* name,
                        int64_t elements, int32_t dtype) {
  int32_t id = -1;
  CHECK_OK(RegisterOne(engine, name, elements, dtype, kCompute, &id));
  return id;
}

static strata_engine* Open(uint64_t device_chunks) {
  strata_engine_options options;
  CHECK_OK(strata_engine_options_init(&options));
  options.device = STRATA_DEVICE_HOST;
  options.device_budget = device_chunks * CHUNK;
  options.host_budget = 4 * NUM_GROUPS * CHUNK;
  options.io_threads = 2;
  strata_engine* engine = NULL;
  CHECK_OK(strata_engine_open(&options, &engine));
  for (int g = 0; g < NUM_GROUPS; ++g) {
    char name[16];
    snprintf(name, sizeof(name), "g%d", g);
    CHECK(Register(engine, name, CHUNK / 2, STRATA_DTYPE_BFLOAT16) == g);
  }
  return engine;
}

static uint8_t* DataOf(strata_view* view, uint64_t bytes) {
  strata_tensor_info info;
  info.struct_size = sizeof(info);
  CHECK_OK(strata_view_get_tensor(view, 0, &info));
  CHECK(info.bytes == bytes);
  return (uint8_t*)info.data;
}

static uint8_t* Data(strata_view* view) { return DataOf(view, CHUNK); }

static uint8_t Byte(int32_t group, uint64_t i) {
  return (uint8_t)((group * 37 + i * 11) ^ (i >> 9));
}

/* 1: the pattern is in the view; 0: some byte differs. */
static int Holds(strata_view* view, int32_t group) {
  const uint8_t* data = Data(view);
  for (uint64_t i = 0; i < CHUNK; ++i) {
    if (data[i] != Byte(group, i)) return 0;
  }
  return 1;
}

static void WritePatterns(strata_engine* engine) {
  for (int32_t g = 0; g < NUM_GROUPS; ++g) {
    strata_view* view = NULL;
    CHECK_OK(
        strata_group_fetch(engine, g, STRATA_TIER_HOST, kCompute, 1, &view));
    uint8_t* data = Data(view);
    for (uint64_t i = 0; i < CHUNK; ++i) data[i] = Byte(g, i);
    CHECK_OK(strata_view_release(view));
  }
}

/* Host view A, then device view B of group 0; releasing A first leaves B's
 * copy pinned while other groups churn through a 2-chunk device. */
static void CheckOutOfOrderRelease(void) {
  strata_engine* engine = Open(2);
  WritePatterns(engine);
  strata_view *a = NULL, *b = NULL;
  CHECK_OK(strata_group_fetch(engine, 0, STRATA_TIER_HOST, kCompute, 0, &a));
  CHECK_OK(strata_group_fetch_on(engine, 0, STRATA_TIER_DEVICE, kCompute, 0,
                                 NULL, &b));
  CHECK_OK(strata_view_release(a));
  for (int round = 0; round < 3; ++round) {
    for (int32_t g = 1; g < NUM_GROUPS; ++g) {
      strata_view* other = NULL;
      CHECK_OK(strata_group_fetch(engine, g, STRATA_TIER_DEVICE, kCompute, 0,
                                  &other));
      CHECK(Holds(other, g));
      CHECK_OK(strata_view_release(other));
    }
  }
  CHECK(Holds(b, 0));
  CHECK_OK(strata_view_release(b));
  CHECK_OK(strata_engine_close(engine));
}

static void CheckMisuse(void) {
  strata_engine* engine = Open(2);
  strata_view* view = NULL;
  CHECK_OK(strata_group_fetch(engine, 1, STRATA_TIER_HOST, kCompute, 0, &view));
  CHECK_OK(strata_view_release(view));
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_view_release(view));
  CHECK(strstr(strata_last_error(), "released already") != NULL);
  int32_t count = 0;
  CHECK_FAILS(STRATA_FAILED_PRECONDITION,
              strata_view_count_tensors(view, &count));
  CHECK_OK(
      strata_group_fetch(engine, 1, STRATA_TIER_DEVICE, kCompute, 0, &view));
  int not_an_event = 0;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_view_release_after(view, NULL, &not_an_event));
  CHECK(strstr(strata_last_error(), "HostStream") != NULL);
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_group_evict(engine, 1, 0));
  CHECK_OK(strata_view_release_after(view, NULL, NULL)); /* still held */
  CHECK_FAILS(STRATA_FAILED_PRECONDITION, strata_view_release(view));
  int not_a_view = 0;
  CHECK_FAILS(STRATA_INVALID_ARGUMENT,
              strata_view_release((strata_view*)&not_a_view));
  CHECK(strstr(strata_last_error(), "is no view handle") != NULL);
  CHECK_OK(strata_engine_close(engine));
}

struct Pending {
  strata_engine* engine;
  volatile int done;
  strata_status status;
};

static void* FetchHostAndRelease(void* arg) {
  struct Pending* p = (struct Pending*)arg;
  strata_view* view = NULL;
  p->status =
      strata_group_fetch(p->engine, 0, STRATA_TIER_HOST, kCompute, 0, &view);
  if (p->status == STRATA_OK) p->status = strata_view_release(view);
  __atomic_store_n(&p->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Write view W and read view R of group 0 on the device; releasing W ends
 * the write, so a host fetch of group 0 finishes while R is held. */
static void CheckReleasingTheWriterEndsTheWrite(void) {
  strata_engine* engine = Open(2);
  strata_view *w = NULL, *r = NULL;
  CHECK_OK(strata_group_fetch(engine, 0, STRATA_TIER_DEVICE, kCompute, 1, &w));
  CHECK_OK(strata_group_fetch(engine, 0, STRATA_TIER_DEVICE, kCompute, 0, &r));
  CHECK_OK(strata_view_release(w));
  struct Pending pending = {engine, 0, STRATA_OK};
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, FetchHostAndRelease, &pending) == 0);
  const struct timespec tick = {0, 10 * 1000 * 1000};
  for (int i = 0; i < 1000 && !__atomic_load_n(&pending.done, __ATOMIC_ACQUIRE);
       ++i) {
    nanosleep(&tick, NULL);
  }
  const int done = __atomic_load_n(&pending.done, __ATOMIC_ACQUIRE);
  CHECK_OK(strata_view_release(r)); /* unblocks the thread if it waits */
  CHECK(pthread_join(thread, NULL) == 0);
  CHECK(done && "the host fetch waited for the read view");
  CHECK_OK(pending.status);
  CHECK_OK(strata_engine_close(engine));
}

/* Issue #30 §1, in one thread: a read view on the host, a write on the
 * device, then a host fetch again. The third fetch used to wait forever for
 * the first view; now it gets its own copy of the new bytes while the view
 * keeps the old ones, and evicting the device copy writes it down. A fetch
 * that would wait for this thread's own write view fails naming it, under
 * the name of the function called. One 256 KiB fp32 group. */
static uint8_t* Big(strata_view* view) { return DataOf(view, 256 * KIB); }

static void CheckNoWaitOnTheCallersOwnViews(void) {
  strata_engine_options options;
  CHECK_OK(strata_engine_options_init(&options));
  options.device = STRATA_DEVICE_HOST;
  options.device_budget = 4 * 256 * KIB;
  options.host_budget = 4 * 256 * KIB;
  strata_engine* engine = NULL;
  CHECK_OK(strata_engine_open(&options, &engine));
  const int32_t g = Register(engine, "G", 64 * 1024, STRATA_DTYPE_FLOAT32);
  strata_view *first = NULL, *writer = NULL, *again = NULL;
  CHECK_OK(
      strata_group_fetch(engine, g, STRATA_TIER_HOST, kCompute, 0, &first));
  CHECK_OK(
      strata_group_fetch(engine, g, STRATA_TIER_DEVICE, kCompute, 1, &writer));
  memset(Big(writer), 0xAB, 256 * KIB);
  CHECK_OK(strata_view_release(writer));
  CHECK_OK(
      strata_group_fetch(engine, g, STRATA_TIER_HOST, kCompute, 0, &again));
  CHECK(Big(first) != Big(again));
  CHECK(Big(first)[0] == 0 && Big(first)[256 * KIB - 1] == 0);
  CHECK(Big(again)[0] == 0xAB && Big(again)[256 * KIB - 1] == 0xAB);
  CHECK_OK(strata_group_evict(engine, g, STRATA_TIER_DEVICE));
  CHECK_OK(strata_view_release(first));
  CHECK_OK(strata_view_release(again));

  CHECK_OK(
      strata_group_fetch(engine, g, STRATA_TIER_DEVICE, kCompute, 1, &writer));
  CHECK_FAILS(
      STRATA_FAILED_PRECONDITION,
      strata_group_fetch(engine, g, STRATA_TIER_HOST, kCompute, 0, &again));
  CHECK(strncmp(strata_last_error(), "strata_group_fetch: ", 20) == 0);
  CHECK(strstr(strata_last_error(), "by this thread") != NULL);
  CHECK_OK(strata_view_release(writer));
  CHECK_OK(
      strata_group_fetch(engine, g, STRATA_TIER_HOST, kCompute, 0, &again));
  CHECK(Big(again)[0] == 0xAB);
  CHECK_OK(strata_view_release(again));
  CHECK_OK(strata_engine_close(engine));
}

struct Holder {
  strata_engine* engine;
  volatile int holding;
  volatile int release;
};

/* Holds a write view of group 0 on the device until told to release. */
static void* HoldWriteView(void* arg) {
  struct Holder* h = (struct Holder*)arg;
  strata_view* view = NULL;
  if (strata_group_fetch(h->engine, 0, STRATA_TIER_DEVICE, kCompute, 1,
                         &view) != STRATA_OK) {
    return (void*)strata_last_error();
  }
  __atomic_store_n(&h->holding, 1, __ATOMIC_RELEASE);
  const struct timespec tick = {0, 1000 * 1000};
  while (!__atomic_load_n(&h->release, __ATOMIC_ACQUIRE)) {
    nanosleep(&tick, NULL);
  }
  return strata_view_release(view) == STRATA_OK ? NULL
                                                : (void*)strata_last_error();
}

/* Note [Interruptible waits]: a host fetch of group 0 waits for another
 * thread's write view; once the interrupt descriptor is readable, it fails
 * with STRATA_CANCELLED, while a third thread's wait (the descriptor was
 * not set there) goes on; the engine goes on too: the view is released and
 * both fetches then succeed. */
static void CheckAnInterruptEndsAWait(void) {
  strata_engine* engine = Open(2);
  int interrupt[2];
  CHECK(pipe(interrupt) == 0);
  CHECK_OK(strata_set_interrupt_fd(interrupt[0]));
  struct Holder holder = {engine, 0, 0};
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, HoldWriteView, &holder) == 0);
  const struct timespec tick = {0, 1000 * 1000};
  while (!__atomic_load_n(&holder.holding, __ATOMIC_ACQUIRE)) {
    nanosleep(&tick, NULL);
  }
  /* Another thread waits for the same view; the descriptor is not its. */
  struct Pending other = {engine, 0, STRATA_OK};
  pthread_t waiter;
  CHECK(pthread_create(&waiter, NULL, FetchHostAndRelease, &other) == 0);
  CHECK(write(interrupt[1], "!", 1) == 1);
  strata_view* view = NULL;
  CHECK_FAILS(STRATA_CANCELLED, strata_group_fetch(engine, 0, STRATA_TIER_HOST,
                                                   kCompute, 0, &view));
  const struct timespec grace = {0, 300 * 1000 * 1000};
  nanosleep(&grace, NULL); /* three of its polls */
  CHECK(!__atomic_load_n(&other.done, __ATOMIC_ACQUIRE));
  CHECK(strstr(strata_last_error(),
               "interrupted while waiting for a write "
               "view another thread holds") != NULL);
  char drained;
  CHECK(read(interrupt[0], &drained, 1) == 1);
  __atomic_store_n(&holder.release, 1, __ATOMIC_RELEASE);
  void* why = NULL;
  CHECK(pthread_join(thread, &why) == 0);
  if (why != NULL) Die(__FILE__, __LINE__, (const char*)why, STRATA_OK);
  CHECK(pthread_join(waiter, NULL) == 0);
  CHECK_OK(other.status);
  CHECK_OK(strata_group_fetch(engine, 0, STRATA_TIER_HOST, kCompute, 0, &view));
  CHECK_OK(strata_view_release(view));
  CHECK_OK(strata_set_interrupt_fd(-1));
  close(interrupt[0]);
  close(interrupt[1]);
  CHECK_OK(strata_engine_close(engine));
}

/* Threads fetch read views, check every byte, and swap each into a shared
 * mailbox, releasing the view they take out: views are released by other
 * threads than their own, in no particular order, under eviction pressure
 * (8 device chunks for 10 groups). */
struct Shared {
  strata_engine* engine;
  pthread_mutex_t mu;
  strata_view* mailbox[MAILBOX];
  int seed;
};

static void* Churn(void* arg) {
  struct Shared* s = (struct Shared*)arg;
  pthread_mutex_lock(&s->mu);
  uint32_t rng = (uint32_t)(++s->seed) * 2654435761u;
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < ROUNDS; ++i) {
    rng = rng * 1664525u + 1013904223u;
    const int32_t g = (int32_t)((rng >> 8) % NUM_GROUPS);
    const int32_t tier =
        (rng >> 20) % 2 ? STRATA_TIER_DEVICE : STRATA_TIER_HOST;
    strata_view* view = NULL;
    if (strata_group_fetch(s->engine, g, tier, kCompute, 0, &view) !=
        STRATA_OK) {
      return (void*)strata_last_error();
    }
    if (!Holds(view, g)) return "a view's bytes changed";
    pthread_mutex_lock(&s->mu);
    strata_view** slot = &s->mailbox[(rng >> 4) % MAILBOX];
    strata_view* out = *slot;
    *slot = view;
    pthread_mutex_unlock(&s->mu);
    if (out != NULL && strata_view_release(out) != STRATA_OK) {
      return (void*)strata_last_error();
    }
  }
  return NULL;
}

static void CheckCrossThreadReleases(void) {
  struct Shared shared;
  memset(&shared, 0, sizeof(shared));
  shared.engine = Open(8);
  WritePatterns(shared.engine);
  CHECK(pthread_mutex_init(&shared.mu, NULL) == 0);
  pthread_t threads[THREADS];
  for (int t = 0; t < THREADS; ++t) {
    CHECK(pthread_create(&threads[t], NULL, Churn, &shared) == 0);
  }
  for (int t = 0; t < THREADS; ++t) {
    void* why = NULL;
    CHECK(pthread_join(threads[t], &why) == 0);
    if (why != NULL) Die(__FILE__, __LINE__, (const char*)why, STRATA_OK);
  }
  for (int m = 0; m < MAILBOX; ++m) {
    if (shared.mailbox[m] == NULL) continue;
    int32_t group = -1, tier = -1;
    CHECK_OK(strata_view_get_group(shared.mailbox[m], &group, &tier));
    CHECK(Holds(shared.mailbox[m], group));
    CHECK_OK(strata_view_release(shared.mailbox[m]));
  }
  strata_engine_stats stats;
  stats.struct_size = sizeof(stats);
  CHECK_OK(strata_engine_get_stats(shared.engine, &stats));
  CHECK(stats.evictions > 0);
  pthread_mutex_destroy(&shared.mu);
  CHECK_OK(strata_engine_close(shared.engine));
}

int main(void) {
  CheckOutOfOrderRelease();
  CheckMisuse();
  CheckReleasingTheWriterEndsTheWrite();
  CheckNoWaitOnTheCallersOwnViews();
  CheckAnInterruptEndsAWait();
  CheckCrossThreadReleases();
  printf("pins_test: OK\n");
  return 0;
}
