// strata-plan as a user runs it: the real binary, its table, its JSON and
// its exit status.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testutil/testutil.h"

namespace {

struct Outcome {
  int status = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs strata-plan with `args` in `cwd` (default: a scratch directory),
// keeping stdout and stderr apart so the JSON on stdout parses alone.
Outcome Plan(const std::string& args, const std::string& cwd = "") {
  strata::testutil::ScratchDir capture;
  const std::string dir = cwd.empty() ? capture.path() : cwd;
  const std::string out = capture.File("stdout");
  const std::string err = capture.File("stderr");
  const std::string cmd = "cd '" + dir + "' && " STRATA_PLAN_BIN " " + args +
                          " >'" + out + "' 2>'" + err + "'";
  const int ws = std::system(cmd.c_str());
  return Outcome{WIFEXITED(ws) ? WEXITSTATUS(ws) : -1, Slurp(out), Slurp(err)};
}

nlohmann::json Json(const Outcome& run) {
  return nlohmann::json::parse(run.out, nullptr, /*allow_exceptions=*/false);
}

// The line of `text` that starts with `prefix`, or "" when none does.
std::string LineStartingWith(const std::string& text,
                             const std::string& prefix) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return "";
}

// The text from the heading `marker` on.
std::string Section(const std::string& text, const std::string& marker) {
  const size_t at = text.find(marker);
  return at == std::string::npos ? "" : text.substr(at);
}

bool EndsWith(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() &&
         text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

TEST(PlanCliTest, ZeroTableMatchesThePaperFor7Point5BOn64Gpus) {
  const Outcome run = Plan("--params 7.5B --gpus 64 --k 12");
  ASSERT_EQ(run.status, 0) << run.err;
  const std::vector<std::string> figures = {"120.0 GB", "31.4 GB", "16.6 GB",
                                            "1.9 GB"};
  for (int stage = 0; stage < 4; ++stage) {
    const std::string line =
        LineStartingWith(run.out, "  stage " + std::to_string(stage) + " ");
    EXPECT_TRUE(EndsWith(line, " " + figures[stage]))
        << "stage " << stage << ": '" << line << "'";
  }
  EXPECT_NE(run.out.find("N = 64 data-parallel GPUs"), std::string::npos);

  const Outcome json = Plan("--params 7.5B --gpus 64 --k 12 --json");
  ASSERT_EQ(json.status, 0) << json.err;
  const nlohmann::json doc = Json(json);
  ASSERT_FALSE(doc.is_discarded()) << json.out;
  const nlohmann::json& zero = doc["zero"];
  EXPECT_EQ(zero["gpus"], 64);
  EXPECT_EQ(zero["k"], 12);
  const std::vector<uint64_t> bytes = {120'000'000'000u, 31'406'250'000u,
                                       16'640'625'000u, 1'875'000'000u};
  const std::vector<double> gb = {120.0, 31.4, 16.6, 1.9};
  ASSERT_EQ(zero["stages"].size(), 4u);
  for (int stage = 0; stage < 4; ++stage) {
    const nlohmann::json& s = zero["stages"][stage];
    EXPECT_EQ(s["stage"], stage);
    EXPECT_EQ(s["bytes"].get<uint64_t>(), bytes[stage]) << stage;
    EXPECT_DOUBLE_EQ(s["gb"].get<double>(), gb[stage]) << stage;
  }
  EXPECT_EQ(zero["stages"][0]["formula"], "(2+2+K)Ψ");
}

TEST(PlanCliTest, TableShowsPlacementTrafficFloorAndCapacity) {
  const Outcome run = Plan(
      "--params 7.5B --device-budget 80GiB --host-budget 512GiB "
      "--nvme-budget 4TiB");
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_TRUE(run.err.empty()) << run.err;
  const std::string params = LineStartingWith(run.out, "  compute params");
  EXPECT_NE(params.find(" device "), std::string::npos) << run.out;
  EXPECT_TRUE(EndsWith(params, " 14.0 GiB")) << run.out;
  EXPECT_NE(LineStartingWith(run.out, "  fp32 master").find("host"),
            std::string::npos);
  EXPECT_NE(LineStartingWith(run.out, "  NVMe ").find("4.0 TiB"),
            std::string::npos);
  EXPECT_EQ(LineStartingWith(run.out, "verdict:"), "verdict: fits");
  EXPECT_NE(LineStartingWith(run.out, "  device->host").find("15.00 GB"),
            std::string::npos);
  const std::string floor = Section(run.out, "step-time floor");
  EXPECT_NE(LineStartingWith(floor, "  host->device").find("assumed"),
            std::string::npos);
  EXPECT_NE(LineStartingWith(run.out, "floor: ").find("bound by"),
            std::string::npos);
  EXPECT_NE(LineStartingWith(run.out, "largest model").find("parameters"),
            std::string::npos);
}

// --gpus 4: every figure is one rank's quarter, plus the collectives at
// --net-gbps; the JSON says so.
TEST(PlanCliTest, RanksPlanTheirShareAndTheNetwork) {
  const Outcome run =
      Plan("--params 8B --dtype fp32 --gpus 4 --net-gbps 10 --json");
  ASSERT_EQ(run.status, 0) << run.err;
  const nlohmann::json doc = Json(run);
  ASSERT_FALSE(doc.is_discarded()) << run.out;
  EXPECT_EQ(doc["ranks"]["gpus"], 4);
  EXPECT_EQ(doc["ranks"]["params_per_rank"], 2'000'000'000u);
  EXPECT_EQ(doc["placement"]["roles"][2]["bytes"], 8'000'000'000u);
  const nlohmann::json& net = doc["traffic"]["network"];
  EXPECT_EQ(net["bytes"], 72'000'000'000u);  // 3 x 3 x 4 B x 2e9
  EXPECT_EQ(net["rate"]["source"], "given");
  EXPECT_DOUBLE_EQ(net["seconds"].get<double>(), 7.2);
  EXPECT_EQ(doc["floor"]["binding"], "network");
  EXPECT_EQ(doc["optimizer"]["params"], 2'000'000'000u);

  const Outcome text = Plan("--params 8B --gpus 4");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("4 ranks, ZeRO-3"), std::string::npos) << text.out;
  EXPECT_NE(LineStartingWith(Section(text.out, "per-step traffic"), "  network")
                .find("36.00 GB"),
            std::string::npos)
      << text.out;
}

TEST(PlanCliTest, JsonCarriesTheSamePlan) {
  const Outcome run = Plan(
      "--params 7.5B --device-budget 24GiB --host-budget 64GiB "
      "--nvme-budget 1TiB --pcie-gbps 10 --json");
  ASSERT_EQ(run.status, 0) << run.err;
  const nlohmann::json doc = Json(run);
  ASSERT_FALSE(doc.is_discarded()) << run.out;
  EXPECT_EQ(doc["model"]["params"], 7'500'000'000u);
  EXPECT_EQ(doc["model"]["dtype"], "bf16");
  EXPECT_EQ(doc["budgets"]["device"], 24ull << 30);
  const nlohmann::json& roles = doc["placement"]["roles"];
  ASSERT_EQ(roles.size(), 4u);
  EXPECT_EQ(roles[0]["role"], "params");
  EXPECT_EQ(roles[0]["tier"], "device");
  EXPECT_EQ(roles[1]["tier"], "host");  // 24 GiB holds one 15 GB role
  EXPECT_EQ(roles[2]["tier"], "host");
  EXPECT_EQ(roles[3]["tier"], "nvme");
  EXPECT_EQ(doc["placement"]["tiers"]["nvme"]["needs"], 60'000'000'000u);
  EXPECT_TRUE(doc["placement"]["fits"].get<bool>());
  const nlohmann::json& h2d = doc["traffic"]["h2d"];
  EXPECT_EQ(h2d["bytes"], 15'000'000'000u);
  EXPECT_EQ(h2d["rate"]["source"], "given");
  EXPECT_DOUBLE_EQ(h2d["seconds"].get<double>(), 1.5);
  EXPECT_EQ(doc["traffic"]["nvme_read"]["bytes"], 60'000'000'000u);
  EXPECT_EQ(doc["traffic"]["nvme_write"]["rate"]["source"], "assumed");
  // The drive takes turns: read seconds plus write seconds bind.
  const double drive = doc["traffic"]["nvme_read"]["seconds"].get<double>() +
                       doc["traffic"]["nvme_write"]["seconds"].get<double>();
  EXPECT_GT(doc["traffic"]["nvme_write"]["seconds"].get<double>(), 0.0);
  EXPECT_EQ(doc["floor"]["binding"], "nvme");
  EXPECT_DOUBLE_EQ(doc["floor"]["nvme_seconds"].get<double>(), drive);
  EXPECT_DOUBLE_EQ(doc["floor"]["seconds"].get<double>(), drive);
  EXPECT_TRUE(doc["largest_model"]["bounded"].get<bool>());
  EXPECT_GT(doc["largest_model"]["params"].get<uint64_t>(), 7'500'000'000u);
}

TEST(PlanCliTest, LayersHiddenAndVocabGiveTheParameterCount) {
  const Outcome run = Plan("--layers 32 --hidden 4096 --vocab 32000 --json");
  ASSERT_EQ(run.status, 0) << run.err;
  const nlohmann::json doc = Json(run);
  ASSERT_FALSE(doc.is_discarded()) << run.out;
  EXPECT_EQ(doc["model"]["params"].get<uint64_t>(),
            12ull * 32 * 4096 * 4096 + 32000ull * 4096);
  EXPECT_FALSE(doc["largest_model"]["bounded"].get<bool>());
  EXPECT_TRUE(doc["largest_model"]["params"].is_null());
}

TEST(PlanCliTest, InfeasibleBudgetsExitTwoNamingTheTier) {
  const std::string args =
      "--params 54492397568 --device-budget 0 --host-budget 0 "
      "--nvme-budget 500GiB";
  const Outcome run = Plan(args);
  EXPECT_EQ(run.status, 2);
  EXPECT_NE(run.err.find("does not fit: needs 812.0 GiB on NVMe; NVMe "
                         "budget is 500.0 GiB"),
            std::string::npos)
      << run.err;
  EXPECT_NE(run.err.find("--nvme-budget"), std::string::npos) << run.err;
  EXPECT_NE(run.out.find("(no tier has room)"), std::string::npos);

  const Outcome json = Plan(args + " --json");
  EXPECT_EQ(json.status, 2);
  const nlohmann::json doc = Json(json);
  ASSERT_FALSE(doc.is_discarded()) << json.out;
  EXPECT_FALSE(doc["placement"]["fits"].get<bool>());
  const nlohmann::json& s = doc["placement"]["shortfalls"];
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0]["tier"], "nvme");
  EXPECT_EQ(s[0]["needs"].get<uint64_t>(), 812ull << 30);
  EXPECT_EQ(s[0]["missing"].get<uint64_t>(), 312ull << 30);
}

TEST(PlanCliTest, BadInputExitsOneWithTheReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--params 7.5X", "--params: '7.5X' is not a parameter count"},
      {"--params 7.5B --host-budget 12Q", "--host-budget"},
      {"--gpus 8", "no model: give --params"},
      {"--params 7B --layers 32 --hidden 4096", "not both"},
      {"--params 7B --vocab 32000", "not both"},
      {"--params 7B --dtype int8", "--dtype"},
      {"--params 7B --k 2", "--k"},
      {"--params 7B --gpus 0", "--gpus"},
      {"--params 7B --pcie-gbps -3", "--pcie-gbps"},
      {"--layers 0 --hidden 4096", "at least 1"},
      {"--params 7B --nvme-budget 2048TiB", "more than"},
      {"--params 7B --bogus", "--bogus"},
      {"--params 7B --explain", "--explain needs the group count"},
      {"--params 7B --groups 4", "--groups needs --explain"},
      {"--params 7B --explain --groups 0", "--groups must be in 1..4096"},
  };
  for (const auto& [args, why] : cases) {
    const Outcome run = Plan(args);
    EXPECT_EQ(run.status, 1) << args;
    EXPECT_NE(run.err.find(why), std::string::npos)
        << args << " -> " << run.err;
    EXPECT_TRUE(run.out.empty()) << args;
  }
}

// The schedule is the engine's planner on forward, then backward with the
// optimizer's host fetch after each group.
TEST(PlanCliTest, ExplainPrintsTheEnginesScheduleForEveryGroup) {
  const Outcome run = Plan(
      "--layers 4 --hidden 1024 --device-budget 64MiB --host-budget 1GiB "
      "--nvme-budget 10GiB --explain");
  ASSERT_EQ(run.status, 0) << run.err;
  const std::string schedule = Section(run.out, "schedule (4 groups");
  ASSERT_FALSE(schedule.empty()) << run.out;
  EXPECT_NE(schedule.find("trace: 12 fetches over 4 groups"),
            std::string::npos);
  EXPECT_NE(schedule.find("    0 fetch layer.0 -> device"), std::string::npos);
  EXPECT_NE(schedule.find("    4 fetch layer.3 -> device"), std::string::npos);
  EXPECT_NE(schedule.find("    5 fetch layer.3 -> host"), std::string::npos);
  EXPECT_NE(schedule.find("   11 fetch layer.0 -> host"), std::string::npos);
  EXPECT_NE(schedule.find("prefetch #"), std::string::npos);
  EXPECT_NE(schedule.find("I/O floor:"), std::string::npos);

  const Outcome json =
      Plan("--params 100M --device-budget 64MiB --explain --groups 3 --json");
  ASSERT_EQ(json.status, 0) << json.err;
  const nlohmann::json doc = Json(json);
  ASSERT_TRUE(doc.is_object()) << json.out;
  EXPECT_EQ(doc["explain"]["groups"], 3);
  EXPECT_NE(doc["explain"]["schedule"].get<std::string>().find(
                "trace: 9 fetches over 3 groups"),
            std::string::npos);
}

TEST(PlanCliTest, HelpExitsZero) {
  const Outcome run = Plan("--help");
  EXPECT_EQ(run.status, 0);
  EXPECT_NE(run.out.find("--device-budget"), std::string::npos);
  EXPECT_NE(run.out.find("Exit status"), std::string::npos);
}

TEST(PlanCliTest, MeasureReportsMeasuredRatesAndCleansUp) {
  strata::testutil::ScratchDir swap;
  const Outcome run =
      Plan("--params 1B --measure --json --swap-dir " + swap.path());
  ASSERT_EQ(run.status, 0) << run.err;
  const nlohmann::json doc = Json(run);
  ASSERT_FALSE(doc.is_discarded()) << run.out;
  for (const char* link : {"nvme_read", "nvme_write", "host_memory"}) {
    const nlohmann::json& rate = doc["traffic"][link]["rate"];
    EXPECT_EQ(rate["source"], "measured") << link;
    EXPECT_GT(rate["gbps"].get<double>(), 0) << link;
    EXPECT_FALSE(rate["note"].get<std::string>().empty()) << link;
  }
  // PCIe is measured only with a GPU; otherwise it says why not.
  const nlohmann::json& h2d = doc["traffic"]["h2d"]["rate"];
  if (h2d["source"] == "measured") {
    EXPECT_GT(h2d["gbps"].get<double>(), 0);
  } else {
    EXPECT_EQ(h2d["source"], "assumed");
    EXPECT_NE(h2d["note"].get<std::string>().find("not measured"),
              std::string::npos);
  }
  EXPECT_TRUE(std::filesystem::is_empty(swap.path()));
}

TEST(PlanCliTest, MeasureWithoutSwapDirUsesAndRemovesATempDirHere) {
  strata::testutil::ScratchDir cwd;
  const Outcome run = Plan("--params 1B --measure", cwd.path());
  ASSERT_EQ(run.status, 0) << run.err;
  const std::string floor = Section(run.out, "step-time floor");
  EXPECT_NE(LineStartingWith(floor, "  NVMe->host").find("measured"),
            std::string::npos)
      << run.out;
  EXPECT_TRUE(std::filesystem::is_empty(cwd.path()));
}

TEST(PlanCliTest, MeasureFailsClearlyOnAMissingSwapDir) {
  strata::testutil::ScratchDir dir;
  const Outcome run =
      Plan("--params 1B --measure --swap-dir " + dir.File("missing"));
  EXPECT_EQ(run.status, 1);
  EXPECT_NE(run.err.find("NVMe probe in '" + dir.File("missing")),
            std::string::npos)
      << run.err;
  EXPECT_TRUE(run.out.empty());
}

}  // namespace
