// strata-plan's arithmetic: where each training-state role lives, the bytes
// every tier needs, the bytes every link moves per step, the step-time floor
// those bytes imply, the largest model that fits, and ZeRO's per-GPU
// model-state memory.
//
// Contract
// - Pure functions of their arguments: no I/O, no clocks, no globals; safe to
//   call from any thread.
// - Parsers return kInvalidArgument with a message naming the bad text and
//   what would be accepted.
// - Functions taking a Model or Budgets require them to be within the limits
//   below (kMaxParams, kMaxBudget, kMinK..kMaxK); the command line checks
//   user input against these, so a violation here is a programming bug and
//   aborts through STRATA_CHECK. Within those limits no figure overflows.
//
// The model of a step (offload mode, one GPU, mixed-precision Adam family)
// - Roles and their bytes per parameter: the compute copy of the parameters
//   and the gradients (dtype bytes each), the fp32 master (4 B) and the rest
//   of the optimizer state, Adam's m and v (K - 4 B), where K counts every
//   optimizer byte per parameter including the master (12 for Adam).
// - Placement is greedy, one whole role at a time in that order: params and
//   gradients take the first of device, host, NVMe with room; the master and
//   m/v take host, then NVMe, never the device. See Note [Greedy placement]
//   in estimate.cc.
// - The optimizer runs on the CPU, so gradients always cross device->host
//   and updated parameters always reach the compute copy's home.
// - With N ranks (--gpus), each rank holds and steps ceil(Ψ/N) parameters
//   of every role, in its own tiers with the budgets given (budgets are per
//   rank), and takes part in the collectives of CollectiveTraffic(): Note
//   [Partitions] in python/strata/torch/ranks.py.
#ifndef STRATA_TOOLS_PLAN_ESTIMATE_H_
#define STRATA_TOOLS_PLAN_ESTIMATE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/engine.h"
#include "strata/status.h"

namespace strata::plan {

// Limits that keep every product below 2^64 (the largest is the host
// memory traffic, < 300 B per parameter).
inline constexpr uint64_t kMaxParams = 1ull << 50;  // ~1.1e15 parameters
inline constexpr uint64_t kMaxBudget = 1ull << 50;  // 1 PiB per tier
inline constexpr uint32_t kMinK = 4;                // the fp32 master alone
inline constexpr uint32_t kMaxK = 64;
inline constexpr uint64_t kMaxGpus = 1ull << 20;

// Dtypes are the engine's: strata::DType, ParseDType, DTypeName, DTypeSize.

// A parameter count: "7.5B", "13e9", "175M", "350k", "1.2T", "7500000000"
// (K/M/B/G/T are powers of 1000, case-insensitive). Must round to 1 ..
// kMaxParams.
Result<uint64_t> ParseParamCount(std::string_view text);

// Parameters of a decoder-only transformer: 12*L*H^2 for the layers plus
// V*H for the embedding (vocab 0: none). Fails when L or H is 0 or the
// count exceeds kMaxParams.
Result<uint64_t> TransformerParams(uint64_t layers, uint64_t hidden,
                                   uint64_t vocab);

struct Model {
  uint64_t params = 0;  // Ψ, 0..kMaxParams
  DType dtype = DType::kBFloat16;
  uint32_t k = 12;  // optimizer bytes per parameter, master included
};

enum class Tier { kDevice, kHost, kNvme };
inline constexpr int kNumTiers = 3;
inline constexpr std::array<Tier, kNumTiers> kTiers = {
    Tier::kDevice, Tier::kHost, Tier::kNvme};
std::string_view TierName(Tier tier);  // "device", "host", "NVMe"
std::string_view TierKey(Tier tier);   // "device", "host", "nvme" (JSON)

enum class Role { kParams, kGrads, kMaster, kOptimState };
inline constexpr int kNumRoles = 4;
inline constexpr std::array<Role, kNumRoles> kRoles = {
    Role::kParams, Role::kGrads, Role::kMaster, Role::kOptimState};
std::string_view RoleKey(Role role);  // "params", "grads", "master", "optim"
// "compute params (bf16)", "gradients (bf16)", "fp32 master",
// "optimizer state m, v".
std::string RoleLabel(Role role, DType dtype);
uint32_t BytesPerParam(const Model& model, Role role);

// Bytes a tier may hold; nullopt means the tier is not limited.
using Budgets = std::array<std::optional<uint64_t>, kNumTiers>;

struct RolePlacement {
  Role role = Role::kParams;
  Tier tier = Tier::kDevice;
  uint64_t bytes = 0;
  bool fits = true;  // false: no tier had room; `tier` is its last choice
};

struct Placement {
  std::array<RolePlacement, kNumRoles> roles;  // in kRoles order
  std::array<uint64_t, kNumTiers> needs = {};  // bytes homed on each tier
  bool fits() const;
  Tier TierOf(Role role) const { return roles[static_cast<int>(role)].tier; }
};

// Homes every role; a role that fits nowhere is put on its last-choice tier
// (NVMe) anyway, so `needs` says how much that tier would have to hold.
Placement Place(const Model& model, const Budgets& budgets);

struct Shortfall {
  Tier tier = Tier::kNvme;
  uint64_t needs = 0;
  uint64_t budget = 0;
};
// The tiers whose needs exceed their budget, in kTiers order.
std::vector<Shortfall> Shortfalls(const Placement& placement,
                                  const Budgets& budgets);
// "does not fit: needs 812.0 GiB on NVMe; NVMe budget is 500.0 GiB" for
// each shortfall, with the fix. Empty when there is none.
std::string DescribeShortfalls(const std::vector<Shortfall>& shortfalls);

// The links a step's bytes cross. Host memory counts every byte read or
// written in host DRAM: each transfer on the other links but the network,
// plus the CPU optimizer's fused pass over its state.
enum class Link {
  kHostToDevice,
  kDeviceToHost,
  kNvmeToHost,
  kHostToNvme,
  kHostMemory,
  kNetwork  // collectives between ranks, per rank (device memory to device
            // memory under NCCL, so not counted in host memory)
};
inline constexpr int kNumLinks = 6;
inline constexpr std::array<Link, kNumLinks> kLinks = {
    Link::kHostToDevice, Link::kDeviceToHost, Link::kNvmeToHost,
    Link::kHostToNvme,   Link::kHostMemory,   Link::kNetwork};
// "host->device", "device->host", "NVMe->host", "host->NVMe", "host memory",
// "network".
std::string_view LinkName(Link link);
// "h2d", "d2h", "nvme_read", "nvme_write", "host_memory", "network" (JSON).
std::string_view LinkKey(Link link);

struct Transfer {
  Link link = Link::kHostToDevice;
  Role role = Role::kParams;
  std::string_view what;  // "forward", "backward", "after the optimizer", ...
  uint64_t bytes = 0;
};

// Every transfer one training step makes under `placement`, in step order;
// see Note [Step traffic] in estimate.cc.
// Host memory items cover only the optimizer's own pass; LinkBytes() adds
// the transfers of the other links to it.
std::vector<Transfer> StepTraffic(const Model& model,
                                  const Placement& placement);
std::array<uint64_t, kNumLinks> LinkBytes(const std::vector<Transfer>& traffic);

// The part of `model` one of `gpus` ranks holds: ceil(Ψ/N) parameters.
Model RankModel(const Model& model, uint64_t gpus);
// The collectives one of `gpus` ranks takes part in per step, on the
// network link, for a rank holding `rank_model`: the compute copy
// all-gathered for forward and again for backward (stage 3), and the
// gradients reduce-scattered; see Note [Collectives] in estimate.cc.
// Empty for one rank.
std::vector<Transfer> CollectiveTraffic(const Model& rank_model, uint64_t gpus);

struct Bandwidths {
  std::array<double, kNumLinks> gbps = {};  // 1e9 bytes/s, each > 0
  double adam_gparams = 0;                  // optimizer 1e9 params/s, > 0
};

// The step-time floor: every resource and the CPU optimizer run
// concurrently and at full speed, so a step takes at least as long as the
// slowest of them. The resources are the links, except that NVMe->host and
// host->NVMe are one: the drive's reads and writes take turns (Note [The
// drive is one resource] in estimate.cc).
struct Floor {
  std::array<double, kNumLinks> link_seconds = {};
  double nvme_seconds = 0;  // NVMe->host plus host->NVMe seconds
  double optimizer_seconds = 0;
  // The slowest link; when nvme_binds, the busier of the drive's two.
  Link transfer_binding = Link::kHostToDevice;
  bool nvme_binds = false;       // the drive, reads and writes together
  double transfer_seconds = 0;   // the slowest resource's time
  bool optimizer_binds = false;  // the optimizer is slower than all of them
  double seconds = 0;            // max(transfer_seconds, optimizer_seconds)
};
Floor StepFloor(const Model& model,
                const std::array<uint64_t, kNumLinks>& link_bytes,
                const Bandwidths& bandwidths);
// What binds: "CPU optimizer", "NVMe (reads + writes)" or the link's name;
// BindingKey: "optimizer", "nvme" or the link's key (JSON). The Transfer
// forms name the slowest transfer resource alone (ignoring the optimizer).
std::string BindingName(const Floor& floor);
std::string_view BindingKey(const Floor& floor);
std::string TransferBindingName(const Floor& floor);
std::string_view TransferBindingKey(const Floor& floor);

// The largest Ψ whose placement fits `budgets`, for model.dtype and
// model.k (model.params is ignored): Place() fits for the result and not
// for result + 1. nullopt when the host or NVMe tier is unlimited, so any
// model fits. 0 when not even one parameter fits.
std::optional<uint64_t> LargestModel(const Model& model,
                                     const Budgets& budgets);

// ZeRO model-state bytes per GPU with `gpus` data-parallel GPUs, b = dtype
// bytes (2 for mixed precision), rounded up to a whole byte:
//   stage 0: (b+b+K)Ψ   stage 1: bΨ+bΨ+KΨ/N   stage 2: bΨ+(b+K)Ψ/N
//   stage 3: (b+b+K)Ψ/N
inline constexpr int kNumZeroStages = 4;
uint64_t ZeroBytesPerGpu(const Model& model, int stage, uint64_t gpus);
// "(2+2+K)Ψ", "2Ψ+2Ψ+KΨ/N", "2Ψ+(2+K)Ψ/N", "(2+2+K)Ψ/N" with 2 replaced by
// the dtype's bytes.
std::string ZeroFormula(DType dtype, int stage);

// Everything strata-plan reports, computed in one call.
struct Plan {
  Model model;
  Budgets budgets;
  Bandwidths bandwidths;
  uint64_t gpus = 1;
  Model rank_model;  // RankModel(model, gpus): the placement's, traffic's
                     // and floor's model (each rank's own)
  Placement placement;
  std::vector<Shortfall> shortfalls;
  std::vector<Transfer> traffic;
  std::array<uint64_t, kNumLinks> link_bytes = {};
  Floor floor;
  std::optional<uint64_t> largest_model;  // whole model, over the N ranks
  std::array<uint64_t, kNumZeroStages> zero_bytes = {};
};
Plan MakePlan(const Model& model, const Budgets& budgets,
              const Bandwidths& bandwidths, uint64_t gpus);

}  // namespace strata::plan

#endif  // STRATA_TOOLS_PLAN_ESTIMATE_H_
