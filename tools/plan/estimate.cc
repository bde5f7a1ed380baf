#include "tools/plan/estimate.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <span>

#include "common/text.h"

namespace strata::plan {
namespace {

int Index(Tier tier) { return static_cast<int>(tier); }
int Index(Role role) { return static_cast<int>(role); }
int Index(Link link) { return static_cast<int>(link); }

void CheckModel(const Model& model) {
  STRATA_CHECK(model.params <= kMaxParams);
  STRATA_CHECK(model.k >= kMinK && model.k <= kMaxK);
}

void CheckBudgets(const Budgets& budgets) {
  for (const auto& budget : budgets) {
    STRATA_CHECK(!budget || *budget <= kMaxBudget);
  }
}

// The tiers a role may live on, fastest first.
std::span<const Tier> Preferences(Role role) {
  static constexpr Tier kCompute[] = {Tier::kDevice, Tier::kHost, Tier::kNvme};
  static constexpr Tier kState[] = {Tier::kHost, Tier::kNvme};
  if (role == Role::kParams || role == Role::kGrads) return kCompute;
  return kState;
}

bool HasRoom(const std::optional<uint64_t>& budget, uint64_t used,
             uint64_t bytes) {
  return !budget || used + bytes <= *budget;
}

double Multiplier(char suffix) {
  switch (std::toupper(static_cast<unsigned char>(suffix))) {
    case 'K':
      return 1e3;
    case 'M':
      return 1e6;
    case 'B':
    case 'G':
      return 1e9;
    case 'T':
      return 1e12;
    default:
      return 0;
  }
}

}  // namespace

Result<uint64_t> ParseParamCount(std::string_view text) {
  const std::string quoted = "'" + std::string(text) + "'";
  const Status out_of_range = Status::InvalidArgument(
      quoted + " parameters is out of range: give 1 to " +
      std::to_string(kMaxParams));
  const char* begin = text.data();
  const char* end = begin + text.size();
  // Whole numbers are read exactly; as doubles they would round past 2^53.
  uint64_t whole = 0;
  const auto [int_end, int_ec] = std::from_chars(begin, end, whole);
  if (int_ec == std::errc() && int_end == end) {
    if (whole >= 1 && whole <= kMaxParams) return whole;
    return out_of_range;
  }
  double value = 0;
  const auto [num_end, num_ec] = std::from_chars(begin, end, value);
  const double multiplier =
      num_end == end ? 1 : (end - num_end == 1 ? Multiplier(*num_end) : 0);
  if (num_ec != std::errc() || multiplier == 0) {
    return Status::InvalidArgument(
        quoted +
        " is not a parameter count; write e.g. 7.5B, 13e9, 175M "
        "or 7500000000 (K, M, B/G, T are powers of 1000)");
  }
  const double params = std::round(value * multiplier);
  if (!(params >= 1 && params <= static_cast<double>(kMaxParams))) {
    return out_of_range;
  }
  return static_cast<uint64_t>(params);
}

Result<uint64_t> TransformerParams(uint64_t layers, uint64_t hidden,
                                   uint64_t vocab) {
  if (layers == 0 || hidden == 0) {
    return Status::InvalidArgument(
        "--layers and --hidden must both be given, each at least 1");
  }
  using U128 = unsigned __int128;
  constexpr U128 kLimit = kMaxParams;
  // Bounding every factor first keeps each U128 product from wrapping.
  bool too_big =
      layers > kMaxParams || hidden > kMaxParams || vocab > kMaxParams;
  U128 total = 0;
  if (!too_big) {
    const U128 hh = U128{hidden} * hidden;
    too_big = hh > kLimit;
    total = 12 * std::min(hh, kLimit) * layers + U128{vocab} * hidden;
  }
  if (too_big || total > kLimit) {
    return Status::InvalidArgument(
        "12*L*H^2 + V*H with L=" + std::to_string(layers) +
        ", H=" + std::to_string(hidden) + ", V=" + std::to_string(vocab) +
        " exceeds " + std::to_string(kMaxParams) + " parameters");
  }
  return static_cast<uint64_t>(total);
}

std::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kNvme:
      return "NVMe";
  }
  return "?";
}

std::string_view TierKey(Tier tier) {
  return tier == Tier::kNvme ? "nvme" : TierName(tier);
}

std::string_view RoleKey(Role role) {
  switch (role) {
    case Role::kParams:
      return "params";
    case Role::kGrads:
      return "grads";
    case Role::kMaster:
      return "master";
    case Role::kOptimState:
      return "optim";
  }
  return "?";
}

std::string RoleLabel(Role role, DType dtype) {
  const std::string dt(DTypeName(dtype));
  switch (role) {
    case Role::kParams:
      return "compute params (" + dt + ")";
    case Role::kGrads:
      return "gradients (" + dt + ")";
    case Role::kMaster:
      return "fp32 master";
    case Role::kOptimState:
      return "optimizer state m, v";
  }
  return "?";
}

uint32_t BytesPerParam(const Model& model, Role role) {
  switch (role) {
    case Role::kParams:
    case Role::kGrads:
      return DTypeSize(model.dtype);
    case Role::kMaster:
      return 4;
    case Role::kOptimState:
      return model.k - 4;
  }
  return 0;
}

bool Placement::fits() const {
  return std::all_of(roles.begin(), roles.end(),
                     [](const RolePlacement& r) { return r.fits; });
}

// Note [Greedy placement]
// Why: the issue asks for "the fastest tier that fits", role by role, in a
// fixed order (compute params, gradients, master, m/v). That is what a user
// can predict by hand, and it matches how the engine fills tiers at setup.
// How: each role is homed whole on the first tier of its preference list
// whose remaining budget holds it. A role that fits nowhere still lands on
// NVMe, its last choice, so the report can say how many bytes NVMe would
// need, not just that something failed.
// Limits: roles are not split across tiers, and the order is fixed, so a
// cleverer packing may fit a model this rejects. LargestModel() answers for
// this policy, not for the best possible one.
Placement Place(const Model& model, const Budgets& budgets) {
  CheckModel(model);
  CheckBudgets(budgets);
  Placement placement;
  for (Role role : kRoles) {
    RolePlacement& home = placement.roles[Index(role)];
    home.role = role;
    home.bytes = model.params * BytesPerParam(model, role);
    const std::span<const Tier> prefs = Preferences(role);
    home.tier = prefs.back();
    home.fits = false;
    for (Tier tier : prefs) {
      if (HasRoom(budgets[Index(tier)], placement.needs[Index(tier)],
                  home.bytes)) {
        home.tier = tier;
        home.fits = true;
        break;
      }
    }
    placement.needs[Index(home.tier)] += home.bytes;
  }
  return placement;
}

std::vector<Shortfall> Shortfalls(const Placement& placement,
                                  const Budgets& budgets) {
  std::vector<Shortfall> out;
  for (Tier tier : kTiers) {
    const auto& budget = budgets[Index(tier)];
    const uint64_t needs = placement.needs[Index(tier)];
    if (budget && needs > *budget) out.push_back({tier, needs, *budget});
  }
  return out;
}

std::string DescribeShortfalls(const std::vector<Shortfall>& shortfalls) {
  std::string out;
  for (const Shortfall& s : shortfalls) {
    out += out.empty() ? "does not fit: " : "; ";
    const std::string tier(TierName(s.tier));
    out += "needs " + HumanBytes(s.needs) + " on " + tier + "; " + tier +
           " budget is " + HumanBytes(s.budget) + " (" +
           HumanBytes(s.needs - s.budget) + " short)";
  }
  return out;
}

std::string_view LinkName(Link link) {
  switch (link) {
    case Link::kHostToDevice:
      return "host->device";
    case Link::kDeviceToHost:
      return "device->host";
    case Link::kNvmeToHost:
      return "NVMe->host";
    case Link::kHostToNvme:
      return "host->NVMe";
    case Link::kHostMemory:
      return "host memory";
    case Link::kNetwork:
      return "network";
  }
  return "?";
}

std::string_view LinkKey(Link link) {
  switch (link) {
    case Link::kHostToDevice:
      return "h2d";
    case Link::kDeviceToHost:
      return "d2h";
    case Link::kNvmeToHost:
      return "nvme_read";
    case Link::kHostToNvme:
      return "nvme_write";
    case Link::kHostMemory:
      return "host_memory";
    case Link::kNetwork:
      return "network";
  }
  return "?";
}

// Note [Step traffic]
// Why: the floor is only as good as the byte count, so every movement the
// engine makes in one step is listed, in step order, with its reason.
// How: a compute copy not resident on the device crosses host->device
// twice, once for forward and once for backward (the device keeps only the
// layers in flight); homed on NVMe it is also read twice from NVMe. The CPU
// optimizer needs every gradient in host memory, so gradients always cross
// device->host. Roles homed on NVMe are read before and written after the
// optimizer. The optimizer's fused pass reads gradients, master and m/v and
// writes master, m/v and the new compute copy, which then travels to its
// home: host->device when it lives on the device, host->NVMe on NVMe.
// Limits: NVMe-homed params are assumed not to stay cached in host memory
// between forward and backward; such a cache would halve those reads.
namespace {

void Add(std::vector<Transfer>* out, Link link, Role role,
         std::string_view what, uint64_t bytes) {
  if (bytes > 0) out->push_back({link, role, what, bytes});
}

uint64_t RoleBytes(const Placement& p, Role role) {
  return p.roles[Index(role)].bytes;
}

// Forward and backward: fetching the compute copy, draining gradients.
void AddComputeTraffic(const Placement& p, std::vector<Transfer>* out) {
  const Tier params = p.TierOf(Role::kParams);
  const uint64_t param_bytes = RoleBytes(p, Role::kParams);
  for (std::string_view pass : {"forward", "backward"}) {
    if (params == Tier::kNvme) {
      Add(out, Link::kNvmeToHost, Role::kParams, pass, param_bytes);
    }
    if (params != Tier::kDevice) {
      Add(out, Link::kHostToDevice, Role::kParams, pass, param_bytes);
    }
  }
  const uint64_t grad_bytes = RoleBytes(p, Role::kGrads);
  Add(out, Link::kDeviceToHost, Role::kGrads, "to the CPU optimizer",
      grad_bytes);
  if (p.TierOf(Role::kGrads) == Tier::kNvme) {
    Add(out, Link::kHostToNvme, Role::kGrads, "to their home", grad_bytes);
    Add(out, Link::kNvmeToHost, Role::kGrads, "optimizer read", grad_bytes);
  }
}

// The optimizer step: state in, the fused pass, state and params out.
void AddOptimizerTraffic(const Placement& p, std::vector<Transfer>* out) {
  constexpr Role kState[] = {Role::kMaster, Role::kOptimState};
  for (Role role : kState) {
    if (p.TierOf(role) == Tier::kNvme) {
      Add(out, Link::kNvmeToHost, role, "optimizer read", RoleBytes(p, role));
    }
  }
  Add(out, Link::kHostMemory, Role::kGrads, "optimizer reads",
      RoleBytes(p, Role::kGrads));
  for (Role role : kState) {
    Add(out, Link::kHostMemory, role, "optimizer reads and writes",
        2 * RoleBytes(p, role));
  }
  Add(out, Link::kHostMemory, Role::kParams, "optimizer writes",
      RoleBytes(p, Role::kParams));
  for (Role role : kState) {
    if (p.TierOf(role) == Tier::kNvme) {
      Add(out, Link::kHostToNvme, role, "optimizer write-back",
          RoleBytes(p, role));
    }
  }
  const Tier params = p.TierOf(Role::kParams);
  if (params == Tier::kDevice) {
    Add(out, Link::kHostToDevice, Role::kParams, "after the optimizer",
        RoleBytes(p, Role::kParams));
  } else if (params == Tier::kNvme) {
    Add(out, Link::kHostToNvme, Role::kParams, "after the optimizer",
        RoleBytes(p, Role::kParams));
  }
}

}  // namespace

std::vector<Transfer> StepTraffic(const Model& model,
                                  const Placement& placement) {
  CheckModel(model);
  std::vector<Transfer> out;
  AddComputeTraffic(placement, &out);
  AddOptimizerTraffic(placement, &out);
  return out;
}

std::array<uint64_t, kNumLinks> LinkBytes(
    const std::vector<Transfer>& traffic) {
  std::array<uint64_t, kNumLinks> out = {};
  for (const Transfer& t : traffic) {
    out[Index(t.link)] += t.bytes;
    // Every transfer but a collective (device to device under NCCL) reads
    // or writes its bytes in host DRAM once.
    if (t.link != Link::kHostMemory && t.link != Link::kNetwork) {
      out[Index(Link::kHostMemory)] += t.bytes;
    }
  }
  return out;
}

Model RankModel(const Model& model, uint64_t gpus) {
  CheckModel(model);
  STRATA_CHECK(gpus >= 1 && gpus <= kMaxGpus);
  Model rank = model;
  rank.params = (model.params + gpus - 1) / gpus;
  return rank;
}

// Note [Collectives]
// Why: with N ranks a step also moves bytes between them, and on a slow
// network those bytes, not PCIe or the drive, can set the step time.
// How: strata.torch shards every role (ZeRO-3; Note [Partitions] in
// python/strata/torch/ranks.py): each rank all-gathers the compute copy of a
// group before forward and again before backward, and reduce-scatters the
// group's gradients once they are final. Ring algorithms (NCCL's) move
// (N-1)/N of the gathered or reduced buffer through each rank's link, that
// is (N-1) times the rank's share of b*Ψ, in each direction at once; the
// network is counted full duplex like PCIe.
// Limits: stages 1 and 2 instead all-gather the updated shard once after the
// step and keep the compute copy whole; gloo all-reduces the gradients
// (twice the bytes); padding to aligned shards is ignored.
std::vector<Transfer> CollectiveTraffic(const Model& rank_model,
                                        uint64_t gpus) {
  CheckModel(rank_model);
  STRATA_CHECK(gpus >= 1 && gpus <= kMaxGpus);
  std::vector<Transfer> out;
  const uint64_t params =
      (gpus - 1) * rank_model.params * BytesPerParam(rank_model, Role::kParams);
  const uint64_t grads =
      (gpus - 1) * rank_model.params * BytesPerParam(rank_model, Role::kGrads);
  Add(&out, Link::kNetwork, Role::kParams, "all-gather, forward", params);
  Add(&out, Link::kNetwork, Role::kParams, "all-gather, backward", params);
  Add(&out, Link::kNetwork, Role::kGrads, "reduce-scatter", grads);
  return out;
}

// Note [The drive is one resource]
// PCIe carries host->device and device->host at once (full duplex), but an
// NVMe drive serves reads and writes from the same controller and flash:
// under a mix each gets a share of the time, not its solo rate. Measured
// on the reference machine (docs/PERF.md, strata-sim): alone, reads 2.23
// and writes 3.13 GB/s; the optimizer's even mix moved 2.2 GB/s in all,
// below the 2.6 GB/s that taking turns predicts and far from the 5.4 that
// two independent links would; fio's read and write jobs run together did
// the work of 12.1 s of turns in 10 s. So the floor charges the drive read
// seconds plus write seconds. A drive can beat that by what it overlaps
// (fio: a fifth here), so it is a floor only up to that; the independent-
// links figure was not a floor of anything this drive could do.
Floor StepFloor(const Model& model,
                const std::array<uint64_t, kNumLinks>& link_bytes,
                const Bandwidths& bandwidths) {
  CheckModel(model);
  STRATA_CHECK(bandwidths.adam_gparams > 0);
  Floor floor;
  for (Link link : kLinks) {
    const double gbps = bandwidths.gbps[Index(link)];
    STRATA_CHECK(gbps > 0);
    const double seconds = link_bytes[Index(link)] / (gbps * 1e9);
    floor.link_seconds[Index(link)] = seconds;
    if (seconds > floor.transfer_seconds) {
      floor.transfer_seconds = seconds;
      floor.transfer_binding = link;
    }
  }
  const double read = floor.link_seconds[Index(Link::kNvmeToHost)];
  const double write = floor.link_seconds[Index(Link::kHostToNvme)];
  floor.nvme_seconds = read + write;
  if (read > 0 && write > 0 && floor.nvme_seconds > floor.transfer_seconds) {
    floor.nvme_binds = true;
    floor.transfer_seconds = floor.nvme_seconds;
    floor.transfer_binding =
        read >= write ? Link::kNvmeToHost : Link::kHostToNvme;
  }
  floor.optimizer_seconds = model.params / (bandwidths.adam_gparams * 1e9);
  floor.optimizer_binds = floor.optimizer_seconds > floor.transfer_seconds;
  floor.seconds = std::max(floor.transfer_seconds, floor.optimizer_seconds);
  return floor;
}

std::string TransferBindingName(const Floor& floor) {
  return floor.nvme_binds ? "NVMe (reads + writes)"
                          : std::string(LinkName(floor.transfer_binding));
}

std::string BindingName(const Floor& floor) {
  return floor.optimizer_binds ? "CPU optimizer" : TransferBindingName(floor);
}

std::string_view TransferBindingKey(const Floor& floor) {
  return floor.nvme_binds ? "nvme" : LinkKey(floor.transfer_binding);
}

std::string_view BindingKey(const Floor& floor) {
  return floor.optimizer_binds ? "optimizer" : TransferBindingKey(floor);
}

// The search keeps fits(lo) and !fits(hi), so the answer fits and one more
// parameter does not, whatever the shape of fits() in between.
std::optional<uint64_t> LargestModel(const Model& model,
                                     const Budgets& budgets) {
  const auto& host = budgets[Index(Tier::kHost)];
  const auto& nvme = budgets[Index(Tier::kNvme)];
  if (!host || !nvme) return std::nullopt;
  Model probe = model;
  auto fits = [&](uint64_t params) {
    probe.params = params;
    return Place(probe, budgets).fits();
  };
  // Master and m/v (K bytes a parameter) can live only on host or NVMe.
  uint64_t lo = 0;
  uint64_t hi = (*host + *nvme) / model.k + 1;
  STRATA_CHECK(hi <= kMaxParams && !fits(hi));
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

uint64_t ZeroBytesPerGpu(const Model& model, int stage, uint64_t gpus) {
  CheckModel(model);
  STRATA_CHECK(stage >= 0 && stage < kNumZeroStages);
  STRATA_CHECK(gpus >= 1 && gpus <= kMaxGpus);
  const uint64_t b = DTypeSize(model.dtype);
  // Per parameter, the bytes split N ways (optimizer state from stage 1,
  // gradients from stage 2, the compute copy at stage 3) and the bytes every
  // GPU holds whole.
  const uint64_t all = 2 * b + model.k;
  const uint64_t partitioned[] = {0, model.k, b + model.k, all};
  const uint64_t replicated = all - partitioned[stage];
  using U128 = unsigned __int128;
  const U128 numerator = U128{replicated} * model.params * gpus +
                         U128{partitioned[stage]} * model.params;
  return static_cast<uint64_t>((numerator + gpus - 1) / gpus);
}

std::string ZeroFormula(DType dtype, int stage) {
  STRATA_CHECK(stage >= 0 && stage < kNumZeroStages);
  const std::string b = std::to_string(DTypeSize(dtype));
  switch (stage) {
    case 0:
      return "(" + b + "+" + b + "+K)Ψ";
    case 1:
      return b + "Ψ+" + b + "Ψ+KΨ/N";
    case 2:
      return b + "Ψ+(" + b + "+K)Ψ/N";
    default:
      return "(" + b + "+" + b + "+K)Ψ/N";
  }
}

Plan MakePlan(const Model& model, const Budgets& budgets,
              const Bandwidths& bandwidths, uint64_t gpus) {
  Plan plan;
  plan.model = model;
  plan.budgets = budgets;
  plan.bandwidths = bandwidths;
  plan.gpus = gpus;
  plan.rank_model = RankModel(model, gpus);
  plan.placement = Place(plan.rank_model, budgets);
  plan.shortfalls = Shortfalls(plan.placement, budgets);
  plan.traffic = StepTraffic(plan.rank_model, plan.placement);
  for (const Transfer& t : CollectiveTraffic(plan.rank_model, gpus)) {
    plan.traffic.push_back(t);
  }
  plan.link_bytes = LinkBytes(plan.traffic);
  plan.floor = StepFloor(plan.rank_model, plan.link_bytes, bandwidths);
  plan.largest_model = LargestModel(model, budgets);
  if (plan.largest_model) {  // every rank's budgets hold a share
    plan.largest_model = *plan.largest_model > kMaxParams / gpus
                             ? kMaxParams
                             : *plan.largest_model * gpus;
  }
  for (int stage = 0; stage < kNumZeroStages; ++stage) {
    plan.zero_bytes[stage] = ZeroBytesPerGpu(model, stage, gpus);
  }
  return plan;
}

}  // namespace strata::plan
