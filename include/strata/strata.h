/* strata/strata.h: the stable C ABI of the tiered store. Library `strata`.
 *
 * What it is
 * - A C11 view of strata/engine.h for frameworks and languages that cannot
 *   use C++: register groups of tensors, fetch them to a tier, read and
 *   write them in place (also as DLPack tensors), release, evict, step.
 *   The semantics are engine.h's; this header states only what the C
 *   boundary adds.
 *
 * Building against it
 * - strata.h includes <dlpack/dlpack.h>, the header-only DLPack standard
 *   (github.com/dmlc/dlpack; Debian's libdlpack-dev, which
 *   scripts/setup.sh installs; any version from 0.6). strata's versioned
 *   export declares its own copy of DLPack 1.0's struct (below).
 * - Layout: within a group, each role's tensors sit in one chunk, each
 *   tensor starting at a multiple of 128 elements, and each chunk is
 *   padded to a multiple of 4 KiB; strata_group_get_bytes gives a group's
 *   bytes at a tier, padding included.
 * - Fences: a C caller on CUDA passes its cudaStream_t or cudaEvent_t
 *   where a function takes `stream`/`event`. On the host-emulated device
 *   the stream is a strata::HostStream*, a C++ interface for tests that
 *   model late-completing kernels; C code there does its work on the
 *   calling thread, complete when it calls strata, and passes NULL.
 *
 * Conventions
 * - Handles are opaque: strata_engine (strata_engine_open/close) and
 *   strata_view, one fetched group (strata_group_fetch/strata_view_release);
 *   strata_optimizer.h adds strata_optimizer and strata_gradients. A handle
 *   is a number, never an address, and is never reused in a process: one
 *   closed, released or handed off already fails with
 *   STRATA_FAILED_PRECONDITION ("closed already"), one that never came from
 *   strata with STRATA_INVALID_ARGUMENT; neither reaches another object.
 * - Every function returns a strata_status, except strata_last_error and
 *   strata_status_name. STRATA_OK is 0; the other values mirror
 *   strata::StatusCode one to one.
 * - On failure, strata_last_error() returns a message naming the problem and
 *   the fix, prefixed with the function's name. It is per thread, stays until
 *   the thread's next failed call, and is "" before the first. Out
 *   parameters are left untouched on failure.
 * - Every pointer argument is checked: NULL fails with
 *   STRATA_INVALID_ARGUMENT naming the argument (the exceptions are the
 *   text buffers of strata_engine_explain and strata_engine_load when their
 *   capacity is 0). So are group ids,
 *   tiers, roles and dtypes. No C++ exception crosses this boundary; running
 *   out of memory inside a call is STRATA_RESOURCE_EXHAUSTED.
 * - Structs that may grow start with `uint32_t struct_size`. Inputs are
 *   filled with defaults by their *_init function; for outputs the caller
 *   sets struct_size = sizeof(the struct) and the library fills that many
 *   bytes at most, then stores the count it filled.
 * - Strings passed in are NUL-terminated UTF-8 and copied. Strings and
 *   arrays handed out are owned by the object named in their comment.
 *
 * Ownership and lifetime
 * - A strata_view is one fetch's pin: it and everything read from it (data,
 *   names, shapes) are valid until strata_view_release(view), which releases
 *   that fetch only. The tensor memory belongs to the engine; a view fetched
 *   with write = 0 must not be written.
 * - strata_engine_close fails with STRATA_FAILED_PRECONDITION while views
 *   are unreleased; release them first.
 *
 * Thread safety: every function may be called from any thread, as for
 * strata::Engine; a view may be released by another thread than the one
 * that fetched it. Memory read through a view must not be used after
 * another thread released it (an export of it holds it: see
 * strata_view_export_dlpack). Closing an engine while another thread
 * calls it is the caller's race, but never reaches freed memory: a view
 * fetched meanwhile keeps the engine alive until it is released.
 */
#ifndef STRATA_STRATA_H_
#define STRATA_STRATA_H_

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version this header belongs to; strata_version_get returns the
 * library's. A library with the same major version runs programs built
 * against an older or equal minor version. */
#define STRATA_VERSION_MAJOR 0
#define STRATA_VERSION_MINOR 1
#define STRATA_VERSION_PATCH 0

typedef enum strata_status {
  STRATA_OK = 0,
  STRATA_INVALID_ARGUMENT = 1,
  STRATA_NOT_FOUND = 2,
  STRATA_PERMISSION_DENIED = 3,
  STRATA_RESOURCE_EXHAUSTED = 4,
  STRATA_NO_SPACE = 5,
  STRATA_IO_ERROR = 6,
  STRATA_DATA_LOSS = 7,
  STRATA_UNAVAILABLE = 8,
  STRATA_FAILED_PRECONDITION = 9,
  STRATA_INTERNAL = 10,
  STRATA_CANCELLED = 11 /* a wait ended by strata_set_interrupt_fd */
} strata_status;

/* Enum values travel in int32_t fields so that struct layouts do not depend
 * on the compiler's enum size. */
typedef enum strata_tier {
  STRATA_TIER_DEVICE = 0,
  STRATA_TIER_HOST = 1,
  STRATA_TIER_NVME = 2
} strata_tier;
#define STRATA_NUM_TIERS 3

typedef enum strata_dtype {
  STRATA_DTYPE_FLOAT32 = 0,
  STRATA_DTYPE_BFLOAT16 = 1,
  STRATA_DTYPE_FLOAT16 = 2,
  STRATA_DTYPE_UINT8 = 3 /* raw bytes: views of 8-bit optimizer state only */
} strata_dtype;

typedef enum strata_role {
  STRATA_ROLE_COMPUTE = 0, /* the compute copy, in the tensor's dtype */
  STRATA_ROLE_MASTER = 1,  /* fp32 master weights: one never written
                              while the compute copy was takes its exact
                              widening before the first step or a save
                              (strata/engine.h, Roles) */
  STRATA_ROLE_STATE1 = 2,  /* optimizer state (Adam's m), in the engine's
                              strata_state_format */
  STRATA_ROLE_STATE2 = 3,  /* optimizer state (Adam's v), likewise */
  STRATA_ROLE_GRAD = 4     /* fp32 gradient accumulator */
} strata_role;
#define STRATA_NUM_ROLES 5
/* Role masks: a bit per role. */
#define STRATA_ROLE_BIT(role) (1u << (role))
#define STRATA_ALL_ROLES ((1u << STRATA_NUM_ROLES) - 1u)

/* How the state roles are stored (strata/state_format.h). */
typedef enum strata_state_format {
  STRATA_STATE_FP32 = 0, /* 4 bytes an element, exact */
  STRATA_STATE_BF16 = 1, /* 2 bytes, rounded stochastically by the step */
  STRATA_STATE_INT8 = 2  /* a byte an element and a scale per 256 (tensors
                            of 4096 elements or more; smaller ones fp32);
                            views of it are STRATA_DTYPE_UINT8 bytes */
} strata_state_format;

typedef enum strata_device_kind {
  STRATA_DEVICE_AUTO = 0, /* CUDA when a GPU is usable, else host-emulated */
  STRATA_DEVICE_CUDA = 1,
  STRATA_DEVICE_HOST = 2 /* host memory under the device budget */
} strata_device_kind;

typedef struct strata_engine strata_engine;
typedef struct strata_view strata_view;

/* "OK", "invalid argument", ... (static storage; "unknown" for other
 * values). */
STRATA_EXPORT const char* strata_status_name(strata_status status);
/* The calling thread's last failure message (thread storage, valid until
 * its next failed call). */
STRATA_EXPORT const char* strata_last_error(void);

STRATA_EXPORT strata_status strata_version_get(int32_t* major, int32_t* minor,
                                               int32_t* patch);

/* Ctrl-C for callers blocked in strata. A call of the calling thread that
 * waits for something that may take long (a write view another thread
 * holds, a gradient buffer, the CPU optimizer, a queued update, the
 * prefetches, a checkpoint's quiesce) looks at `fd` at least every 100
 * ms; once it is readable (a signal handler wrote to it, as Python's does
 * to its wakeup fd), the wait ends and the call fails with
 * STRATA_CANCELLED, having released what it pinned and changed nothing:
 * the engine stays usable and the call may be made again. strata never
 * reads the descriptor; the caller drains it. -1 (the default) turns it
 * off. It applies to the calling thread only: other threads' waits, and
 * strata's own threads, never look. The Python binding sets it on the
 * main thread, so that KeyboardInterrupt reaches a call blocked there. */
STRATA_EXPORT strata_status strata_set_interrupt_fd(int32_t fd);

/* ---- Engine ---------------------------------------------------------- */

typedef struct strata_engine_options {
  uint32_t struct_size;   /* sizeof(strata_engine_options), set by _init */
  int32_t device;         /* strata_device_kind; default AUTO */
  int32_t cuda_device;    /* default 0 */
  int32_t swap_files;     /* default 4 */
  uint64_t device_budget; /* bytes; must be > 0 */
  uint64_t host_budget;   /* bytes of pinned host memory; must be > 0 */
  uint64_t nvme_budget;   /* bytes of swap space; 0 = no NVMe tier */
  const char* swap_dir;   /* required when nvme_budget > 0, else NULL;
                             several directories, one per drive, are
                             separated by ':' */
  int32_t home[STRATA_NUM_ROLES]; /* default home tier of every role:
                                     STRATA_TIER_HOST */
  int32_t io_threads;             /* default 4 */
  int32_t prefetch;               /* 1: follow the trace (default) */
  int32_t lock_host;              /* 1: mlock of the host tier is required */
  int32_t numa_node;              /* -1 (default): the GPU's node */
  /* The roles that may be fetched to the device (a mask); 0 (the
   * default) is every role. The device budget must hold, besides its
   * homes, the largest group's fetch of these roles: with the optimizer
   * on the CPU only the compute copy goes there, and
   * STRATA_ROLE_BIT(STRATA_ROLE_COMPUTE) lets the budget count it alone. A
   * fetch of another role to the device fails naming the option. */
  uint32_t device_roles;
  /* Bandwidths the planner assumes, GB/s; defaults as in engine.h. */
  double host_to_device_gbps;
  double device_to_host_gbps;
  double nvme_read_gbps;
  double nvme_write_gbps;
  /* strata_state_format of every group's state roles; default FP32. A
   * checkpoint loads only into an engine of its format. */
  int32_t state_format;
} strata_engine_options;

/* Sets struct_size and every default. */
STRATA_EXPORT strata_status
strata_engine_options_init(strata_engine_options* options);

/* Opens an engine; *engine is set on success. */
STRATA_EXPORT strata_status strata_engine_open(
    const strata_engine_options* options, strata_engine** engine);
/* Frees the engine and every tier, and removes its swap files. Fails with
 * STRATA_FAILED_PRECONDITION, closing nothing, while views of it are
 * unreleased, optimizers of it open, or DLPack exports of its views alive;
 * the message names which. Closing it again, or using it after, fails with
 * STRATA_FAILED_PRECONDITION. */
STRATA_EXPORT strata_status strata_engine_close(strata_engine* engine);
/* strata_engine_close for a process that must let go of an engine while
 * DLPack exports of its views live (the Python binding at the
 * interpreter's exit, when module globals still hold arrays): those do
 * not refuse it. The handle ends at once; the engine, its memory and its
 * swap files are freed when the last of those exports is deleted (if the
 * process exits first, the next engine on the swap directory removes the
 * files). Unreleased views and open optimizers still refuse it. */
STRATA_EXPORT strata_status
strata_engine_close_after_exports(strata_engine* engine);

typedef struct strata_engine_info {
  uint32_t struct_size; /* caller sets sizeof(strata_engine_info) */
  int32_t on_cuda;      /* 1: device memory is CUDA memory */
  int32_t cuda_device;  /* the CUDA device used when on_cuda */
  int32_t host_locked;  /* 1: the host tier is mlocked */
  /* Owned by the engine, valid until strata_engine_close. */
  const char* device;        /* "cuda" or "host" (as options.device) */
  const char* device_name;   /* GPU name, or "host-emulated" */
  const char* device_reason; /* why STRATA_DEVICE_AUTO chose it */
  const char* host_backing;  /* how the host tier was allocated */
  const char* aio_backend;   /* "io_uring" or "threads" */
} strata_engine_info;

STRATA_EXPORT strata_status strata_engine_get_info(const strata_engine* engine,
                                                   strata_engine_info* info);

typedef struct strata_tier_stats {
  uint64_t budget;
  uint64_t used;
  uint64_t peak;
} strata_tier_stats;

/* Counters since strata_engine_open; see strata::EngineStats. */
typedef struct strata_engine_stats {
  uint32_t struct_size; /* caller sets sizeof(strata_engine_stats) */
  uint32_t reserved;
  strata_tier_stats tiers[STRATA_NUM_TIERS]; /* indexed by strata_tier */
  uint64_t bytes[STRATA_NUM_TIERS][STRATA_NUM_TIERS]; /* [from][to] */
  uint64_t fetches;
  uint64_t hits;
  uint64_t prefetch_hits;
  uint64_t late_prefetches;
  uint64_t prefetches;
  uint64_t evictions;
  uint64_t writebacks;
  uint64_t trace_invalidations;
  uint64_t steps;
  double stall_seconds;
  double update_wait_seconds; /* fetches waited for optimizer updates */
  /* Added after update_wait_seconds (filled when struct_size holds them): */
  uint64_t abandoned_prefetches; /* given up: no room without evicting data
                                    needed sooner */
  /* `bytes` by the role of the chunk that moved: [role][from][to]; summed
   * over the roles, they are `bytes`. The optimizer's gradient hand-off
   * (device -> host) counts as STRATA_ROLE_GRAD. */
  uint64_t role_bytes[STRATA_NUM_ROLES][STRATA_NUM_TIERS][STRATA_NUM_TIERS];
  /* Added after role_bytes: bytes of dirty copies whose contents ended
   * unread (the optimizer's gradients after their step), dropped without
   * the write-down an eviction would have made. */
  uint64_t discarded_bytes;
  /* Added after discarded_bytes: bytes the NVMe tier hashed for its
   * checksums, every read and the writes whose digest the optimizer's pass
   * did not make (it hashes what it writes while that is in cache). */
  uint64_t nvme_bytes_hashed;
} strata_engine_stats;

STRATA_EXPORT strata_status strata_engine_get_stats(const strata_engine* engine,
                                                    strata_engine_stats* stats);

/* Copies the printable plan ("no trace yet: ..." before the first step
 * ends) into
 * buffer, like snprintf: at most capacity bytes, always NUL-terminated when
 * capacity > 0. *required is set to the full length + 1; the text was cut
 * when *required > capacity. buffer may be NULL when capacity is 0. */
STRATA_EXPORT strata_status strata_engine_explain(const strata_engine* engine,
                                                  char* buffer, size_t capacity,
                                                  size_t* required);

/* Waits for every prefetch and write-behind, and for optimizer updates
 * queued under the next forward; returns the first error of a background
 * transfer since the last call. */
STRATA_EXPORT strata_status strata_engine_drain(strata_engine* engine);

/* Bracket one training step (see engine.h, Steps). */
STRATA_EXPORT strata_status strata_step_begin(strata_engine* engine);
STRATA_EXPORT strata_status strata_step_end(strata_engine* engine);

/* ---- Groups ---------------------------------------------------------- */

/* Fixed layout: a new field would come with a new registration function. */
typedef struct strata_tensor_spec {
  const char* name;
  const int64_t* shape; /* ndim extents, each >= 1 (an empty tensor is
                           refused); NULL only if ndim == 0 */
  int32_t ndim;
  int32_t dtype;     /* strata_dtype of the compute copy */
  uint32_t roles;    /* mask of STRATA_ROLE_BIT(role); must not be 0 */
  uint32_t reserved; /* 0 */
} strata_tensor_spec;

typedef struct strata_group_spec {
  uint32_t struct_size; /* sizeof(strata_group_spec), set by _init */
  int32_t num_tensors;
  const char* name;
  const strata_tensor_spec* tensors; /* num_tensors specs */
  int32_t use_default_placement;     /* 1 (default): the engine's homes */
  int32_t home[STRATA_NUM_ROLES];    /* strata_tier per role, used when
                                        use_default_placement is 0 */
  uint32_t device_roles;             /* used when use_default_placement
                                        is 0: as strata_engine_options';
                                        0 is the engine's */
} strata_group_spec;

/* Sets struct_size and the defaults: no tensors, default placement. */
STRATA_EXPORT strata_status strata_group_spec_init(strata_group_spec* spec);

/* Registers a group; *group is set to its id (0, 1, ...). Fails,
 * registering nothing, when the group can never fit. */
STRATA_EXPORT strata_status strata_group_register(strata_engine* engine,
                                                  const strata_group_spec* spec,
                                                  int32_t* group);
STRATA_EXPORT strata_status strata_group_count(const strata_engine* engine,
                                               int32_t* count);
/* Bytes the group occupies in `tier` when fully fetched there. */
STRATA_EXPORT strata_status strata_group_get_bytes(const strata_engine* engine,
                                                   int32_t group, int32_t tier,
                                                   uint64_t* bytes);

/* Makes the group's chunks of `roles` (a mask; STRATA_ALL_ROLES for every
 * role the group has) valid at `tier` (the device or the host) and returns
 * them as *view. Each fetch is undone by releasing its view.
 * - With write = 1 the fetched copies become the only valid ones, and a
 *   fetch of the group at another tier waits until the view is released:
 *   from another thread it waits; from the thread that fetched the write
 *   view (which alone would then release it) it fails at once with
 *   STRATA_FAILED_PRECONDITION naming the view.
 * - A read view keeps the bytes it was given when the group is written at
 *   another tier; a later fetch at the view's tier gets its own copy of
 *   the new bytes, and the old copy is freed when the view is released.
 *   Nothing ever waits for a read view.
 * Fails with STRATA_RESOURCE_EXHAUSTED when the tier cannot make room
 * (naming what the views there hold). */
STRATA_EXPORT strata_status strata_group_fetch(strata_engine* engine,
                                               int32_t group, int32_t tier,
                                               uint32_t roles, int32_t write,
                                               strata_view** view);
/* strata_group_fetch for views used on the caller's `stream` (a
 * cudaStream_t; a strata::HostStream* on the host-emulated device; NULL is
 * strata_group_fetch): a read fetch to the device does not wait for a copy
 * still landing there (a late prefetch); the stream waits for it on the
 * device instead. See strata::FetchOptions::stream. */
STRATA_EXPORT strata_status strata_group_fetch_on(strata_engine* engine,
                                                  int32_t group, int32_t tier,
                                                  uint32_t roles, int32_t write,
                                                  void* stream,
                                                  strata_view** view);
/* Starts making the group valid at `tier` in the background. */
STRATA_EXPORT strata_status strata_group_prefetch(strata_engine* engine,
                                                  int32_t group, int32_t tier,
                                                  uint32_t roles);
/* Drops the group's copies at `tier`, written down first when dirty.
 * STRATA_FAILED_PRECONDITION while the group is fetched there; see
 * strata::Engine::Evict. */
STRATA_EXPORT strata_status strata_group_evict(strata_engine* engine,
                                               int32_t group, int32_t tier);

/* ---- Views ----------------------------------------------------------- */

typedef struct strata_tensor_info {
  uint32_t struct_size; /* caller sets sizeof(strata_tensor_info) */
  int32_t role;         /* strata_role */
  int32_t dtype;        /* strata_dtype this role is stored in */
  int32_t ndim;
  const char* name;     /* owned by the view */
  const int64_t* shape; /* ndim extents, owned by the view */
  void* data;           /* CUDA memory when on_cuda, else host memory */
  uint64_t bytes;
  int32_t tier;    /* strata_tier */
  int32_t on_cuda; /* 1: data is CUDA device memory */
} strata_tensor_info;

/* Releases exactly the fetch the view came from, whatever other views of
 * the group exist, from any thread and in any order. The handle is gone
 * afterwards: releasing it again, or passing it to any strata_view_*
 * function, fails with STRATA_FAILED_PRECONDITION ("released already");
 * a pointer that never was a view fails with STRATA_INVALID_ARGUMENT.
 * Handles are never reused, so neither mistake can reach another view. */
STRATA_EXPORT strata_status strata_view_release(strata_view* view);
/* strata_view_release for a view that device work queued by the caller may
 * still read or write: the engine neither reuses, fills nor copies from its
 * memory until that work ran, and the call does not wait for it. On CUDA,
 * `stream` is a cudaStream_t (the work queued on it so far) or, when it is
 * NULL, `event` a recorded cudaEvent_t; on the host-emulated device
 * `stream` is a strata::HostStream*. Both NULL: the work is complete, as
 * for strata_view_release. A fence the device cannot use is
 * STRATA_INVALID_ARGUMENT and the view stays held. */
STRATA_EXPORT strata_status strata_view_release_after(strata_view* view,
                                                      void* stream,
                                                      void* event);

STRATA_EXPORT strata_status strata_view_get_group(const strata_view* view,
                                                  int32_t* group,
                                                  int32_t* tier);
/* Tensors of the view: one per (tensor, fetched role). */
STRATA_EXPORT strata_status strata_view_count_tensors(const strata_view* view,
                                                      int32_t* count);
STRATA_EXPORT strata_status strata_view_get_tensor(const strata_view* view,
                                                   int32_t index,
                                                   strata_tensor_info* info);
/* The index of tensor `name` in `role`; STRATA_NOT_FOUND when the view has
 * no such tensor. */
STRATA_EXPORT strata_status strata_view_find_tensor(const strata_view* view,
                                                    const char* name,
                                                    int32_t role,
                                                    int32_t* index);

/* DLPack 1.x's DLManagedTensorVersioned, with its exact layout: the
 * dlpack/dlpack.h this header includes may be older than 1.0 (Debian 12's
 * libdlpack-dev is 0.6) and lack it. A consumer built against DLPack >= 1.0
 * may use it as a DLManagedTensorVersioned*; in Python it travels in a
 * capsule named "dltensor_versioned". */
typedef struct strata_dlpack_version {
  uint32_t major; /* 1 */
  uint32_t minor; /* 0 */
} strata_dlpack_version;
/* flags: the tensor must not be written through (a read view). */
#define STRATA_DLPACK_FLAG_READ_ONLY (UINT64_C(1) << 0)
typedef struct strata_dlpack_versioned {
  strata_dlpack_version version;
  void* manager_ctx;
  void (*deleter)(struct strata_dlpack_versioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
} strata_dlpack_versioned;

/* Exports tensor `index` of the view as DLPack, zero-copy: kDLCPU for host
 * memory (also the host-emulated device), kDLCUDA with the engine's CUDA
 * device for CUDA memory; dtype float32, bfloat16 (kDLBfloat) or float16;
 * compact row-major shape and strides, owned by the managed tensor. The
 * memory stays owned by strata.
 * An export holds the fetch it points into until its deleter runs (call it
 * exactly once): strata_view_release(view) ends the handle at once, but
 * while exports of the view live the fetch stays pinned (its memory is
 * neither reused nor moved), and is released, after the fence given to
 * strata_view_release_after (which must stay valid until then), by the
 * deleter of the last one; a failure of that release is returned by the
 * next strata_engine_drain. strata_engine_close fails with
 * STRATA_FAILED_PRECONDITION while exports of its views live. An export
 * of a read view (write = 0) must not be written through. */
STRATA_EXPORT strata_status strata_view_export_dlpack(const strata_view* view,
                                                      int32_t index,
                                                      DLManagedTensor** out);
/* strata_view_export_dlpack as DLPack 1.0's versioned tensor, with
 * STRATA_DLPACK_FLAG_READ_ONLY set for a read view. */
STRATA_EXPORT strata_status strata_view_export_dlpack_versioned(
    const strata_view* view, int32_t index, strata_dlpack_versioned** out);

/* ---- Checkpoints ----------------------------------------------------- */

/* Saves every tensor of every group, and `user_state` (UTF-8, stored
 * verbatim; "" for none), to the directory `dir`; see strata::Engine::Save
 * for the format's guarantees. Every view must be released first
 * (STRATA_FAILED_PRECONDITION names a fetched group). On failure
 * (STRATA_NO_SPACE for a full disk, ...) the previous checkpoint at `dir`
 * is kept. */
STRATA_EXPORT strata_status strata_engine_save(strata_engine* engine,
                                               const char* dir,
                                               const char* user_state);
/* Loads the checkpoint at `dir` into the engine, which must have the same
 * groups and tensors registered; see strata::Engine::Load. A damaged or
 * mismatched checkpoint fails naming the file or the tensor and changes
 * nothing. The saved user_state is copied into user_state_buf like
 * strata_engine_explain's text: at most capacity bytes, NUL-terminated
 * when capacity > 0, *needed set to its length + 1. The tensors are loaded
 * even when the text was cut (*needed > capacity); the whole text is the
 * "user_state" field of <dir>/manifest.json. */
STRATA_EXPORT strata_status strata_engine_load(strata_engine* engine,
                                               const char* dir,
                                               char* user_state_buf,
                                               size_t capacity, size_t* needed);
/* Checks the checkpoint at `dir` (its manifest and every data file's size
 * and checksum) as strata_engine_load does before loading, without an
 * engine; see strata::VerifyCheckpoint. STRATA_DATA_LOSS names a damaged
 * file. */
STRATA_EXPORT strata_status strata_checkpoint_verify(const char* dir);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* The optimizer's part of the ABI. */
#include "strata/strata_optimizer.h"

#endif /* STRATA_STRATA_H_ */
