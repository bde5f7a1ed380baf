// The example that opens engine.h, offload_optimizer.h and README.md: the
// code between the markers below, run on the host-emulated device, and
// found verbatim in each of those files, so the documentation cannot drift
// from the API.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "strata/engine.h"
#include "strata/offload_optimizer.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

// Stand-ins for the caller's kernels: forward reads the weights, backward
// writes a gradient.
void Forward(int, const GroupView& w) { ASSERT_NE(w.tensors[0].data, nullptr); }
void Backward(int, const GroupView&, const GradientBuffer& g) {
  static_cast<uint16_t*>(g.tensors[0].data)[0] = 0x3c00;  // bf16 1/128
}

Status TrainOneStep(const std::string& swap_dir, int layers,
                    OptimStepReport* out) {
  // [example]
  EngineOptions o;    // compute copies homed on the host, the rest on NVMe
  o.device = "host";  // "cuda" on a GPU (the default "auto" picks it)
  o.device_budget = 16 << 20;
  o.host_budget = 64 << 20;
  o.nvme_budget = 256 << 20;
  o.swap_dir = swap_dir;
  o.placement.home = {Tier::kHost, Tier::kNvme, Tier::kNvme, Tier::kNvme,
                      Tier::kNvme};  // compute, master, m, v, grad
  o.placement.device_roles = RoleBit(Role::kCompute);  // the GPU's
  STRATA_ASSIGN_OR_RETURN(auto engine, Engine::Open(o));
  for (int l = 0; l < layers; ++l) {  // one group per layer
    GroupSpec layer;
    layer.name = "layer." + std::to_string(l);
    layer.tensors = {{"w", {1024, 1024}, DType::kBFloat16, kAllRoles}};
    STRATA_RETURN_IF_ERROR(engine->RegisterGroup(layer).status());
  }
  STRATA_ASSIGN_OR_RETURN(
      auto opt,
      OffloadOptimizer::Create(engine.get(), {.algo = OptimAlgo::kAdamW}));

  engine->BeginStep();
  STRATA_RETURN_IF_ERROR(opt->BeginStep({.lr = 1e-4}));
  const FetchOptions compute{.roles = RoleBit(Role::kCompute)};
  for (int l = 0; l < layers; ++l) {
    STRATA_ASSIGN_OR_RETURN(GroupView w,
                            engine->Fetch(l, Tier::kDevice, compute));
    Forward(l, w);  // your kernels read w.tensors[0].data
    STRATA_RETURN_IF_ERROR(w.pin.Release());
  }
  for (int l = layers - 1; l >= 0; --l) {
    STRATA_ASSIGN_OR_RETURN(GroupView w,
                            engine->Fetch(l, Tier::kDevice, compute));
    STRATA_ASSIGN_OR_RETURN(GradientBuffer g, opt->AcquireGradients(l));
    Backward(l, w, g);  // your kernels write g.tensors[0].data
    STRATA_RETURN_IF_ERROR(w.pin.Release());
    STRATA_RETURN_IF_ERROR(opt->HandOff(g));  // the CPU steps layer l now
  }
  STRATA_ASSIGN_OR_RETURN(OptimStepReport report, opt->FinishStep());
  STRATA_RETURN_IF_ERROR(engine->EndStep());
  // [example end]
  *out = report;
  return Status();
}

TEST(ExampleTest, OneTrainingStepRuns) {
  testutil::ScratchDir swap;
  OptimStepReport report;
  const Status status = TrainOneStep(swap.path(), 3, &report);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(report.step, 1);
  EXPECT_FALSE(report.skipped);
  EXPECT_GT(report.grad_norm, 0);
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string Trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" /");
  const size_t b = s.find_last_not_of(' ');
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// The example's lines, indentation and comment markers aside.
std::vector<std::string> ExampleIn(const std::vector<std::string>& lines,
                                   const std::string& begin,
                                   const std::string& end) {
  std::vector<std::string> out;
  bool inside = false;
  for (const std::string& line : lines) {
    if (Trim(line) == end) inside = false;
    if (inside && !Trim(line).empty()) out.push_back(Trim(line));
    if (Trim(line) == begin) inside = true;
  }
  return out;
}

TEST(ExampleTest, DocumentsShowThisExample) {
  const std::vector<std::string> want =
      ExampleIn(Lines(STRATA_SOURCE_DIR "/tests/store/example_test.cc"),
                "[example]", "[example end]");
  ASSERT_GT(want.size(), 20u);
  for (const char* doc : {"include/strata/engine.h",
                          "include/strata/offload_optimizer.h", "README.md"}) {
    const std::vector<std::string> got =
        ExampleIn(Lines(std::string(STRATA_SOURCE_DIR "/") + doc),
                  "```c++ example", "```");
    EXPECT_EQ(got, want) << doc << " does not show the example of "
                         << "tests/store/example_test.cc verbatim";
  }
}

}  // namespace
}  // namespace strata
