// Helpers shared by the checkpoint tests (tests/ckpt/*_test.cc,
// tests/optim/resume_test.cc): a save killed at a stage of Note
// [Checkpoint crash safety] in a child process, Save and Load through an
// Env of the test's, an engine with a model registered and seeded data in
// it, damage to a file, and edits of a manifest.
#ifndef STRATA_TESTS_CKPT_CHECKPOINT_UTIL_H_
#define STRATA_TESTS_CKPT_CHECKPOINT_UTIL_H_

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/ckpt/checkpoint.h"
#include "src/store/engine_internal.h"
#include "strata/engine.h"
#include "tests/store/store_util.h"

namespace strata::ckpt_test {

namespace internal {
inline ckpt::SaveStage kill_stage;
inline int kill_countdown = 0;
}  // namespace internal

// Every later Save in this process kills it (SIGKILL) the `count`th time it
// reaches `stage`. For a forked child only, and only where the save cannot
// take an Env (FaultEnv::CrashAt in tests/ckpt/fault_env.h can).
inline void KillAtSaveStage(ckpt::SaveStage stage, int count) {
  internal::kill_stage = stage;
  internal::kill_countdown = count;
  ckpt::SetSaveStageHookForTesting([](ckpt::SaveStage reached) {
    if (reached == internal::kill_stage && --internal::kill_countdown == 0) {
      raise(SIGKILL);
    }
  });
}

// Runs `body` in a forked child (which exits with status 3 if `body`
// returns) and waits for it. Returns the child's pid with its wait status
// in `*wstatus`, or -1 when fork or waitpid fails. No engine (so no
// thread) may live in this process across the call.
inline pid_t RunInChild(const std::function<void()>& body, int* wstatus) {
  const pid_t child = fork();
  if (child == 0) {
    body();
    _exit(3);
  }
  if (child < 0 || waitpid(child, wstatus, 0) != child) return -1;
  return child;
}

// Engine::Save of `engine`, opened with `options`, through `env`.
inline Status SaveThrough(ckpt::Env& env, Engine& engine,
                          const EngineOptions& options, const std::string& dir,
                          const SaveOptions& save = {}) {
  return ckpt::Save(engine, *strata::internal::PartsOf(engine).residency,
                    options, dir, save, env);
}

// Engine::Load into `engine` through `env`.
inline Status LoadThrough(ckpt::Env& env, Engine& engine,
                          const std::string& dir,
                          LoadResult* result = nullptr) {
  return ckpt::Load(engine, *strata::internal::PartsOf(engine).residency, dir,
                    result, {}, env);
}

// Flips one bit of the byte at `offset` of the file at `path`.
inline void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  const char c = static_cast<char>(f.get() ^ 0x20);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(c);
}

// An engine opened with `options` and `model` registered in order, or null
// (with a test failure saying why).
inline std::unique_ptr<Engine> OpenWithModel(
    const EngineOptions& options, const std::vector<GroupSpec>& model) {
  auto engine = Engine::Open(options);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return nullptr;
  for (const GroupSpec& spec : model) {
    auto id = (*engine)->RegisterGroup(spec);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    if (!id.ok()) return nullptr;
  }
  return std::move(*engine);
}

// A host-only engine's options: every role on the host, 4 MiB of device
// and 8 MiB of host budget.
inline EngineOptions HostOnly() {
  EngineOptions o;
  o.device = "host";
  o.device_budget = 4096 * store_test::kKiB;
  o.host_budget = 8192 * store_test::kKiB;
  o.placement.home.fill(Tier::kHost);
  return o;
}

// store_test::Fill(seed + g) into every role of every group g.
inline void Fill(Engine& engine, uint64_t seed) {
  for (int g = 0; g < engine.group_count(); ++g) {
    auto view = engine.Fetch(g, Tier::kHost, {kAllRoles, true});
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    store_test::Fill(*view, seed + g);
    ASSERT_TRUE(view->pin.Release().ok());
  }
}

// Expects what Fill(engine, seed) wrote.
inline void Check(Engine& engine, uint64_t seed) {
  for (int g = 0; g < engine.group_count(); ++g) {
    auto view = engine.Fetch(g, Tier::kHost);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    store_test::Check(*view, seed + g);
    ASSERT_TRUE(view->pin.Release().ok());
  }
}

// Rewrites dir's manifest.json through `edit`. With `reseal` it then gets
// a manifest_xxh3 that matches (computed here as Note [Checkpoint format]
// says), so that the edit reaches the check it aims at, as if a faulty
// writer had made it; without, the edit stands for damage after Save.
inline void EditManifest(const std::string& dir,
                         const std::function<void(nlohmann::json&)>& edit,
                         bool reseal = true) {
  const std::string path = dir + "/manifest.json";
  nlohmann::json manifest = nlohmann::json::parse(std::ifstream(path));
  edit(manifest);
  if (reseal) {
    manifest.erase("manifest_xxh3");
    const std::string text = manifest.dump(2) + "\n";
    char hex[17];
    std::snprintf(
        hex, sizeof(hex), "%016llx",
        static_cast<unsigned long long>(XXH3_64bits(text.data(), text.size())));
    manifest["manifest_xxh3"] = hex;
  }
  std::ofstream(path, std::ios::trunc) << manifest.dump(2);
}

}  // namespace strata::ckpt_test

#endif  // STRATA_TESTS_CKPT_CHECKPOINT_UTIL_H_
