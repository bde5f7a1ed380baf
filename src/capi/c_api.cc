// The C ABI (strata/strata.h): a thin shim over strata::Engine. It checks
// what C cannot (null pointers, enum values, group ids, struct versions),
// converts, calls the C++ API and turns the Status into a strata_status and
// the thread's last error. No engine logic lives here.
#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include "common/interrupt.h"
#include "src/capi/convert.h"
#include "src/capi/guard.h"
#include "src/capi/handles.h"
#include "strata/dlpack.h"
#include "strata/engine.h"
#include "strata/strata.h"

static_assert(STRATA_VERSION_MAJOR == STRATA_PROJECT_VERSION_MAJOR &&
                  STRATA_VERSION_MINOR == STRATA_PROJECT_VERSION_MINOR &&
                  STRATA_VERSION_PATCH == STRATA_PROJECT_VERSION_PATCH,
              "strata.h's STRATA_VERSION_* must match project() in "
              "CMakeLists.txt");
static_assert(STRATA_NUM_TIERS == strata::kNumTiers &&
              STRATA_NUM_ROLES == strata::kNumRoles &&
              STRATA_ALL_ROLES == strata::kAllRoles);
static_assert(STRATA_INTERNAL ==
                  static_cast<int>(strata::StatusCode::kInternal) &&
              STRATA_CANCELLED ==
                  static_cast<int>(strata::StatusCode::kCancelled));
static_assert(STRATA_STATE_BF16 ==
                  static_cast<int>(strata::StateFormat::kBF16) &&
              STRATA_STATE_INT8 == static_cast<int>(strata::StateFormat::kQ8) &&
              STRATA_DTYPE_UINT8 == static_cast<int>(strata::DType::kUInt8));

using strata::Status;
using strata::capi::CopyText;
using strata::capi::EngineBox;
using strata::capi::EngineTable;
using strata::capi::Guard;
using strata::capi::NonNull;
using strata::capi::ValidGroup;
using strata::capi::ValidRole;
using strata::capi::ValidRoles;
using strata::capi::ValidTier;
using strata::capi::View;
using strata::capi::ViewTable;

namespace {

// A fetch or evict that failed on a view still held: the ones released
// while exports of them live are among those (Note [Exports hold their
// memory]), and the message says so.
Status WithExportHint(const EngineBox& e, Status status) {
  const int pinned = e.deferred.load();
  if (pinned == 0 ||
      (status.code() != strata::StatusCode::kFailedPrecondition &&
       status.code() != strata::StatusCode::kResourceExhausted)) {
    return status;
  }
  return Status(status.code(),
                status.message() + " (" + std::to_string(pinned) +
                    " released views stay fetched while DLPack exports of "
                    "them live: delete the arrays made from them)");
}

// The tensor of a view that an export describes, and what it holds.
template <typename Managed, typename Make>
strata_status ExportAs(const char* fn, const strata_view* view, int32_t index,
                       Managed** out, Make make) {
  return Guard(fn, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{view, "view"}, {out, "out"}}));
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<View> v,
                            ViewTable::Get().Find(view));
    STRATA_RETURN_IF_ERROR(strata::capi::ValidTensorIndex(
        v->group.tensors.size(), index, "view", "strata_view_count_tensors"));
    STRATA_ASSIGN_OR_RETURN(Managed * managed,
                            make(*v, v->group.tensors[index]));
    *out = managed;
    return Status::Ok();
  });
}

}  // namespace

extern "C" {

const char* strata_status_name(strata_status status) {
  return strata::StatusCodeName(static_cast<strata::StatusCode>(status)).data();
}

const char* strata_last_error(void) { return strata::capi::LastError(); }

strata_status strata_set_interrupt_fd(int32_t fd) {
  strata::internal::SetInterruptFd(fd);
  return STRATA_OK;
}

strata_status strata_version_get(int32_t* major, int32_t* minor,
                                 int32_t* patch) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(
        NonNull({{major, "major"}, {minor, "minor"}, {patch, "patch"}}));
    *major = STRATA_VERSION_MAJOR;
    *minor = STRATA_VERSION_MINOR;
    *patch = STRATA_VERSION_PATCH;
    return Status::Ok();
  });
}

strata_status strata_engine_options_init(strata_engine_options* options) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{options, "options"}}));
    *options = strata::capi::DefaultOptions();
    return Status::Ok();
  });
}

strata_status strata_engine_open(const strata_engine_options* options,
                                 strata_engine** engine) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{options, "options"}, {engine, "engine"}}));
    STRATA_ASSIGN_OR_RETURN(auto cc, strata::capi::ReadOptions(*options));
    auto box = std::make_shared<EngineBox>();
    STRATA_ASSIGN_OR_RETURN(box->engine, strata::Engine::Open(cc));
    box->cuda_device = cc.cuda_device;
    box->device_roles = cc.placement.device_roles;
    *engine = EngineTable::Get().Add(std::move(box));
    return Status::Ok();
  });
}

namespace {

// strata_engine_close and strata_engine_close_after_exports, under the
// name the caller called.
strata_status CloseAs(const char* fn, strata_engine* engine,
                      bool after_exports) {
  return Guard(fn, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{engine, "engine"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    if (const int open = e->optimizers.load(); open > 0) {
      return Status::FailedPrecondition(
          std::to_string(open) +
          " optimizers borrow the engine; call strata_optimizer_close on "
          "each first");
    }
    if (const int live = ViewTable::Get().CountOf(engine); live > 0) {
      return Status::FailedPrecondition(
          std::to_string(live) +
          " views are unreleased and point into the engine's tiers; call "
          "strata_view_release on each first");
    }
    if (const int pinned = e->deferred.load(); pinned > 0 && !after_exports) {
      return Status::FailedPrecondition(
          std::to_string(pinned) +
          " released views are still pinned by DLPack exports of their "
          "tensors (arrays made from strata_view_export_dlpack); call each "
          "export's deleter (drop the arrays) first");
    }
    // Closed: the views that exports pin hold the engine until the last
    // is deleted; a deferred release's failure goes with the engine.
    return EngineTable::Get().Take(engine).status();
  });
}

}  // namespace

strata_status strata_engine_close(strata_engine* engine) {
  return CloseAs(__func__, engine, false);
}

strata_status strata_engine_close_after_exports(strata_engine* engine) {
  return CloseAs(__func__, engine, true);
}

strata_status strata_engine_get_info(const strata_engine* engine,
                                     strata_engine_info* info) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{engine, "engine"}, {info, "info"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    return strata::capi::WriteEngineInfo(e->engine->info(), e->cuda_device,
                                         info);
  });
}

strata_status strata_engine_get_stats(const strata_engine* engine,
                                      strata_engine_stats* stats) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{engine, "engine"}, {stats, "stats"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    return strata::capi::WriteStats(e->engine->stats(), stats);
  });
}

strata_status strata_engine_explain(const strata_engine* engine, char* buffer,
                                    size_t capacity, size_t* required) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(
        NonNull({{engine, "engine"}, {required, "required"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    if (capacity > 0) STRATA_RETURN_IF_ERROR(NonNull({{buffer, "buffer"}}));
    *required = CopyText(e->engine->Explain(), buffer, capacity);
    return Status::Ok();
  });
}

strata_status strata_engine_drain(strata_engine* engine) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{engine, "engine"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    STRATA_RETURN_IF_ERROR(e->TakeDeferredError());
    return e->engine->Drain();
  });
}

strata_status strata_step_begin(strata_engine* engine) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{engine, "engine"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    e->engine->BeginStep();
    return Status::Ok();
  });
}

strata_status strata_step_end(strata_engine* engine) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{engine, "engine"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    return e->engine->EndStep();
  });
}

strata_status strata_group_spec_init(strata_group_spec* spec) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{spec, "spec"}}));
    *spec = strata::capi::DefaultGroupSpec();
    return Status::Ok();
  });
}

strata_status strata_group_register(strata_engine* engine,
                                    const strata_group_spec* spec,
                                    int32_t* group) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(
        NonNull({{engine, "engine"}, {spec, "spec"}, {group, "group"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    STRATA_ASSIGN_OR_RETURN(auto cc, strata::capi::ReadGroupSpec(*spec));
    if (!cc.use_default_placement && spec->device_roles == 0) {
      cc.placement.device_roles = e->device_roles;  // 0: the engine's
    }
    STRATA_ASSIGN_OR_RETURN(auto id, e->engine->RegisterGroup(cc));
    *group = id;
    return Status::Ok();
  });
}

strata_status strata_group_count(const strata_engine* engine, int32_t* count) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{engine, "engine"}, {count, "count"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    *count = e->engine->group_count();
    return Status::Ok();
  });
}

strata_status strata_group_get_bytes(const strata_engine* engine, int32_t group,
                                     int32_t tier, uint64_t* bytes) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{engine, "engine"}, {bytes, "bytes"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    STRATA_RETURN_IF_ERROR(ValidGroup(*e->engine, group));
    STRATA_RETURN_IF_ERROR(ValidTier(tier));
    *bytes = e->engine->group_bytes(group, static_cast<strata::Tier>(tier));
    return Status::Ok();
  });
}

namespace {

// strata_group_fetch and strata_group_fetch_on, under the name the caller
// called (its errors say which).
strata_status FetchAs(const char* fn, strata_engine* engine, int32_t group,
                      int32_t tier, uint32_t roles, int32_t write, void* stream,
                      strata_view** view) {
  return Guard(fn, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{engine, "engine"}, {view, "view"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    STRATA_RETURN_IF_ERROR(ValidGroup(*e->engine, group));
    STRATA_RETURN_IF_ERROR(ValidTier(tier));
    STRATA_RETURN_IF_ERROR(ValidRoles(roles));
    // Allocated first: once Fetch succeeds nothing may fail before the
    // caller holds the handle that releases it.
    auto fetched = std::make_shared<View>(e, engine, write != 0);
    auto done = e->engine->Fetch(
        group, static_cast<strata::Tier>(tier),
        {.roles = roles, .write = write != 0, .stream = stream});
    if (!done.ok()) return WithExportHint(*e, done.status());
    fetched->group = std::move(*done);
    *view = ViewTable::Get().Add(std::move(fetched));
    return Status::Ok();
  });
}

}  // namespace

strata_status strata_group_fetch(strata_engine* engine, int32_t group,
                                 int32_t tier, uint32_t roles, int32_t write,
                                 strata_view** view) {
  return FetchAs(__func__, engine, group, tier, roles, write, nullptr, view);
}

strata_status strata_group_fetch_on(strata_engine* engine, int32_t group,
                                    int32_t tier, uint32_t roles, int32_t write,
                                    void* stream, strata_view** view) {
  return FetchAs(__func__, engine, group, tier, roles, write, stream, view);
}

strata_status strata_group_prefetch(strata_engine* engine, int32_t group,
                                    int32_t tier, uint32_t roles) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{engine, "engine"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    STRATA_RETURN_IF_ERROR(ValidGroup(*e->engine, group));
    STRATA_RETURN_IF_ERROR(ValidTier(tier));
    STRATA_RETURN_IF_ERROR(ValidRoles(roles));
    return e->engine->Prefetch(group, static_cast<strata::Tier>(tier), roles);
  });
}

strata_status strata_group_evict(strata_engine* engine, int32_t group,
                                 int32_t tier) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{engine, "engine"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    STRATA_RETURN_IF_ERROR(ValidGroup(*e->engine, group));
    STRATA_RETURN_IF_ERROR(ValidTier(tier));
    return WithExportHint(
        *e, e->engine->Evict(group, static_cast<strata::Tier>(tier)));
  });
}

namespace {

// strata_view_release and strata_view_release_after, under the name the
// caller called.
strata_status ReleaseAs(const char* fn, strata_view* view, void* stream,
                        void* event) {
  return Guard(fn, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{view, "view"}}));
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<View> owned,
                            ViewTable::Get().Take(view));
    Status status = owned->Release({.stream = stream, .event = event});
    if (!status.ok() && owned->held()) ViewTable::Get().Restore(view, owned);
    return status;
  });
}

}  // namespace

strata_status strata_view_release(strata_view* view) {
  return ReleaseAs(__func__, view, nullptr, nullptr);
}

strata_status strata_view_release_after(strata_view* view, void* stream,
                                        void* event) {
  return ReleaseAs(__func__, view, stream, event);
}

strata_status strata_view_get_group(const strata_view* view, int32_t* group,
                                    int32_t* tier) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(
        NonNull({{view, "view"}, {group, "group"}, {tier, "tier"}}));
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<View> v,
                            ViewTable::Get().Find(view));
    *group = v->group.group;
    *tier = static_cast<int32_t>(v->group.tier);
    return Status::Ok();
  });
}

strata_status strata_view_count_tensors(const strata_view* view,
                                        int32_t* count) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{view, "view"}, {count, "count"}}));
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<View> v,
                            ViewTable::Get().Find(view));
    *count = static_cast<int32_t>(v->group.tensors.size());
    return Status::Ok();
  });
}

strata_status strata_view_get_tensor(const strata_view* view, int32_t index,
                                     strata_tensor_info* info) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{view, "view"}, {info, "info"}}));
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<View> v,
                            ViewTable::Get().Find(view));
    STRATA_RETURN_IF_ERROR(strata::capi::ValidTensorIndex(
        v->group.tensors.size(), index, "view", "strata_view_count_tensors"));
    return strata::capi::WriteTensorInfo(v->group.tensors[index], info);
  });
}

strata_status strata_view_find_tensor(const strata_view* view, const char* name,
                                      int32_t role, int32_t* index) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(
        NonNull({{view, "view"}, {name, "name"}, {index, "index"}}));
    STRATA_RETURN_IF_ERROR(ValidRole(role));
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<View> v,
                            ViewTable::Get().Find(view));
    const auto cc_role = static_cast<strata::Role>(role);
    const strata::TensorView* found = v->group.Find(name, cc_role);
    if (found == nullptr) {
      return Status(strata::StatusCode::kNotFound,
                    std::string("the view of group ") +
                        std::to_string(v->group.group) + " has no tensor '" +
                        name + "' in role " +
                        std::string(strata::RoleName(cc_role)) +
                        "; check the name and the roles fetched");
    }
    *index = static_cast<int32_t>(found - v->group.tensors.data());
    return Status::Ok();
  });
}

strata_status strata_view_export_dlpack(const strata_view* view, int32_t index,
                                        DLManagedTensor** out) {
  return ExportAs(
      __func__, view, index, out,
      [](View& v,
         const strata::TensorView& t) -> strata::Result<DLManagedTensor*> {
        STRATA_ASSIGN_OR_RETURN(auto hold, v.HoldForExport());
        return strata::ToDLPack(t, v.cuda_device(), std::move(hold));
      });
}

strata_status strata_view_export_dlpack_versioned(
    const strata_view* view, int32_t index, strata_dlpack_versioned** out) {
  return ExportAs(__func__, view, index, out,
                  [](View& v, const strata::TensorView& t)
                      -> strata::Result<strata_dlpack_versioned*> {
                    STRATA_ASSIGN_OR_RETURN(auto hold, v.HoldForExport());
                    return strata::ToDLPackVersioned(t, v.cuda_device(),
                                                     !v.write, std::move(hold));
                  });
}

strata_status strata_engine_save(strata_engine* engine, const char* dir,
                                 const char* user_state) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull(
        {{engine, "engine"}, {dir, "dir"}, {user_state, "user_state"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    return e->engine->Save(dir, {user_state});
  });
}

strata_status strata_engine_load(strata_engine* engine, const char* dir,
                                 char* user_state_buf, size_t capacity,
                                 size_t* needed) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(
        NonNull({{engine, "engine"}, {dir, "dir"}, {needed, "needed"}}));
    STRATA_ASSIGN_OR_RETURN(auto e, EngineTable::Get().Find(engine));
    STRATA_RETURN_IF_ERROR(
        strata::capi::CheckTextBuffer(user_state_buf, capacity));
    strata::LoadResult result;
    STRATA_RETURN_IF_ERROR(e->engine->Load(dir, &result));
    *needed = CopyText(result.user_state, user_state_buf, capacity);
    return Status::Ok();
  });
}

strata_status strata_checkpoint_verify(const char* dir) {
  return Guard(__func__, [&]() -> Status {
    STRATA_RETURN_IF_ERROR(NonNull({{dir, "dir"}}));
    return strata::VerifyCheckpoint(dir);
  });
}

}  // extern "C"
