// Conversions between the C ABI's structs and the C++ API. See
// convert.h.
#include "src/capi/convert.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>

namespace strata::capi {
namespace {

// Note [Struct versions]
// Structs that may grow start with struct_size. An input from a caller
// built against an older strata.h is shorter: the fields it has are read
// and the rest keep their defaults. One from a newer strata.h is rejected,
// since this library cannot honour fields it does not know. Outputs fill
// what both sides know and report that size back. `v1_size` is the size of
// the first released layout, the smallest this library accepts.
template <typename T>
Result<T> ReadVersioned(const T& in, const T& defaults, size_t v1_size,
                        const char* type) {
  if (in.struct_size < v1_size || in.struct_size > sizeof(T)) {
    return Status::InvalidArgument(
        std::string(type) + ".struct_size is " +
        std::to_string(in.struct_size) + "; this libstrata accepts " +
        std::to_string(v1_size) + " to " + std::to_string(sizeof(T)) +
        " bytes; fill the struct with its _init function and "
        "build against this library's strata.h");
  }
  T out = defaults;
  std::memcpy(&out, &in, in.struct_size);
  return out;
}

template <typename T>
Status WriteVersioned(T value, size_t v1_size, const char* type, T* out) {
  if (out->struct_size < v1_size) {
    return Status::InvalidArgument(std::string(type) + ".struct_size is " +
                                   std::to_string(out->struct_size) +
                                   "; set it to sizeof(" + type +
                                   ") before the call");
  }
  const uint32_t filled = std::min<uint32_t>(out->struct_size, sizeof(T));
  value.struct_size = filled;
  std::memcpy(out, &value, filled);
  return Status::Ok();
}

// The first released layouts.
// Options gained state_format after v1.
constexpr size_t kOptionsV1Size = offsetof(strata_engine_options, state_format);
constexpr size_t kEngineInfoV1Size = sizeof(strata_engine_info);
// Stats gained update_wait_seconds after v1.
constexpr size_t kStatsV1Size =
    offsetof(strata_engine_stats, update_wait_seconds);
constexpr size_t kGroupSpecV1Size = sizeof(strata_group_spec);
constexpr size_t kTensorInfoV1Size = sizeof(strata_tensor_info);
constexpr size_t kOptimizerOptionsV1Size = sizeof(strata_optimizer_options);
constexpr size_t kStepHyperV1Size = sizeof(strata_step_hyper);
// The step report gained overflow_group after v1.
constexpr size_t kStepReportV1Size =
    offsetof(strata_step_report, overflow_group);
constexpr size_t kAbortReportV1Size = sizeof(strata_abort_report);
constexpr size_t kGradientsInfoV1Size = sizeof(strata_gradients_info);

// `device_roles` 0 is every role: the layouts before the field's name had
// 0 in its place.
Result<Placement> ToPlacement(const int32_t (&home)[kNumRoles],
                              uint32_t device_roles, const char* owner) {
  Placement placement;
  for (int r = 0; r < kNumRoles; ++r) {
    STRATA_RETURN_IF_ERROR(ValidTier(home[r]));
    placement.home[r] = static_cast<Tier>(home[r]);
  }
  if ((device_roles & ~kAllRoles) != 0) {
    return Status::InvalidArgument(
        std::string(owner) + "->device_roles " + std::to_string(device_roles) +
        " has bits that are no role; use STRATA_ROLE_BIT(role) of "
        "strata_role values, or 0 for every role");
  }
  placement.device_roles = device_roles == 0 ? kAllRoles : device_roles;
  return placement;
}

Result<EngineOptions> ToEngineOptions(const strata_engine_options& c) {
  EngineOptions cc;
  switch (c.device) {
    case STRATA_DEVICE_AUTO:
      cc.device = "auto";
      break;
    case STRATA_DEVICE_CUDA:
      cc.device = "cuda";
      break;
    case STRATA_DEVICE_HOST:
      cc.device = "host";
      break;
    default:
      return Status::InvalidArgument(
          "options->device " + std::to_string(c.device) +
          " is not a strata_device_kind; use STRATA_DEVICE_AUTO, "
          "STRATA_DEVICE_CUDA or STRATA_DEVICE_HOST");
  }
  STRATA_ASSIGN_OR_RETURN(cc.placement,
                          ToPlacement(c.home, c.device_roles, "options"));
  cc.cuda_device = c.cuda_device;
  cc.device_budget = c.device_budget;
  cc.host_budget = c.host_budget;
  cc.nvme_budget = c.nvme_budget;
  cc.swap_dir = c.swap_dir != nullptr ? c.swap_dir : "";
  cc.swap_files = c.swap_files;
  cc.io_threads = c.io_threads;
  cc.prefetch = c.prefetch != 0;
  cc.lock_host = c.lock_host != 0;
  cc.numa_node = c.numa_node;
  cc.bandwidths = {c.host_to_device_gbps, c.device_to_host_gbps,
                   c.nvme_read_gbps, c.nvme_write_gbps};
  if (c.state_format < STRATA_STATE_FP32 ||
      c.state_format > STRATA_STATE_INT8) {
    return Status::InvalidArgument(
        "options->state_format " + std::to_string(c.state_format) +
        " is not a strata_state_format; use STRATA_STATE_FP32, "
        "STRATA_STATE_BF16 or STRATA_STATE_INT8");
  }
  cc.state_format = static_cast<StateFormat>(c.state_format);
  return cc;
}

Result<TensorSpec> ToTensorSpec(const strata_tensor_spec& c, int index) {
  const std::string where = "spec->tensors[" + std::to_string(index) + "]";
  if (c.name == nullptr) {
    return Status::InvalidArgument(where + ".name is NULL");
  }
  if (c.ndim < 0 || (c.ndim > 0 && c.shape == nullptr)) {
    return Status::InvalidArgument(
        where + " has ndim " + std::to_string(c.ndim) +
        (c.shape == nullptr ? " and a NULL shape" : "") +
        "; pass ndim >= 0 and ndim extents");
  }
  if (c.dtype < 0 || c.dtype > STRATA_DTYPE_FLOAT16) {
    return Status::InvalidArgument(where + ".dtype " + std::to_string(c.dtype) +
                                   " is not a strata_dtype");
  }
  STRATA_RETURN_IF_ERROR(ValidRoles(c.roles));
  TensorSpec cc;
  cc.name = c.name;
  cc.shape.assign(c.shape, c.shape + c.ndim);
  for (int64_t extent : cc.shape) {
    if (extent < 0) {
      return Status::InvalidArgument(where + " '" + cc.name +
                                     "' has the negative extent " +
                                     std::to_string(extent));
    }
  }
  cc.dtype = static_cast<DType>(c.dtype);
  cc.roles = c.roles;
  return cc;
}

Result<GroupSpec> ToGroupSpec(const strata_group_spec& c) {
  if (c.name == nullptr) return Status::InvalidArgument("spec->name is NULL");
  if (c.num_tensors < 0 || (c.num_tensors > 0 && c.tensors == nullptr)) {
    return Status::InvalidArgument(
        "spec->num_tensors is " + std::to_string(c.num_tensors) +
        (c.tensors == nullptr ? " and spec->tensors is NULL" : "") +
        "; pass num_tensors >= 0 specs");
  }
  GroupSpec cc;
  cc.name = c.name;
  for (int i = 0; i < c.num_tensors; ++i) {
    STRATA_ASSIGN_OR_RETURN(TensorSpec tensor, ToTensorSpec(c.tensors[i], i));
    cc.tensors.push_back(std::move(tensor));
  }
  cc.use_default_placement = c.use_default_placement != 0;
  if (!cc.use_default_placement) {
    STRATA_ASSIGN_OR_RETURN(cc.placement,
                            ToPlacement(c.home, c.device_roles, "spec"));
  }
  return cc;
}

strata_engine_stats ToCStats(const EngineStats& cc) {
  strata_engine_stats c = {};
  for (int t = 0; t < kNumTiers; ++t) {
    c.tiers[t] = {cc.tiers[t].budget, cc.tiers[t].used, cc.tiers[t].peak};
    for (int to = 0; to < kNumTiers; ++to) c.bytes[t][to] = cc.bytes[t][to];
  }
  c.fetches = cc.fetches;
  c.hits = cc.hits;
  c.prefetch_hits = cc.prefetch_hits;
  c.late_prefetches = cc.late_prefetches;
  c.prefetches = cc.prefetches;
  c.evictions = cc.evictions;
  c.writebacks = cc.writebacks;
  c.trace_invalidations = cc.trace_invalidations;
  c.steps = cc.steps;
  c.stall_seconds = cc.stall_seconds;
  c.update_wait_seconds = cc.update_wait_seconds;
  c.abandoned_prefetches = cc.abandoned_prefetches;
  for (int r = 0; r < kNumRoles; ++r) {
    for (int t = 0; t < kNumTiers; ++t) {
      for (int to = 0; to < kNumTiers; ++to) {
        c.role_bytes[r][t][to] = cc.role_bytes[r][t][to];
      }
    }
  }
  c.discarded_bytes = cc.discarded_bytes;
  c.nvme_bytes_hashed = cc.nvme_bytes_hashed;
  return c;
}

}  // namespace

Status NonNull(std::initializer_list<Arg> args) {
  for (const Arg& arg : args) {
    if (arg.pointer == nullptr) {
      return Status::InvalidArgument(std::string("argument '") + arg.name +
                                     "' is NULL; pass a valid pointer");
    }
  }
  return Status::Ok();
}

Status ValidTier(int32_t tier) {
  if (tier >= 0 && tier < kNumTiers) return Status::Ok();
  return Status::InvalidArgument(
      "tier " + std::to_string(tier) +
      " is not a strata_tier; use STRATA_TIER_DEVICE (0), "
      "STRATA_TIER_HOST (1) or STRATA_TIER_NVME (2)");
}

Status ValidRole(int32_t role) {
  if (role >= 0 && role < kNumRoles) return Status::Ok();
  return Status::InvalidArgument(
      "role " + std::to_string(role) +
      " is not a strata_role; use STRATA_ROLE_COMPUTE (0) .. "
      "STRATA_ROLE_GRAD (4)");
}

Status ValidRoles(uint32_t roles) {
  if (roles != 0 && (roles & ~kAllRoles) == 0) return Status::Ok();
  return Status::InvalidArgument(
      "role mask " + std::to_string(roles) +
      " is not a non-empty set of STRATA_ROLE_BIT(role); use "
      "STRATA_ALL_ROLES for every role");
}

Status ValidGroup(const Engine& engine, int32_t group) {
  const int count = engine.group_count();
  if (group >= 0 && group < count) return Status::Ok();
  return Status::InvalidArgument("group " + std::to_string(group) +
                                 " does not exist; " + std::to_string(count) +
                                 " groups are registered; pass an id from "
                                 "strata_group_register");
}

Status ValidTensorIndex(size_t count, int32_t index, const char* what,
                        const char* count_fn) {
  if (index >= 0 && static_cast<size_t>(index) < count) return Status::Ok();
  return Status::InvalidArgument(
      "tensor index " + std::to_string(index) + " is out of range; the " +
      what + " has " + std::to_string(count) + " tensors (" + count_fn + ")");
}

strata_engine_options DefaultOptions() {
  const EngineOptions cc;
  strata_engine_options c = {};
  c.struct_size = sizeof(c);
  c.device = STRATA_DEVICE_AUTO;
  c.cuda_device = cc.cuda_device;
  c.swap_files = cc.swap_files;
  c.device_budget = cc.device_budget;
  c.host_budget = cc.host_budget;
  c.nvme_budget = cc.nvme_budget;
  c.swap_dir = nullptr;
  for (int r = 0; r < kNumRoles; ++r) {
    c.home[r] = static_cast<int32_t>(cc.placement.home[r]);
  }
  c.io_threads = cc.io_threads;
  c.prefetch = cc.prefetch;
  c.lock_host = cc.lock_host;
  c.numa_node = cc.numa_node;
  c.host_to_device_gbps = cc.bandwidths.host_to_device;
  c.device_to_host_gbps = cc.bandwidths.device_to_host;
  c.nvme_read_gbps = cc.bandwidths.nvme_read;
  c.nvme_write_gbps = cc.bandwidths.nvme_write;
  c.state_format = static_cast<int32_t>(cc.state_format);
  return c;
}

Result<EngineOptions> ReadOptions(const strata_engine_options& options) {
  STRATA_ASSIGN_OR_RETURN(
      auto c, ReadVersioned(options, DefaultOptions(), kOptionsV1Size,
                            "strata_engine_options"));
  return ToEngineOptions(c);
}

strata_group_spec DefaultGroupSpec() {
  strata_group_spec c = {};
  c.struct_size = sizeof(c);
  c.use_default_placement = 1;
  const Placement placement;
  for (int r = 0; r < kNumRoles; ++r) {
    c.home[r] = static_cast<int32_t>(placement.home[r]);
  }
  return c;
}

Result<GroupSpec> ReadGroupSpec(const strata_group_spec& spec) {
  STRATA_ASSIGN_OR_RETURN(
      auto c, ReadVersioned(spec, DefaultGroupSpec(), kGroupSpecV1Size,
                            "strata_group_spec"));
  return ToGroupSpec(c);
}

Status WriteEngineInfo(const EngineInfo& info, int cuda_device,
                       strata_engine_info* out) {
  strata_engine_info c = {};
  c.on_cuda = info.device == "cuda";
  c.cuda_device = cuda_device;
  c.host_locked = info.host_locked;
  c.device = info.device.c_str();
  c.device_name = info.device_name.c_str();
  c.device_reason = info.device_reason.c_str();
  c.host_backing = info.host_backing.c_str();
  c.aio_backend = info.aio_backend.c_str();
  return WriteVersioned(c, kEngineInfoV1Size, "strata_engine_info", out);
}

Status WriteStats(const EngineStats& stats, strata_engine_stats* out) {
  return WriteVersioned(ToCStats(stats), kStatsV1Size, "strata_engine_stats",
                        out);
}

Status WriteTensorInfo(const TensorView& view, strata_tensor_info* out) {
  strata_tensor_info c = {};
  c.role = static_cast<int32_t>(view.role);
  c.dtype = static_cast<int32_t>(view.dtype);
  c.ndim = static_cast<int32_t>(view.shape.size());
  c.name = view.name.c_str();
  c.shape = view.shape.data();
  c.data = view.data;
  c.bytes = view.bytes;
  c.tier = static_cast<int32_t>(view.tier);
  c.on_cuda = view.on_cuda;
  return WriteVersioned(c, kTensorInfoV1Size, "strata_tensor_info", out);
}

strata_optimizer_options DefaultOptimizerOptions() {
  const OffloadOptimizerOptions cc;
  strata_optimizer_options c = {};
  c.struct_size = sizeof(c);
  c.algo = static_cast<int32_t>(cc.algo);
  c.mode = static_cast<int32_t>(cc.mode);
  c.micro_batches = cc.micro_batches;
  c.skip_on_overflow = cc.skip_on_overflow;
  c.threads = cc.threads;
  c.grad_buffers = cc.grad_buffers;
  c.read_ahead = cc.read_ahead;
  c.speculate = cc.speculate;
  c.clip_norm = cc.clip_norm;
  return c;
}

Result<OffloadOptimizerOptions> ReadOptimizerOptions(
    const strata_optimizer_options& options) {
  STRATA_ASSIGN_OR_RETURN(
      auto c,
      ReadVersioned(options, DefaultOptimizerOptions(), kOptimizerOptionsV1Size,
                    "strata_optimizer_options"));
  if (c.algo < STRATA_ALGO_ADAM || c.algo > STRATA_ALGO_LION) {
    return Status::InvalidArgument(
        "strata_optimizer_options.algo is " + std::to_string(c.algo) +
        "; use a strata_optim_algo value (STRATA_ALGO_ADAM .. _LION)");
  }
  if (c.mode != STRATA_MODE_OVERLAP && c.mode != STRATA_MODE_AFTER_BACKWARD) {
    return Status::InvalidArgument(
        "strata_optimizer_options.mode is " + std::to_string(c.mode) +
        "; use STRATA_MODE_OVERLAP or STRATA_MODE_AFTER_BACKWARD");
  }
  if (c.reserved != 0) {
    return Status::InvalidArgument(
        "strata_optimizer_options.reserved must be 0; fill the struct with "
        "strata_optimizer_options_init");
  }
  OffloadOptimizerOptions cc;
  cc.algo = static_cast<OptimAlgo>(c.algo);
  cc.mode = static_cast<OptimMode>(c.mode);
  cc.micro_batches = c.micro_batches;
  cc.clip_norm = c.clip_norm;
  cc.skip_on_overflow = c.skip_on_overflow != 0;
  cc.threads = c.threads;
  cc.grad_buffers = c.grad_buffers;
  cc.read_ahead = c.read_ahead;
  cc.speculate = c.speculate != 0;
  return cc;
}

strata_step_hyper DefaultStepHyper() {
  const StepHyper cc;
  strata_step_hyper c = {};
  c.struct_size = sizeof(c);
  c.lr = cc.lr;
  c.beta1 = cc.beta1;
  c.beta2 = cc.beta2;
  c.eps = cc.eps;
  c.weight_decay = cc.weight_decay;
  c.lr_decay = cc.lr_decay;
  c.loss_scale = cc.loss_scale;
  return c;
}

Result<StepHyper> ReadStepHyper(const strata_step_hyper& hyper) {
  STRATA_ASSIGN_OR_RETURN(
      auto c, ReadVersioned(hyper, DefaultStepHyper(), kStepHyperV1Size,
                            "strata_step_hyper"));
  return StepHyper{.lr = c.lr,
                   .beta1 = c.beta1,
                   .beta2 = c.beta2,
                   .eps = c.eps,
                   .weight_decay = c.weight_decay,
                   .lr_decay = c.lr_decay,
                   .loss_scale = c.loss_scale};
}

Status CheckStepReport(const strata_step_report& out) {
  if (out.struct_size >= kStepReportV1Size) return Status::Ok();
  return Status::InvalidArgument(
      "strata_step_report.struct_size is " + std::to_string(out.struct_size) +
      "; set it to sizeof(strata_step_report) before the call");
}

Status WriteStepReport(const OptimStepReport& report, strata_step_report* out) {
  strata_step_report c = {};
  c.skipped = report.skipped;
  c.step = report.step;
  c.grad_norm = report.grad_norm;
  c.clip_coef = report.clip_coef;
  c.step_seconds = report.step_seconds;
  c.hidden_seconds = report.hidden_seconds;
  c.finish_wait_seconds = report.finish_wait_seconds;
  c.acquire_wait_seconds = report.acquire_wait_seconds;
  c.speculated = report.speculated;
  c.undone = report.undone;
  c.overflow_group = report.overflow_group;
  return WriteVersioned(c, kStepReportV1Size, "strata_step_report", out);
}

Status WriteAbortReport(const OptimAbortReport& report,
                        strata_abort_report* out) {
  strata_abort_report c = {};
  c.applied = report.applied;
  c.completed = report.completed;
  c.skipped = report.step.skipped;
  c.overflow_group = report.step.overflow_group;
  c.grad_norm = report.step.grad_norm;
  return WriteVersioned(c, kAbortReportV1Size, "strata_abort_report", out);
}

Status WriteGradientsInfo(const GradientBuffer& buffer,
                          strata_gradients_info* out) {
  strata_gradients_info c = {};
  c.group = buffer.group;
  c.data = buffer.data;
  c.bytes = buffer.bytes;
  c.on_cuda = buffer.on_cuda;
  c.num_tensors = static_cast<int32_t>(buffer.tensors.size());
  return WriteVersioned(c, kGradientsInfoV1Size, "strata_gradients_info", out);
}

}  // namespace strata::capi
