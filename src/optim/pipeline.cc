#include "src/optim/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/cores.h"
#include "common/interrupt.h"
#include "common/text.h"
#include "common/thread_name.h"

namespace strata {
namespace {

FloatType FloatTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return FloatType::kF32;
    case DType::kBFloat16:
      return FloatType::kBF16;
    case DType::kFloat16:
      return FloatType::kF16;
    case DType::kUInt8:  // no compute copy has it
      break;
  }
  STRATA_CHECK(false);
  return FloatType::kF32;
}

}  // namespace

Status OffloadOptimizer::Impl::Init(Engine* engine,
                                    const OffloadOptimizerOptions& options) {
  if (engine == nullptr) {
    return Status::InvalidArgument("the optimizer needs an engine");
  }
  if (options.micro_batches < 1 || options.grad_buffers < 1 ||
      options.read_ahead < 0 || options.threads < 0) {
    return Status::InvalidArgument(fmt::format(
        "micro_batches ({}) and grad_buffers ({}) must be >= 1, read_ahead "
        "({}) and threads ({}) >= 0",
        options.micro_batches, options.grad_buffers, options.read_ahead,
        options.threads));
  }
  if (!(options.clip_norm >= 0) || !std::isfinite(options.clip_norm)) {
    return Status::InvalidArgument(
        fmt::format("clip_norm must be finite and >= 0 (0: off), "
                    "not {}",
                    options.clip_norm));
  }
  engine_ = engine;
  options_ = options;
  parts_ = internal::PartsOf(*engine);
  CpuOptimizerOptions cpu;
  cpu.threads =
      options.threads > 0 ? options.threads : std::max(1, UsableCores() - 1);
  STRATA_ASSIGN_OR_RETURN(cpu_, CpuOptimizer::Create(cpu));
  STRATA_RETURN_IF_ERROR(InspectGroups());
  written_.resize(groups_.size());
  held_for_step_ = std::make_shared<Counts>(groups_.size());
  STRATA_RETURN_IF_ERROR(AddSpares());
  STRATA_RETURN_IF_ERROR(AllocateSlots());
  worker_ = std::thread([this] {
    NameThisThread("strata-optim");
    WorkerLoop();
  });
  writer_ = std::thread([this] {
    NameThisThread("strata-writer");
    WriterLoop();
  });
  return Status();
}

OffloadOptimizer::Impl::~Impl() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    stop_ = true;
    changed_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
  if (writer_.joinable()) writer_.join();
  for (Slot& s : slots_) {
    static_cast<void>(s.d2h.Wait());
    parts_.device->Free(s.device);
    if (s.host != nullptr) parts_.host->Free(s.host);
  }
}

bool OffloadOptimizer::Impl::Deferred() const {
  return options_.mode == OptimMode::kAfterBackward || options_.clip_norm > 0 ||
         options_.skip_on_overflow;
}

bool OffloadOptimizer::Impl::UnderNextForward() const {
  return Deferred() && options_.mode == OptimMode::kOverlap;
}

Status OffloadOptimizer::Impl::InspectGroups() {
  store::Residency& residency = *parts_.residency;
  RoleMask needed =
      RoleBit(Role::kCompute) | RoleBit(Role::kMaster) | RoleBit(Role::kState1);
  if (UsesState2(options_.algo)) needed |= RoleBit(Role::kState2);
  const bool grads = Deferred() || options_.micro_batches > 1;
  if (grads) needed |= kGradBit;
  groups_.resize(residency.group_count());
  int trainable = 0;
  for (int id = 0; id < residency.group_count(); ++id) {
    const store::GroupLayout& layout = residency.layout(id);
    Group& g = groups_[id];
    const bool master = layout.roles & RoleBit(Role::kMaster);
    // Without optimizer state a group is frozen; a master then only keeps
    // its exact fp32 values.
    if ((layout.roles & RoleBit(Role::kState1)) == 0) continue;
    g.in_place = !master;
    const RoleMask roles = master ? needed : needed & ~RoleBit(Role::kMaster);
    STRATA_RETURN_IF_ERROR(CheckTensors(layout, roles, grads));
    if (g.in_place && layout.tensors[0].dtype != DType::kFloat32) {
      return Status::FailedPrecondition(fmt::format(
          "group '{}' has optimizer state but no 'master' role, and its "
          "compute copy is {}: only an fp32 group steps its compute copy "
          "in place; register its tensors with 'master'",
          layout.name, DTypeName(layout.tensors[0].dtype)));
    }
    if (layout.packed_state && !UsesState2(options_.algo)) {
      return Status::FailedPrecondition(fmt::format(
          "group '{}' keeps its optimizer state in int8, which {} cannot "
          "step (Adam and AdamW only); open the engine with fp32 or bf16 "
          "state",
          layout.name, OptimAlgoName(options_.algo)));
    }
    g.trainable = true;
    ++trainable;
    g.n = layout.elements[master ? Role::kMaster : Role::kCompute];
    g.compute = FloatTypeOf(layout.tensors[0].dtype);
    g.compute_bytes = g.n * FloatTypeSize(g.compute);
    g.step_roles = roles & ~kGradBit;
    g.checked = g.step_roles & (RoleBit(g.params()) | RoleBit(Role::kState1) |
                                RoleBit(Role::kState2));
    residency.CheckInPass(id, g.checked);
    ReadHomes(layout, roles, g);
    speculates_ = speculates_ || g.speculative;
  }
  if (trainable == 0) {
    return Status::FailedPrecondition(
        "no group has a 'state1' role, so there is nothing to train; "
        "register trained groups with their optimizer roles");
  }
  return Status();
}

Status OffloadOptimizer::Impl::CheckTensors(const store::GroupLayout& layout,
                                            RoleMask roles, bool grads) const {
  for (const store::TensorLayout& t : layout.tensors) {
    for (int r = 0; r < kNumRoles; ++r) {
      if ((roles & ~t.roles & (1u << r)) == 0) continue;
      return Status::FailedPrecondition(fmt::format(
          "group '{}': tensor '{}' has no '{}' role, which {} needs{}; "
          "register every tensor of a trained group with it (frozen "
          "tensors go in a group without 'state1')",
          layout.name, t.name, RoleName(static_cast<Role>(r)),
          OptimAlgoName(options_.algo),
          grads ? " (with gradient accumulation, deferred steps, clipping "
                  "or overflow skipping)"
                : ""));
    }
    if (t.dtype != layout.tensors[0].dtype) {
      return Status::FailedPrecondition(fmt::format(
          "group '{}' mixes compute dtypes ({} and "
          "{}); the optimizer needs one per group",
          layout.name, DTypeName(t.dtype), DTypeName(layout.tensors[0].dtype)));
    }
  }
  return Status();
}

void OffloadOptimizer::Impl::ReadHomes(const store::GroupLayout& layout,
                                       RoleMask needed, Group& g) const {
  // Only state homed on NVMe keeps its old bytes for an undo, and only a
  // master can restore the compute copy: an in-place step overwrites it.
  g.speculative = UnderNextForward() && options_.speculate && !g.in_place;
  for (const store::ChunkLayout& c : layout.chunks) {
    if ((StateRoles(g) & RoleBit(c.role)) && c.home != Tier::kNvme) {
      g.speculative = false;
    }
    if ((g.step_roles & RoleBit(c.role)) && c.home == Tier::kNvme) {
      g.write_behind = true;
    }
    if ((needed & RoleBit(c.role)) && c.home != Tier::kHost) {
      g.host_working += tier::PinnedPool::SizeClass(c.bytes);
    }
  }
  g.master_unread = g.speculative && g.compute == FloatType::kF32;
}

Status OffloadOptimizer::Impl::AddSpares() {
  store::Residency& residency = *parts_.residency;
  uint64_t total = 0;
  for (size_t id = 0; id < groups_.size(); ++id) {
    if (groups_[id].speculative) {
      total += residency.NvmeHomedBytes(id, StateRoles(groups_[id]));
    }
  }
  for (size_t id = 0; id < groups_.size(); ++id) {
    if (!groups_[id].speculative) continue;
    const Status added = residency.AddSpares(id, StateRoles(groups_[id]));
    if (added.ok()) continue;
    for (size_t g = 0; g < id; ++g) residency.DropSpares(g);
    return Status(
        added.code(),
        fmt::format("speculative steps (clipping or skip_on_overflow in "
                    "overlap mode) keep a second copy on NVMe of the "
                    "optimizer state homed there, {} in all, or set "
                    "speculate = false to step it under the next forward "
                    "instead: {}",
                    HumanBytes(total), added.message()));
  }
  return Status();
}

// Cached copies (of a warm-up pass, a Load) hold room that the buffers
// need, and the buffers come from the allocators, which do not evict: the
// residency manager evicts them first (Note [Eviction order]). On the device,
// the ring lives beside the homes there and the largest fetch, in whole
// allocation units.
Status OffloadOptimizer::Impl::MakeDeviceRoom(uint64_t bytes) {
  const uint64_t unit = parts_.device->info().alignment;
  const uint64_t ring =
      (bytes + unit - 1) / unit * unit * options_.grad_buffers;
  const uint64_t spare = parts_.residency->SpareBytes(Tier::kDevice);
  if (ring > spare) {
    return Status::ResourceExhausted(fmt::format(
        "the device budget has {} beside the roles homed there and the "
        "largest group's fetch, and {} gradient buffers of {} need {}; "
        "raise the device budget by {} or lower grad_buffers",
        HumanBytes(spare), options_.grad_buffers, HumanBytes(bytes),
        HumanBytes(ring), HumanBytes(ring - spare)));
  }
  return parts_.residency->EvictCached(Tier::kDevice);
}

// The host holds the staging ring (`staging` bytes a buffer; none when
// every hand-off is direct), and for the step one group's roles that live
// elsewhere, beside what the host tier is home to (already taken from its
// budget at registration); all in the pool's size classes, as they are
// allocated.
Status OffloadOptimizer::Impl::MakeHostRoom(uint64_t staging) {
  const uint64_t slot = staging == 0 ? 0 : tier::PinnedPool::SizeClass(staging);
  const uint64_t ring = slot * options_.grad_buffers;
  uint64_t working = 0;
  for (const Group& g : groups_) working = std::max(working, g.host_working);
  STRATA_RETURN_IF_ERROR(parts_.residency->EvictCached(Tier::kHost));
  const uint64_t host_free = parts_.host->free_bytes();
  if (ring + working <= host_free) return Status();
  const std::string ring_text =
      ring == 0 ? std::string("no gradient staging (every hand-off is direct)")
                : fmt::format("{} gradient staging buffers of {}",
                              options_.grad_buffers, HumanBytes(slot));
  return Status::ResourceExhausted(
      fmt::format("the host budget has {} left beside the roles homed "
                  "there, and the optimizer needs {}: {} and {} for one "
                  "group's step (its roles homed off the host); raise the "
                  "host budget by {}, lower grad_buffers, or home fewer "
                  "roles on the host",
                  HumanBytes(host_free), HumanBytes(ring + working), ring_text,
                  HumanBytes(working), HumanBytes(ring + working - host_free)));
}

// The bytes of host staging a buffer needs: the largest group whose
// hand-offs are not all direct (Note [Gradients straight into the
// accumulator] in pipeline_worker.cc).
uint64_t OffloadOptimizer::Impl::StagingBytes() const {
  uint64_t bytes = 0;
  for (int id = 0; id < static_cast<int>(groups_.size()); ++id) {
    const bool staged = options_.micro_batches > 1 || !Direct(id, true, true);
    if (groups_[id].trainable && staged) {
      bytes = std::max(bytes, groups_[id].compute_bytes);
    }
  }
  return bytes;
}

Status OffloadOptimizer::Impl::AllocateSlots() {
  uint64_t bytes = 0;
  for (const Group& g : groups_) bytes = std::max(bytes, g.compute_bytes);
  const uint64_t staging = StagingBytes();
  STRATA_RETURN_IF_ERROR(MakeDeviceRoom(bytes));
  STRATA_RETURN_IF_ERROR(MakeHostRoom(staging));
  slots_.resize(options_.grad_buffers);
  for (Slot& s : slots_) {
    Result<void*> device = parts_.device->Allocate(bytes);
    Result<void*> host = !device.ok()   ? Result<void*>(device.status())
                         : staging == 0 ? Result<void*>(nullptr)
                                        : parts_.host->Allocate(staging);
    if (device.ok()) s.device = *device;
    if (host.ok()) s.host = *host;
    if (!host.ok()) {
      return Status::ResourceExhausted(fmt::format(
          "optimizer gradient buffers: {} x {} on the device and "
          "the host do not fit ({}); lower grad_buffers or raise "
          "the budgets",
          options_.grad_buffers, HumanBytes(bytes), host.status().message()));
    }
  }
  return Status();
}

// Note [Waits the caller could end] (src/store/residency_holds.cc), for
// gradient buffers: with every buffer acquired by this thread and none on its
// way back from the worker, only this thread could free one.
Status OffloadOptimizer::Impl::CheckSelfWait(int group) const {
  std::string held;
  for (const Slot& s : slots_) {
    if (s.pending || s.acquirer != std::this_thread::get_id()) {
      return Status();
    }
    held += fmt::format("{}'{}'", held.empty() ? "" : ", ",
                        parts_.residency->layout(s.group).name);
  }
  return Status::FailedPrecondition(fmt::format(
      "AcquireGradients for group '{}': all {} gradient buffers are "
      "acquired by this thread and not handed off (groups {}), so it would "
      "wait for itself; hand one of them off first, or raise grad_buffers "
      "to {}",
      parts_.residency->layout(group).name, slots_.size(), held,
      slots_.size() + 1));
}

Status OffloadOptimizer::Impl::CheckGroupHyper(
    const StepHyper& hyper, const std::vector<GroupHyper>& groups) const {
  if (!(hyper.loss_scale > 0) || !std::isfinite(hyper.loss_scale)) {
    return Status::InvalidArgument(fmt::format(
        "loss_scale must be finite and > 0, not {}", hyper.loss_scale));
  }
  std::vector<bool> seen(groups_.size(), false);
  for (const GroupHyper& g : groups) {
    if (g.group < 0 || g.group >= static_cast<int>(groups_.size()) ||
        !groups_[g.group].trainable || seen[g.group]) {
      return Status::InvalidArgument(fmt::format(
          "BeginStep: group {} in the per-group hyperparameters is not a "
          "trained group, or is named twice",
          g.group));
    }
    seen[g.group] = true;
    if (g.hyper.loss_scale != hyper.loss_scale) {
      return Status::InvalidArgument(fmt::format(
          "BeginStep: group '{}' has loss_scale {}, the step {}: the "
          "gradients are scaled once, so every group shares the step's",
          parts_.residency->layout(g.group).name, g.hyper.loss_scale,
          hyper.loss_scale));
    }
  }
  return Status();
}

OffloadOptimizer::Impl::StepParams OffloadOptimizer::Impl::ParamsOf(
    int group, const StepParams& base) const {
  StepParams out = base;
  out.hyper = group_hyper_[group];
  return out;
}

Status OffloadOptimizer::Impl::BeginStep(
    const StepHyper& hyper, const std::vector<GroupHyper>& groups) {
  STRATA_RETURN_IF_ERROR(CheckGroupHyper(hyper, groups));
  if (in_step_) {
    return Status::FailedPrecondition(
        "BeginStep: the previous step was not finished; call "
        "FinishStep first");
  }
  STRATA_RETURN_IF_ERROR(internal::EngineAccess::FillUnsetMasters(*engine_));
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!error_.ok()) {
      const Status late = std::exchange(error_, Status());
      return Status(late.code(),
                    "work of the last step that ran after FinishStep "
                    "returned failed: " +
                        late.message());
    }
    this_step_.assign(groups_.size(), GroupStep());
    // A step that ended on an error may leave buffers never handed off.
    for (Slot& slot : slots_) slot.acquired = false;
    current_ = {hyper, 1.0f, step_ + 1};
    group_hyper_.assign(groups_.size(), hyper);
    for (const GroupHyper& g : groups) group_hyper_[g.group] = g.hyper;
    finishing_ = false;  // a step that failed in FinishStep left it set
    acquire_wait_ = 0;
    this_order_.clear();
    in_step_ = true;
  }
  // The state of the group stepped first comes in under forward.
  ReadAhead(-1);
  return Status();
}

Result<GradientBuffer> OffloadOptimizer::Impl::Acquire(int group,
                                                       GradientFill fill) {
  if (!in_step_) {
    return Status::FailedPrecondition(
        "AcquireGradients outside a step; call BeginStep first");
  }
  if (group < 0 || group >= static_cast<int>(groups_.size()) ||
      !groups_[group].trainable) {
    return Status::InvalidArgument(
        fmt::format("group {} is not a trained group", group));
  }
  int index = -1;
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (this_step_[group].handoffs >= options_.micro_batches) {
      return Status::FailedPrecondition(
          fmt::format("AcquireGradients: group {} was handed off "
                      "{} times this step (micro_batches); call "
                      "FinishStep",
                      group, this_step_[group].handoffs));
    }
    const Clock::time_point start = Clock::now();
    for (;;) {
      for (size_t i = 0; i < slots_.size() && index < 0; ++i) {
        if (!slots_[i].acquired && !slots_[i].pending) index = i;
      }
      if (index >= 0 || !error_.ok()) break;
      STRATA_RETURN_IF_ERROR(CheckSelfWait(group));
      STRATA_RETURN_IF_ERROR(internal::WaitOnce(
          changed_, lk, "a gradient buffer back from the CPU optimizer"));
    }
    acquire_wait_ += Seconds(Clock::now() - start);
    if (index < 0) return error_;
    slots_[index].acquired = true;
    slots_[index].acquirer = std::this_thread::get_id();
    slots_[index].group = group;
  }
  Slot& s = slots_[index];
  GradientBuffer buffer = BufferOf(group, s.device);
  if (Status st = Fill(buffer, fill); !st.ok()) {
    std::lock_guard<std::mutex> lk(mu_);
    s.acquired = false;
    if (error_.ok()) error_ = st;  // FinishStep ends the step with it
    changed_.notify_all();
    return st;
  }
  return buffer;
}

GradientBuffer OffloadOptimizer::Impl::BufferOf(int group, void* device) const {
  GradientBuffer buffer;
  buffer.group = group;
  buffer.data = device;
  buffer.bytes = groups_[group].compute_bytes;
  buffer.on_cuda = parts_.device->info().kind == tier::DeviceKind::kCuda;
  for (const store::TensorLayout& t : parts_.residency->layout(group).tensors) {
    const uint64_t offset = t.offset[Role::kCompute];
    buffer.tensors.push_back({t.name, Role::kCompute, t.dtype, t.shape,
                              static_cast<char*>(device) + offset,
                              t.elements * DTypeSize(t.dtype), Tier::kDevice,
                              buffer.on_cuda});
  }
  return buffer;
}

// kZeros: the whole buffer. kUnwritten: only the bytes between the tensors
// and after the last, which the step reads as gradients of no parameter.
Status OffloadOptimizer::Impl::Fill(const GradientBuffer& buffer,
                                    GradientFill fill) {
  const auto zero = [&](char* from, char* to) {
    STRATA_CHECK(from <= to);
    return from == to
               ? Status()
               : parts_.mover->Zero(
                     transport::Place::Memory(Tier::kDevice, from), to - from);
  };
  char* begin = static_cast<char*>(buffer.data);
  if (fill == GradientFill::kZeros) return zero(begin, begin + buffer.bytes);
  char* covered = begin;
  for (const TensorView& t : buffer.tensors) {
    STRATA_RETURN_IF_ERROR(zero(covered, static_cast<char*>(t.data)));
    covered = static_cast<char*>(t.data) + t.bytes;
  }
  return zero(covered, begin + buffer.bytes);
}

Status OffloadOptimizer::Impl::HandOff(const GradientBuffer& buffer,
                                       const Fence& after) {
  std::unique_lock<std::mutex> lk(mu_);
  int index = -1;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].device == buffer.data) index = i;
  }
  if (index < 0 || !slots_[index].acquired ||
      slots_[index].group != buffer.group) {
    return Status::InvalidArgument(
        "HandOff: the buffer is not one AcquireGradients returned "
        "(or it was handed off already)");
  }
  const Group& g = groups_[buffer.group];
  GroupStep& now = this_step_[buffer.group];
  if (now.handoffs == options_.micro_batches) {
    return Status::FailedPrecondition(fmt::format(
        "group '{}' was already handed off {} times "
        "this step (micro_batches)",
        parts_.residency->layout(buffer.group).name, options_.micro_batches));
  }
  Slot& s = slots_[index];
  const bool first = now.handoffs == 0;
  const bool final = now.handoffs + 1 == options_.micro_batches;
  const bool direct = Direct(buffer.group, first, final);
  STRATA_ASSIGN_OR_RETURN(s.written, parts_.device->Record(after));
  s.d2h = tier::Event();
  if (!direct) {
    STRATA_ASSIGN_OR_RETURN(
        s.d2h,
        parts_.mover->Start(Role::kGrad,
                            transport::Place::Memory(Tier::kDevice, s.device),
                            transport::Place::Memory(Tier::kHost, s.host),
                            g.compute_bytes, s.written));
  }
  s.acquired = false;
  s.pending = true;
  ++now.handoffs;
  if (final) this_order_.push_back(buffer.group);
  tasks_.push_back({buffer.group, index, first, final, direct,
                    ParamsOf(buffer.group, current_)});
  changed_.notify_all();
  return Status();
}

Status OffloadOptimizer::Impl::Quiesce() {
  if (in_step_) {
    return Status::FailedPrecondition(
        "a checkpoint inside an optimizer step would miss its "
        "updates; call it after FinishStep()");
  }
  std::unique_lock<std::mutex> lk(mu_);
  STRATA_RETURN_IF_ERROR(internal::WaitUntil(
      changed_, lk,
      [this] {
        return tasks_.empty() && running_ == 0 && writes_.empty() &&
               writing_ == 0;
      },
      "the CPU optimizer and its write-behind"));
  return std::exchange(error_, Status());
}

}  // namespace strata
