// Engine: wiring only. The tiers hold bytes, the residency manager decides
// where they are, the trace and the planner say what comes next, and the
// executor moves it ahead of time.
#include "strata/engine.h"

#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include "common/enum_array.h"
#include "src/ckpt/checkpoint.h"
#include "src/sched/executor.h"
#include "src/sched/planner.h"
#include "src/store/engine_internal.h"
#include "src/store/layout.h"
#include "src/store/pending_updates.h"
#include "src/store/residency.h"
#include "src/tier/device.h"
#include "src/tier/nvme_store.h"
#include "src/tier/pinned_pool.h"
#include "src/transport/mover.h"
#include "strata/aio.h"

namespace strata {

namespace {

// Who asked for a prefetch: the plan, or the caller (Engine::Prefetch).
enum class PrefetchBy { kPlan = 0, kCaller = 1 };

// The executor's de-duplication key for a prefetch; planned and explicit
// prefetches of the same group are queued separately.
uint64_t PrefetchKey(int group, Tier tier, RoleMask roles, PrefetchBy by) {
  return (static_cast<uint64_t>(by) << 63) |
         (static_cast<uint64_t>(group) << 8) |
         (static_cast<uint64_t>(tier) << 5) | roles;
}

}  // namespace

class Engine::Impl {
 public:
  Status Open(const EngineOptions& options, const internal::EngineHooks& hooks);
  Result<int> Register(const GroupSpec& spec);
  Result<GroupView> Fetch(int group, Tier tier, const FetchOptions& opt);
  // Engine::Prefetch; `wanted`, when set, is asked when the prefetch runs,
  // and it is skipped when no longer wanted.
  Status Prefetch(int group, Tier tier, RoleMask roles,
                  std::function<bool()> wanted = nullptr);
  Status EndStep();
  std::string Explain() const;
  EngineStats Stats() const;

  // Fixed after Open. The parts are declared in construction order and
  // destroyed in reverse; each locks for itself.
  EngineOptions options_;
  EngineInfo info_;
  std::unique_ptr<aio::Engine> aio_;
  std::unique_ptr<tier::Device> device_;
  std::unique_ptr<tier::PinnedPool> host_;
  std::unique_ptr<tier::NvmeStore> nvme_;
  std::unique_ptr<transport::Mover> mover_;
  std::unique_ptr<store::Residency> residency_;
  std::unique_ptr<sched::Executor> executor_;
  // Updates the optimizer queued and demand fetches wait for.
  store::PendingUpdates pending_;

 private:
  sched::PlanInput MakePlanInput() const;
  void SubmitPrefetches(int position);
  // Note [Updates below the device] in src/store/residency_holds.cc.
  void SubmitRefetch(int group, RoleMask roles, int position);

  // Guarded by plan_mu_: the plan of the last trace adopted, replaced at
  // EndStep while prefetches read it.
  mutable std::mutex plan_mu_;
  sched::PlanInput plan_input_;
  std::shared_ptr<const sched::Plan> plan_;
};

Status Engine::Impl::Open(const EngineOptions& options,
                          const internal::EngineHooks& hooks) {
  options_ = options;
  if (options.device_budget == 0 || options.host_budget == 0) {
    return Status::InvalidArgument(
        "device_budget and host_budget must be > 0 "
        "(--device-budget, --host-budget)");
  }
  if (options.nvme_budget > 0 && options.swap_dir.empty()) {
    return Status::InvalidArgument(
        "nvme_budget is set but swap_dir is empty; pass the swap "
        "directory (--swap-dir)");
  }
  if (options.io_threads < 1 || options.io_threads > 64) {
    return Status::InvalidArgument("io_threads must be in 1..64, not " +
                                   std::to_string(options.io_threads));
  }
  if (options.state_format != StateFormat::kF32 &&
      options.state_format != StateFormat::kBF16 &&
      options.state_format != StateFormat::kQ8) {
    return Status::InvalidArgument(
        "state_format " +
        std::to_string(static_cast<int>(options.state_format)) +
        " is not a StateFormat; use kF32, kBF16 or kQ8");
  }
  STRATA_ASSIGN_OR_RETURN(tier::DeviceKind kind,
                          tier::ParseDeviceKind(options.device));
  aio::IoOptions aio_options;
  aio_options.fault_injector = hooks.fault_injector;
  STRATA_ASSIGN_OR_RETURN(aio_, aio::Engine::Open(aio_options));
  STRATA_ASSIGN_OR_RETURN(
      device_, tier::OpenDevice({.kind = kind,
                                 .budget = options.device_budget,
                                 .cuda_device = options.cuda_device}));
  const tier::DeviceInfo& dev = device_->info();
  tier::PinnedPoolOptions pool;
  pool.budget = options.host_budget;
  pool.numa_node = options.numa_node;
  pool.gpu_numa_node = dev.numa_node;
  pool.lock = options.lock_host ? tier::LockMode::kRequired
                                : tier::LockMode::kBestEffort;
  pool.host_allocator = device_->host_allocator();
  STRATA_ASSIGN_OR_RETURN(host_, tier::PinnedPool::Create(pool, aio_.get()));
  if (options.nvme_budget > 0) {
    STRATA_ASSIGN_OR_RETURN(
        nvme_,
        tier::NvmeStore::Open(aio_.get(), {.dir = options.swap_dir,
                                           .capacity = options.nvme_budget,
                                           .files = options.swap_files}));
  }
  mover_ = std::make_unique<transport::Mover>(device_.get(), nvme_.get());
  residency_ = std::make_unique<store::Residency>(device_.get(), host_.get(),
                                                  nvme_.get(), mover_.get());
  executor_ = std::make_unique<sched::Executor>(options.io_threads);
  if (options.prefetch) {
    residency_->SetRefetchHook([this](int group, RoleMask roles, int position) {
      SubmitRefetch(group, roles, position);
    });
  }
  info_.device = std::string(tier::DeviceKindName(dev.kind));
  info_.device_name = dev.name;
  info_.device_reason = dev.reason;
  info_.host_backing = host_->info().backing;
  info_.host_locked = host_->info().locked;
  info_.aio_backend = std::string(aio::BackendName(aio_->info().backend));
  return Status();
}

Result<int> Engine::Impl::Register(const GroupSpec& spec) {
  STRATA_ASSIGN_OR_RETURN(
      store::GroupLayout layout,
      store::BuildGroupLayout(spec, options_.placement, options_.state_format));
  return residency_->AddGroup(std::move(layout));
}

Result<GroupView> Engine::Impl::Fetch(int group, Tier tier,
                                      const FetchOptions& opt) {
  if (group >= 0 && group < residency_->group_count()) {
    // A discard fetch replaces the bytes a failed update left.
    STRATA_RETURN_IF_ERROR(pending_.Wait(
        group, opt.discard ? store::PendingUpdates::Failed::kIgnore
                           : store::PendingUpdates::Failed::kReport));
  }
  STRATA_ASSIGN_OR_RETURN(store::Residency::Fetched fetched,
                          residency_->Fetch(group, tier, opt));
  if (fetched.position >= 0 && options_.prefetch) {
    SubmitPrefetches(fetched.position);
  }
  const store::GroupLayout& layout = residency_->layout(group);
  GroupView view;
  view.group = group;
  view.tier = tier;
  view.pin = std::move(fetched.pin);
  const bool cuda =
      tier == Tier::kDevice && device_->info().kind == tier::DeviceKind::kCuda;
  for (const store::TensorLayout& t : layout.tensors) {
    for (Role role : kRoles) {
      if ((t.roles & RoleBit(role) & opt.roles) == 0) continue;
      const DType dtype = RoleDType(role, t.dtype, t.state);
      const uint64_t bytes = store::TensorBytes(t, role);
      view.tensors.push_back(
          {t.name, role, dtype,
           dtype == DType::kUInt8 ? std::vector{static_cast<int64_t>(bytes)}
                                  : t.shape,
           fetched.base[role] + t.offset[role], bytes, tier, cuda});
    }
  }
  return view;
}

void Engine::Impl::SubmitPrefetches(int position) {
  std::lock_guard<std::mutex> lock(plan_mu_);
  if (plan_ == nullptr || position >= static_cast<int>(plan_->steps.size())) {
    return;
  }
  store::Residency* residency = residency_.get();
  for (const sched::PlanAction& a : plan_->steps[position].prefetch) {
    const RoleMask roles = plan_input_.trace[a.entry].roles;
    executor_->Submit(PrefetchKey(a.group, a.tier, roles, PrefetchBy::kPlan),
                      [residency, a, roles] {
                        return residency->Prefetch(a.group, a.tier, roles,
                                                   a.entry);
                      });
  }
}

void Engine::Impl::SubmitRefetch(int group, RoleMask roles, int position) {
  store::Residency* residency = residency_.get();
  executor_->Submit(PrefetchKey(group, Tier::kDevice, roles, PrefetchBy::kPlan),
                    [residency, group, roles, position] {
                      return residency->Prefetch(group, Tier::kDevice, roles,
                                                 position);
                    });
}

Status Engine::Impl::Prefetch(int group, Tier tier, RoleMask roles,
                              std::function<bool()> wanted) {
  if (group < 0 || group >= residency_->group_count() || tier == Tier::kNvme) {
    return Status::InvalidArgument(
        "prefetch of group " + std::to_string(group) + " to " +
        std::string(TierName(tier)) + " is not possible");
  }
  store::Residency* residency = residency_.get();
  const uint64_t key = PrefetchKey(group, tier, roles, PrefetchBy::kCaller);
  executor_->Submit(key, [residency, group, tier, roles, wanted] {
    if (wanted && !wanted()) return Status();
    return residency->Prefetch(group, tier, roles, -1);
  });
  return Status();
}

sched::PlanInput Engine::Impl::MakePlanInput() const {
  using Homed = store::Residency::Homed;
  constexpr int kHost = static_cast<int>(Tier::kHost);
  sched::PlanInput in;
  const sched::Trace trace = residency_->TraceSnapshot();
  in.trace = trace.entries();
  in.bandwidths = options_.bandwidths;
  const int groups = residency_->group_count();
  // Roles fetched per tier: a device fetch caches on the device only,
  // except that NVMe-homed chunks pass through the host on their way up.
  std::vector<TierArray<RoleMask>> used(groups);
  for (const sched::TraceEntry& e : in.trace) used[e.group][e.tier] |= e.roles;
  std::array<uint64_t, kNumTiers> homed = {};
  for (int g = 0; g < groups; ++g) {
    sched::PlanGroup pg;
    pg.name = residency_->layout(g).name;
    for (Tier t : {Tier::kDevice, Tier::kHost}) {
      const int i = static_cast<int>(t);
      pg.cached[i] = residency_->GroupBytes(g, t, used[g][t], Homed::kExcluded);
      homed[i] += residency_->GroupBytes(g, t, kAllRoles, Homed::kIncluded) -
                  residency_->GroupBytes(g, t, kAllRoles, Homed::kExcluded);
    }
    const RoleMask dev = used[g][Tier::kDevice];
    const RoleMask host = used[g][Tier::kHost];
    pg.cached[kHost] += residency_->NvmeHomedBytes(g, dev & ~host);
    pg.nvme_homed = residency_->NvmeHomedBytes(g, dev | host);
    in.groups.push_back(std::move(pg));
  }
  sched::SetWindows(options_.device_budget, options_.host_budget, homed, &in);
  in.writes = true;
  return in;
}

Status Engine::Impl::EndStep() {
  std::string diverged;
  const bool adopted = residency_->EndStep(&diverged);
  if (!diverged.empty()) {
    std::fprintf(stderr,
                 "strata: the fetch order changed (%s); re-recording the "
                 "trace\n",
                 diverged.c_str());
  }
  if (!adopted) return Status();
  sched::PlanInput input = MakePlanInput();
  auto plan = std::make_shared<const sched::Plan>(sched::MakePlan(input));
  std::lock_guard<std::mutex> lock(plan_mu_);
  plan_input_ = std::move(input);
  plan_ = std::move(plan);
  return Status();
}

std::string Engine::Impl::Explain() const {
  std::lock_guard<std::mutex> lock(plan_mu_);
  if (plan_ == nullptr) return "no trace yet: the first step records it\n";
  return sched::FormatPlan(plan_input_, *plan_);
}

EngineStats Engine::Impl::Stats() const {
  EngineStats s = residency_->counters();
  const tier::DeviceStats dev = device_->stats();
  const tier::PinnedPoolStats host = host_->stats();
  auto at = [&s](Tier t) -> EngineStats::TierStats& {
    return s.tiers[static_cast<int>(t)];
  };
  at(Tier::kDevice) = {options_.device_budget, dev.used, dev.peak};
  at(Tier::kHost) = {options_.host_budget, host.current, host.peak};
  if (nvme_ != nullptr) {
    const tier::NvmeStoreStats nvme = nvme_->stats();
    at(Tier::kNvme) = {nvme.capacity, nvme.used, nvme.peak};
    s.nvme_bytes_hashed = nvme.bytes_hashed;
  }
  s.bytes = mover_->bytes();
  s.role_bytes = mover_->role_bytes();
  s.update_wait_seconds = pending_.waited_seconds();
  const sched::Trace trace = residency_->TraceSnapshot();
  s.trace_invalidations = trace.invalidations();
  s.steps = trace.steps();
  return s;
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  if (impl_->residency_ != nullptr) impl_->residency_->SetRefetchHook(nullptr);
  if (impl_->executor_ != nullptr) (void)impl_->executor_->Drain();
}

Result<std::unique_ptr<Engine>> Engine::Open(const EngineOptions& options) {
  return internal::EngineAccess::Open(options, {});
}

const EngineInfo& Engine::info() const { return impl_->info_; }

Result<int> Engine::RegisterGroup(const GroupSpec& spec) {
  return impl_->Register(spec);
}

int Engine::group_count() const { return impl_->residency_->group_count(); }

const std::string& Engine::group_name(int group) const {
  return impl_->residency_->layout(group).name;
}

uint64_t Engine::group_bytes(int group, Tier tier) const {
  return impl_->residency_->GroupBytes(group, tier, kAllRoles,
                                       store::Residency::Homed::kIncluded);
}

Result<GroupView> Engine::Fetch(int group, Tier tier, const FetchOptions& opt) {
  return impl_->Fetch(group, tier, opt);
}

Status Engine::Prefetch(int group, Tier tier, RoleMask roles) {
  return impl_->Prefetch(group, tier, roles);
}

Status Engine::Evict(int group, Tier tier) {
  return impl_->residency_->Evict(group, tier);
}

namespace {

// A failed update's error stays with its group (Fetch, Save) or is what a
// Load repairs; an interrupted wait is the caller's news.
Status OnlyCancelled(const Status& waited) {
  return waited.code() == StatusCode::kCancelled ? waited : Status();
}

}  // namespace

Status Engine::Drain() {
  STRATA_RETURN_IF_ERROR(OnlyCancelled(impl_->pending_.WaitAll()));
  return impl_->executor_->Drain();
}

void Engine::BeginStep() { impl_->residency_->BeginStep(); }

Status Engine::EndStep() { return impl_->EndStep(); }

std::string Engine::Explain() const { return impl_->Explain(); }

EngineStats Engine::stats() const { return impl_->Stats(); }

Status Engine::Save(const std::string& dir, const SaveOptions& options) {
  STRATA_RETURN_IF_ERROR(impl_->pending_.WaitAll());
  STRATA_RETURN_IF_ERROR(internal::EngineAccess::FillUnsetMasters(*this));
  return ckpt::Save(*this, *impl_->residency_, impl_->options_, dir, options);
}

Status VerifyCheckpoint(const std::string& dir) {
  return ckpt::Verify(dir).status();
}

Status Engine::Load(const std::string& dir, LoadResult* result) {
  // A failed update is what a Load repairs: its error does not stop it.
  STRATA_RETURN_IF_ERROR(OnlyCancelled(impl_->pending_.WaitAll()));
  STRATA_RETURN_IF_ERROR(ckpt::Load(*this, *impl_->residency_, dir, result));
  impl_->pending_.ClearFailed();
  return Status();
}

namespace internal {

Status EngineAccess::PrefetchWhile(Engine& engine, int group, Tier tier,
                                   RoleMask roles,
                                   std::function<bool()> wanted) {
  return engine.impl_->Prefetch(group, tier, roles, std::move(wanted));
}

EngineParts EngineAccess::Parts(Engine& engine) {
  Engine::Impl* impl = engine.impl_.get();
  return {.device = impl->device_.get(),
          .host = impl->host_.get(),
          .residency = impl->residency_.get(),
          .mover = impl->mover_.get(),
          .pending = &impl->pending_};
}

Result<std::unique_ptr<Engine>> EngineAccess::Open(const EngineOptions& options,
                                                   const EngineHooks& hooks) {
  auto impl = std::make_unique<Engine::Impl>();
  STRATA_RETURN_IF_ERROR(impl->Open(options, hooks));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

}  // namespace internal

}  // namespace strata
