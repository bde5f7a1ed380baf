// strata/engine.h: the tiered store. Library `strata`.
//
// Example: one training step with the offloaded optimizer
// (strata/offload_optimizer.h); tests/store/example_test.cc runs this code.
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
// - Tensors are registered in groups (usually one layer each). Every tensor
//   has a name, a shape, the dtype of its compute copy and a set of roles:
//   the compute copy, the fp32 master, two fp32 optimizer-state slots and an
//   fp32 gradient accumulator. Each role has a home tier (device, host or
//   NVMe), like DeepSpeed's offload_param / offload_optimizer.
// - A group's tensors of one role are packed into one aligned chunk; chunks
//   are the unit of transfer. A new chunk reads as zeros.
// - Fetch(group, tier) makes the group's chunks valid at `tier` and returns
//   views with a Pin that keeps them valid until it is released; each
//   fetch has its own pin, released in any order. Prefetch() does
//   the same asynchronously. Data moves NVMe -> host -> device and back, one
//   tier at a time; the host copy of an NVMe-homed chunk is a cache.
// - Budgets are hard. When a tier is full, an unpinned copy is evicted: the
//   one whose next use in the recorded trace is furthest away (Belady), or
//   the least recently used before a trace exists. A dirty copy is written
//   down one tier before its space is reused. A fetched (pinned) group is
//   never evicted.
// - Steps: BeginStep()/EndStep() bracket one training step. The first step's
//   sequence of fetches becomes the trace; later steps prefetch ahead along
//   it within the byte windows of a plan (Explain() prints it). A step whose
//   order differs invalidates the trace, which is re-recorded; that is
//   logged once per step on stderr and is not an error.
//
// - On a GPU, kernels run after the CPU queued them: release a view with
//   the Fence of the stream its kernels were queued on, and the engine
//   keeps that memory as it is (no eviction, fill or copy from it) until
//   they ran, without blocking the releasing thread. A release without a
//   fence says the kernels are done (the caller synchronized).
//
// - While a group is fetched with `write`, its bytes are in flux: fetches of
//   it at another tier wait for its release, and prefetches skip it. The
//   engine never waits on its own caller: such a fetch from the thread
//   that holds the write view fails at once (kFailedPrecondition, naming
//   the view) instead of waiting for itself. A read view at another tier
//   keeps the bytes it had, unchanged; a fetch of the group at that view's
//   tier gets its own copy of the new bytes, and the old copy is freed
//   when the view is released. Nothing waits for a read view.
//   A write fetch itself first waits for any transfer still copying from
//   the copy it hands out (a prefetch of the group to the device, say),
//   even when that copy is already resident; the wait counts as a stall.
// - An OffloadOptimizer may queue a group's update to run after its
//   FinishStep returned (clipping or skip-on-overflow in overlap mode).
//   Fetch(), Save() and Load() wait for it to land. If it failed, fetches
//   of the group and Save() fail with its error until a Load() (a discard
//   fetch, which replaces the bytes, does not). Prefetches do not wait: a
//   copy they make of the old bytes is invalidated by the update.
//
// Ownership: the Engine owns every tier. Views point into tier memory and
// are valid only while their pin is held. Destroy every view (or release
// its pin) before the Engine: an Engine destroyed with pins outstanding
// says so on stderr, its views dangle, and releasing them then fails.
//
// Thread safety: every method may be called from any thread. Writing into
// a view fetched with `write = false`, or writing one group from two
// threads, is a race in the caller.
//
// Failure: every call returns a Status or Result. A configuration that can
// never fit fails at RegisterGroup() with the bytes each tier needs. A
// checksum mismatch on NVMe is kDataLoss naming the extent and never
// returns wrong bytes; a failed write leaves the data valid in the tier
// above.
#ifndef STRATA_ENGINE_H_
#define STRATA_ENGINE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "strata/export.h"
#include "strata/state_format.h"
#include "strata/status.h"

namespace strata {

namespace internal {
struct EngineAccess;  // the core's way past this API (src/store/)
class PinOwner;       // the store's side of a Pin (src/store/pin_owner.h)
}  // namespace internal

enum class Tier : int { kDevice = 0, kHost = 1, kNvme = 2 };
inline constexpr int kNumTiers = 3;

// kUInt8 is raw bytes: only a view of 8-bit optimizer state (its codes
// and scales, Note [8-bit state] in strata/cpu_adam.h) has it; tensors are
// registered in the other three.
enum class DType : int {
  kFloat32 = 0,
  kBFloat16 = 1,
  kFloat16 = 2,
  kUInt8 = 3
};

// Roles. The master is the truth of a trained group's weights once set;
// a group whose compute copy alone was written (its master never fetched
// for writing, or fetched for writing with it and left all zero bits) has
// its master set to the exact fp32 widening of the compute copy before the
// optimizer's next step and before Save (Note [Masters from compute copies] in
// src/store/engine_internal.h). After that, change the weights by writing
// the master (and the compute copy, which the next step rewrites).
enum class Role : int {
  kCompute = 0,  // the compute copy, in the tensor's dtype
  kMaster = 1,   // fp32 master weights
  kState1 = 2,   // optimizer state (Adam's m), in the state format
  kState2 = 3,   // optimizer state (Adam's v), in the state format
  kGrad = 4,     // fp32 gradient accumulator
};
inline constexpr int kNumRoles = 5;

using RoleMask = uint32_t;
constexpr RoleMask RoleBit(Role role) { return 1u << static_cast<int>(role); }
inline constexpr RoleMask kAllRoles = (1u << kNumRoles) - 1;

STRATA_EXPORT std::string_view TierName(Tier tier);  // "device", ...
STRATA_EXPORT Result<Tier> ParseTier(std::string_view name);
STRATA_EXPORT std::string_view RoleName(Role role);     // "compute", ...
STRATA_EXPORT std::string_view DTypeName(DType dtype);  // "bf16", ...
STRATA_EXPORT Result<DType> ParseDType(std::string_view name);
STRATA_EXPORT size_t DTypeSize(DType dtype);
// The dtype a role is stored in: the tensor's dtype for kCompute, for
// kState1 and kState2 bf16 in StateFormat::kBF16 and raw bytes in kQ8,
// else fp32.
STRATA_EXPORT DType RoleDType(Role role, DType compute,
                              StateFormat state = StateFormat::kF32);

// Home tier of every role, and the roles that may be fetched to the device
// (registration checks the device budget against those only; with the
// optimizer on the CPU, only kCompute ever goes there).
struct Placement {
  std::array<Tier, kNumRoles> home = {Tier::kHost, Tier::kHost, Tier::kHost,
                                      Tier::kHost, Tier::kHost};
  RoleMask device_roles = kAllRoles;
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // each extent >= 1 (an empty tensor is refused)
  DType dtype = DType::kBFloat16;
  RoleMask roles = RoleBit(Role::kCompute);
};

struct GroupSpec {
  std::string name;
  std::vector<TensorSpec> tensors;
  bool use_default_placement = true;
  Placement placement;  // used when use_default_placement is false
};

// Bandwidths the planner assumes, in GB/s (1e9 bytes per second).
struct Bandwidths {
  double host_to_device = 12.0;
  double device_to_host = 12.0;
  double nvme_read = 2.0;
  double nvme_write = 1.5;
};

struct EngineOptions {
  std::string device = "auto";  // "auto", "cuda" or "host" (emulated)
  int cuda_device = 0;
  uint64_t device_budget = 0;  // bytes; > 0
  uint64_t host_budget = 0;    // bytes of pinned host memory; > 0
  uint64_t nvme_budget = 0;    // bytes of swap space; 0 = no NVMe tier
  std::string swap_dir;        // required when nvme_budget > 0; several
                               // directories (one per drive) separated
                               // by ':' spread the swap files over them
  int swap_files = 4;          // rounded up to a multiple of the dirs
  Placement placement;         // default homes
  int io_threads = 4;          // transfer workers for prefetch and write-behind
  bool prefetch = true;        // follow the trace (off: demand fetches only)
  bool lock_host = false;      // kRequired mlock of the host tier (else best
                               // effort, with advice printed once)
  int numa_node = -1;          // host tier node; -1: the GPU's, else caller's
  Bandwidths bandwidths;
  // How every group's kState1 and kState2 are stored: kF32, kBF16 (2 bytes
  // an element, as the optimizer rounds them) or kQ8 (a byte an element
  // and a scale per 256, for tensors of at least 4096 elements; smaller
  // ones stay fp32): their views are of dtype kUInt8 and shape {bytes}.
  // Save records it and Load refuses a checkpoint of another format.
  StateFormat state_format = StateFormat::kF32;
};

struct TensorView {
  std::string name;
  Role role = Role::kCompute;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  void* data = nullptr;  // device memory for Tier::kDevice on CUDA
  uint64_t bytes = 0;
  Tier tier = Tier::kHost;
  bool on_cuda = false;  // data is CUDA device memory
};

// Where a caller queued asynchronous device work, so that the engine orders
// its own work after it without blocking a CPU thread (Note [Fences] in
// src/store/residency_holds.cc). On CUDA, `stream` is a cudaStream_t (the work
// queued on it so far) or `event` a recorded cudaEvent_t (the work before
// it); on the host-emulated device, `stream` is a HostStream*. The default,
// both null, says the work is complete already (the caller synchronized).
struct Fence {
  void* stream = nullptr;
  void* event = nullptr;  // used when `stream` is null
};

// The host-emulated device's stand-in for a CUDA stream: work queued that
// completes later, as a GPU's kernels do. Tests implement it to model a
// framework's kernels (tests/testutil/fake_stream.h). A stream must outlive
// the engine's use of it: the fences recorded on it, and the fetches made
// for it.
class HostStream {
 public:
  virtual ~HostStream() = default;
  // A mark after the work queued so far.
  virtual uint64_t Mark() = 0;
  // Whether the work queued before `mark` has run; Wait blocks until it has.
  virtual bool Done(uint64_t mark) = 0;
  virtual void Wait(uint64_t mark) = 0;
  // Queues `work` behind the work queued so far (the engine queues waits
  // for its copies: FetchOptions::stream).
  virtual void Queue(std::function<void()> work) = 0;
};

// A fetch's hold on the copies it made valid: they stay at their tier, and
// views into them stay valid, until the pin is released. Pins are
// independent of each other: release them in any order, from any thread.
// A pin is move-only and releases itself when destroyed, so an early return
// cannot leak it.
//
//   GroupView w = ...;  // Engine::Fetch
//   Use(w);
//   STRATA_RETURN_IF_ERROR(w.pin.Release());  // or let w go out of scope
class STRATA_EXPORT Pin {
 public:
  Pin() = default;  // holds nothing
  ~Pin();
  Pin(Pin&& other) noexcept;
  Pin& operator=(Pin&& other) noexcept;  // releases what *this held first
  Pin(const Pin&) = delete;
  Pin& operator=(const Pin&) = delete;

  // Releases exactly what the fetch pinned. Device work that still reads or
  // writes the views is named by `after`: the engine neither reuses, fills
  // nor copies from that memory before it has run. kFailedPrecondition when
  // the pin holds nothing (released already, moved from, default-
  // constructed) or its engine was destroyed first; kInvalidArgument for a
  // fence the device cannot use, and the pin is then still held.
  Status Release(const Fence& after = {});
  bool held() const { return owner_ != nullptr; }

 private:
  friend class internal::PinOwner;
  Pin(std::shared_ptr<internal::PinOwner> owner, uint64_t id);

  std::shared_ptr<internal::PinOwner> owner_;
  uint64_t id_ = 0;
};

// One fetched group: its tensors' views and the pin that keeps them valid.
struct GroupView {
  int group = -1;
  Tier tier = Tier::kHost;
  std::vector<TensorView> tensors;
  Pin pin;
  // The view of `name` in `role`, or nullptr.
  const TensorView* Find(std::string_view name,
                         Role role = Role::kCompute) const;
};

struct FetchOptions {
  RoleMask roles = kAllRoles;  // of the roles the group has
  bool write = false;          // the caller will write: the copies fetched
                               // become the only valid ones (dirty)
  // With write: the caller overwrites every tensor byte, so nothing is read
  // first (those bytes are undefined until written; the padding between
  // tensors reads as zeros).
  bool discard = false;
  bool record = true;  // false: not part of the step's trace (for agents,
                       // like the optimizer pipeline, that read ahead on
                       // their own and run beside the training thread)
  // The stream the views will be used on (a cudaStream_t; a HostStream* on
  // the host-emulated device). A read fetch to the device then does not
  // wait for a copy to the device still landing (a late prefetch): it
  // returns at once and the stream waits for the copy on the device (such
  // a copy fails only with a CUDA error that loses the context, which
  // aborts). Null: the fetch returns once every copy has landed.
  void* stream = nullptr;
};

// Counters since Open().
struct EngineStats {
  struct TierStats {
    uint64_t budget = 0;
    uint64_t used = 0;
    uint64_t peak = 0;
  };
  std::array<TierStats, kNumTiers> tiers;
  // Bytes moved between tiers: [from][to], indices are Tier values.
  using TierBytes = std::array<std::array<uint64_t, kNumTiers>, kNumTiers>;
  TierBytes bytes = {};
  // The same bytes by the role of the chunk that moved: role_bytes[role]
  // [from][to] (Role, then Tier values); summed over the roles, they are
  // `bytes`. The optimizer's gradient hand-off (device -> host, in the
  // compute dtype) counts as Role::kGrad.
  std::array<TierBytes, kNumRoles> role_bytes = {};
  // Fetch() figures count recorded fetches only (FetchOptions::record): the
  // training thread's, not an agent's like the optimizer pipeline.
  uint64_t fetches = 0;               // chunk fetches by Fetch()
  uint64_t hits = 0;                  // ... found valid at the tier
  uint64_t prefetch_hits = 0;         // ... made valid there by a prefetch
  uint64_t late_prefetches = 0;       // ... still in flight (the fetch waited)
  uint64_t prefetches = 0;            // chunk transfers started ahead of time
  uint64_t abandoned_prefetches = 0;  // ... given up: no room without
                                      // evicting data needed sooner
  uint64_t evictions = 0;             // copies dropped to make room
  uint64_t writebacks = 0;  // ... of which were dirty and written down
  // Bytes of dirty copies whose contents ended unread (the optimizer's
  // gradients after their step) and were dropped without the write-down
  // an eviction would have made.
  uint64_t discarded_bytes = 0;
  // Bytes the NVMe tier hashed for its checksums: every read, and the
  // writes whose digest the optimizer's pass did not make (Note [Checksums
  // in the optimizer's pass] in src/optim/step_digest.h).
  uint64_t nvme_bytes_hashed = 0;
  uint64_t trace_invalidations = 0;
  uint64_t steps = 0;
  double stall_seconds = 0;  // time Fetch() spent waiting for data
  // Time Fetch() (and Save, Load) waited for an optimizer update queued
  // under the next forward (strata/offload_optimizer.h, Exactness).
  double update_wait_seconds = 0;
};

struct EngineInfo {
  std::string device;         // "cuda" or "host" (as EngineOptions::device)
  std::string device_name;    // GPU name, or "host-emulated"
  std::string device_reason;  // why --device auto chose it
  std::string host_backing;   // how the host tier was allocated
  bool host_locked = false;
  std::string aio_backend;  // "io_uring" or "threads"
};

// Engine::Save options.
struct SaveOptions {
  // Opaque UTF-8 text stored verbatim in the manifest (the optimizer's
  // JSON state: step counter, hyperparameters); Load returns it.
  std::string user_state;
};

// What Engine::Load read besides the tensors.
struct LoadResult {
  std::string user_state;  // SaveOptions::user_state, verbatim
  int format_version = 0;  // of the checkpoint
  uint64_t steps = 0;      // EngineStats::steps of the engine that saved it
  uint64_t bytes = 0;      // tensor bytes loaded
  bool recovered = false;  // restored from "<dir>.old" first (see Load)
};

class STRATA_EXPORT Engine {
 public:
  static Result<std::unique_ptr<Engine>> Open(const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineInfo& info() const;

  // Registers a group; returns its id (0, 1, ...). Fails, registering
  // nothing, when the group can never fit: "group 'layer.17' needs 812 MiB
  // on device; device budget is 512 MiB".
  Result<int> RegisterGroup(const GroupSpec& spec);
  int group_count() const;
  const std::string& group_name(int group) const;
  // Bytes the group occupies in `tier` when fully fetched there.
  uint64_t group_bytes(int group, Tier tier) const;

  // Makes the group's chunks of `opt.roles` valid at `tier` (device or
  // host) and pins them there; the view's pin releases exactly this fetch.
  Result<GroupView> Fetch(int group, Tier tier, const FetchOptions& opt = {});
  // Fetch in the background, pinning nothing: it evicts as Fetch does,
  // except the group's own copies, and gives up (abandoned_prefetches, not
  // an error) when nothing else can go. Drain() returns its errors.
  Status Prefetch(int group, Tier tier, RoleMask roles = kAllRoles);
  // Drops the group's cached copies at `tier` (written down first when
  // dirty); copies homed at `tier` stay. kFailedPrecondition while the
  // group is fetched there.
  Status Evict(int group, Tier tier);
  // Waits for every prefetch and write-behind, and for the optimizer's
  // updates queued under the next forward; returns the first error of a
  // background transfer since the last call (a failed update's comes from
  // Fetch() of its group and Save()).
  Status Drain();

  void BeginStep();
  Status EndStep();
  // The current plan, printable: trace, windows, prefetch and eviction
  // schedule ("no trace yet: ..." before the first step ends).
  std::string Explain() const;

  EngineStats stats() const;

  // Checkpoints (format and crash protocol: src/ckpt/checkpoint.h). Both need
  // every group released and no step open (else kFailedPrecondition
  // naming the group), call Drain() first and return its error; other
  // threads must not use the engine meanwhile.
  //
  // Save writes every role of every tensor, with `options.user_state` and
  // the step count, to the directory `dir`. Data streams group by group
  // through the host tier within its budget; nothing else is staged. It is
  // written to "<dir>.tmp-<pid>", fsynced and renamed into place, so a
  // crash at any point leaves the previous checkpoint at `dir` loadable or
  // the new one complete. On failure (kNoSpace for a full disk, ...) the
  // previous checkpoint is kept and the temporary removed. A `dir` that
  // exists, is not empty and holds anything besides a checkpoint's own
  // files is refused (naming that entry), not replaced.
  Status Save(const std::string& dir, const SaveOptions& options = {});
  // Load reads a checkpoint into this engine. The engine must have the
  // same groups (same order and names) and tensors (names, shapes, dtypes,
  // roles), else an error naming the first mismatch; budgets, placements
  // and the order of tensors within a group may differ. The manifest (its
  // own XXH3-64) and every data file (size, XXH3-64) are verified before
  // any data changes: a damaged, truncated or missing file or another
  // format version fails naming the file and leaves the engine untouched.
  // Only an I/O error after that check leaves the data partly loaded (the
  // error says so).
  // If `dir` is missing but "<dir>.old" exists (a Save was cut off after
  // moving the old checkpoint aside), Load renames it back to `dir` and
  // loads it. `result` may be null.
  Status Load(const std::string& dir, LoadResult* result = nullptr);

 private:
  class Impl;
  friend struct internal::EngineAccess;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Checks the checkpoint at `dir` as Engine::Load does before it changes
// anything (the manifest's XXH3-64, every data file's size and XXH3-64),
// without an engine, for readers of the files themselves (strata.torch's
// offline export). Reads only: a "<dir>.old" is not recovered. The
// errors are Load's, naming the damaged file.
Status VerifyCheckpoint(const std::string& dir);

}  // namespace strata

#endif  // STRATA_ENGINE_H_
