// strata-sim as a user runs it: a small model through every tier, its
// JSON report, and its errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/testutil/testutil.h"

namespace {

struct Outcome {
  int status = -1;
  std::string err;
};

Outcome Sim(const std::string& args, const std::string& dir) {
  const std::string err = dir + "/stderr";
  const std::string cmd =
      STRATA_SIM_BIN " " + args + " >/dev/null 2>'" + err + "'";
  const int ws = std::system(cmd.c_str());
  std::ifstream in(err);
  std::stringstream text;
  text << in.rdbuf();
  return {WIFEXITED(ws) ? WEXITSTATUS(ws) : -1, text.str()};
}

TEST(SimCliTest, StreamsStateFromNvmeAndReportsEveryFigure) {
  strata::testutil::ScratchDir dir;
  const std::string json = dir.File("out.json");
  const Outcome run = Sim(
      "--params 4M --layers 4 --device-budget 8M --host-budget 32M --nvme " +
          dir.path() +
          " --steps 3 --tflops 0.5 --mode overlap,after_backward --json " +
          json,
      dir.path());
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.err.find("offloaded (after_backward) step 3/3"),
            std::string::npos)
      << run.err;
  std::ifstream in(json);
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(doc.is_object());
  EXPECT_GT(doc["resident_step_seconds"].get<double>(), 0);
  EXPECT_GT(doc["floor"]["seconds"].get<double>(), 0);
  EXPECT_EQ(doc["floor"]["binding"], "NVMe (reads + writes)");
  ASSERT_EQ(doc["runs"].size(), 2u);
  EXPECT_EQ(doc["runs"][0]["mode"], "overlap");
  EXPECT_EQ(doc["runs"][1]["mode"], "after_backward");
  for (const nlohmann::json& r : doc["runs"]) {
    ASSERT_EQ(r["steps"].size(), 3u);
    const auto& step = r["steps"][2];
    EXPECT_GT(step["seconds"].get<double>(), 0);
    EXPECT_GT(step["compute_seconds"].get<double>(), 0);
    EXPECT_TRUE(step["stall"].contains("optimizer"));
    // The optimizer state (48 MB) does not fit the 32 MiB host: streamed.
    EXPECT_GT(step["bytes"]["nvme->host"].get<uint64_t>(), 40'000'000u);
    EXPECT_GT(step["bytes"]["host->nvme"].get<uint64_t>(), 40'000'000u);
    // Every byte is some role's: the roles sum to the tier pair's figure.
    for (const auto& [pair, moved] : step["bytes"].items()) {
      uint64_t sum = 0;
      for (const auto& [role, pairs] : step["role_bytes"].items()) {
        if (pairs.contains(pair)) sum += pairs[pair].get<uint64_t>();
      }
      EXPECT_EQ(sum, moved.get<uint64_t>()) << pair;
    }
    EXPECT_GT(step["role_bytes"]["master"]["nvme->host"].get<uint64_t>(), 0u);
    EXPECT_GT(step["role_bytes"]["grad"]["device->host"].get<uint64_t>(), 0u);
    if (r["mode"] == "after_backward") {
      // The kept gradients the host cannot hold are written and read back
      // once; those it holds end unwritten after their step.
      const nlohmann::json& grad = step["role_bytes"]["grad"];
      EXPECT_EQ(grad.value("host->nvme", 0u), grad.value("nvme->host", 0u));
      EXPECT_GT(step["discarded_bytes"].get<uint64_t>(), 0u);
    }
    EXPECT_GT(r["offload_efficiency"].get<double>(), 0);
    for (const char* tier : {"device", "host"}) {
      EXPECT_LE(r["memory"][tier]["peak"].get<uint64_t>(),
                r["memory"][tier]["budget"].get<uint64_t>())
          << tier;
    }
  }
}

// --state-dtype int8: m and v move in a byte an element and a scale per
// 256, about a quarter of the fp32 master's bytes (0.254). Summed over the
// steps that read (the first reads nothing): which step a group's read
// counts in, and whether one group's state stays on the host between two
// steps, depend on the timing; over two steps of 4 groups one such group
// still leaves the ratio above 0.2.
TEST(SimCliTest, Int8StateMovesAQuarterOfTheBytes) {
  strata::testutil::ScratchDir dir;
  const std::string json = dir.File("out.json");
  const Outcome run = Sim(
      "--params 4M --layers 4 --device-budget 8M --host-budget 32M --nvme " +
          dir.path() +
          " --steps 3 --mode after_backward --state-dtype int8 --json " + json,
      dir.path());
  ASSERT_EQ(run.status, 0) << run.err;
  std::ifstream in(json);
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(doc.is_object());
  auto read = [&](const char* role) {
    uint64_t sum = 0;
    for (const nlohmann::json& step : doc["runs"][0]["steps"]) {
      sum += step["role_bytes"][role].value("nvme->host", uint64_t{0});
    }
    return sum;
  };
  const uint64_t master = read("master");
  ASSERT_GT(master, 0u);
  for (const char* state : {"state1", "state2"}) {
    EXPECT_GT(read(state), master / 5) << state;
    EXPECT_LT(read(state), master / 3) << state;
  }
}

// Issue #18: the clipping and overflow paths, each step reported as it
// went, and the unclipped overlap run beside them.
TEST(SimCliTest, ClippingAndSkippedStepsAreInjectedAndReported) {
  strata::testutil::ScratchDir dir;
  const std::string json = dir.File("out.json");
  const Outcome run =
      Sim("--params 2M --layers 4 --device-budget 8M --host-budget 64M "
          "--state-home host --steps 4 --tflops 1 --clip-norm 1 "
          "--clip-fires-every 2 --skip-on-overflow --overflow-every 3 "
          "--compare-unclipped --no-baseline --json " +
              json,
          dir.path());
  ASSERT_EQ(run.status, 0) << run.err;
  std::ifstream in(json);
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(doc.is_object());
  ASSERT_EQ(doc["runs"].size(), 2u);
  const nlohmann::json& clipped = doc["runs"][0];
  EXPECT_TRUE(clipped["clipping"].get<bool>());
  ASSERT_EQ(clipped["steps"].size(), 4u);
  for (int s = 0; s < 4; ++s) {
    const nlohmann::json& step = clipped["steps"][s];
    EXPECT_EQ(step["clipped"].get<bool>(), s == 1 || s == 3) << s;
    EXPECT_EQ(step["skipped"].get<bool>(), s == 2) << s;
    EXPECT_TRUE(step["stall"].contains("updates"));
  }
  EXPECT_EQ(clipped["clipped_steps"], 2);
  EXPECT_EQ(clipped["skipped_steps"], 1);
  const nlohmann::json& plain = doc["runs"][1];
  EXPECT_EQ(plain["mode"], "overlap");
  EXPECT_FALSE(plain["clipping"].get<bool>());
  EXPECT_EQ(plain["clipped_steps"], 0);
  EXPECT_EQ(plain["skipped_steps"], 0);
}

// State on NVMe steps speculatively from the second step: clipping (steps
// 1 and 3) and the skip (step 2) undo the speculation, step 4 keeps it;
// --no-speculate steps under the next forward, speculating nothing.
TEST(SimCliTest, SpeculativeStepsAndTheirUndoingAreReported) {
  strata::testutil::ScratchDir dir;
  const std::string json = dir.File("out.json");
  for (const bool speculate : {true, false}) {
    SCOPED_TRACE(speculate ? "speculate" : "no speculation");
    const Outcome run =
        Sim("--params 2M --layers 4 --device-budget 8M --host-budget 64M "
            "--nvme " +
                dir.path() +
                " --steps 5 --tflops 1 --clip-norm 1 --clip-fires-every 2 "
                "--skip-on-overflow --overflow-every 3 --no-baseline " +
                (speculate ? "" : "--no-speculate ") + "--json " + json,
            dir.path());
    ASSERT_EQ(run.status, 0) << run.err;
    std::ifstream in(json);
    const nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
    ASSERT_TRUE(doc.is_object());
    const nlohmann::json& steps = doc["runs"][0]["steps"];
    ASSERT_EQ(steps.size(), 5u);
    for (int s = 0; s < 5; ++s) {
      const int speculated = steps[s]["speculated_groups"].get<int>();
      const int undone = steps[s]["undone_groups"].get<int>();
      if (!speculate || s == 0) {
        EXPECT_EQ(speculated, 0) << s;
        continue;
      }
      // The skipped step's poisoned group does not step at all.
      EXPECT_GE(speculated, s == 2 ? 3 : 4) << s;
      EXPECT_EQ(undone, s == 4 ? 0 : speculated) << s;
    }
    EXPECT_EQ(doc["runs"][0]["undone_steps"], speculate ? 3 : 0);
  }
}

TEST(SimCliTest, BadInputExitsOneWithTheReason) {
  strata::testutil::ScratchDir dir;
  const std::pair<std::string, std::string> cases[] = {
      {"--params 4M", "--layers is required"},
      {"--params 4M --layers 4", "--nvme DIR"},
      {"--params 4X --layers 4", "--params"},
      {"--params 4M --layers 4 --state-home host --mode sideways", "--mode"},
      {"--params 4M --layers 4 --state-home device", "--state-home"},
      {"--params 4M --layers 4 --state-home host --device-budget 1M "
       "--host-budget 64M",
       "device budget"},
      {"--params 4M --layers 4 --state-home host --clip-fires-every 2",
       "give --clip-norm too"},
      {"--params 4M --layers 4 --state-home host --overflow-every 2",
       "give --skip-on-overflow too"},
      {"--params 4M --layers 4 --state-home host --state-dtype fp8",
       "--state-dtype"},
  };
  for (const auto& [args, why] : cases) {
    const Outcome run = Sim(args, dir.path());
    EXPECT_EQ(run.status, 1) << args;
    EXPECT_NE(run.err.find(why), std::string::npos) << args << ": " << run.err;
  }
}

}  // namespace
