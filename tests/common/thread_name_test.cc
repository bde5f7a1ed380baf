// Thread names (common/thread_name.h): the helper, and the names of the
// threads an engine, its optimizer pipeline and CPU Adam start, as top and
// perf show them.
#include "common/thread_name.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "strata/cpu_adam.h"
#include "strata/engine.h"
#include "strata/offload_optimizer.h"

namespace strata {
namespace {

std::set<std::string> ThreadNames() {
  std::set<std::string> names;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) names.insert(name);
  }
  return names;
}

TEST(ThreadNameTest, NamesTheCallingThreadCutToFifteenCharacters) {
  std::string seen;
  std::thread([&] {
    NameThisThread("strata-a-much-longer-name");
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    seen = name;
  }).join();
  EXPECT_EQ(seen, "strata-a-much-l");
}

TEST(ThreadNameTest, TheEnginesThreadsSayWhatTheyDo) {
  EngineOptions options;
  options.device = "host";
  options.device_budget = options.host_budget = 8 << 20;
  auto engine = Engine::Open(options);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  GroupSpec spec;
  spec.name = "layer";
  spec.tensors.push_back({"w", {1024}, DType::kBFloat16, kAllRoles});
  ASSERT_TRUE((*engine)->RegisterGroup(spec).ok());
  auto optimizer = OffloadOptimizer::Create(engine->get(), {});
  ASSERT_TRUE(optimizer.ok()) << optimizer.status().ToString();
  auto cpu = CpuOptimizer::Create({.threads = 2});
  ASSERT_TRUE(cpu.ok());
  std::vector<float> p(1 << 17), g(1 << 17), m(1 << 17), v(1 << 17);
  OptimBuffers b;
  b.params = p.data();
  b.grads = g.data();
  b.state1 = m.data();
  b.state2 = v.data();
  b.n = p.size();
  // Each thread names itself as it starts: wait for that (10 s at most).
  auto has_all = [](const std::set<std::string>& names,
                    const std::vector<std::string>& wanted) {
    for (const std::string& name : wanted) {
      if (names.count(name) == 0) return false;
    }
    return true;
  };
  std::vector<std::string> wanted = {"strata-optim", "strata-writer",
                                     "strata-stream", "strata-fences",
                                     "strata-prefetch"};
  // CPU Adam's arena: a TBB worker joins it when the market has one to
  // give, which takes at least two cores, and not at every step.
  const bool workers = std::thread::hardware_concurrency() >= 2;
  if (workers) wanted.push_back("strata-adam");
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::set<std::string> names = ThreadNames();
  while (!has_all(names, wanted) &&
         std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE((*cpu)->Step(StepOptions{}, b).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    names = ThreadNames();
  }
  for (const std::string& name : wanted) {
    EXPECT_EQ(names.count(name), 1u) << name << " is missing";
  }
  if (!workers)
    GTEST_SKIP() << "one core: CPU Adam's arena has no worker to name";
}

}  // namespace
}  // namespace strata
