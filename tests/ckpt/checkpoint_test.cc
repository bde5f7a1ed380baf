// Engine::Save and Engine::Load (src/ckpt/checkpoint.h) through the public C++
// API, on the host-emulated device: round trips into another placement,
// replacement, damaged checkpoints, mismatched engines, preconditions, the
// host budget and a full disk. Crashes: checkpoint_crash_test.cc.
#include "src/ckpt/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/engine.h"
#include "tests/ckpt/checkpoint_util.h"
#include "tests/store/store_util.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using store_test::kKiB;
using store_test::Layer;

constexpr RoleMask kCompute = RoleBit(Role::kCompute);
constexpr RoleMask kMaster = RoleBit(Role::kMaster);
constexpr RoleMask kStates = RoleBit(Role::kState1) | RoleBit(Role::kState2);

Placement Homes(Tier compute, Tier master, Tier states) {
  Placement p;
  p.home = {compute, master, states, states, Tier::kHost};
  return p;
}

// Mixed dtypes and roles homed on the device, the host and NVMe (the
// engine's default, for the layers).
std::vector<GroupSpec> Model(int layers) {
  std::vector<GroupSpec> model;
  model.push_back({"embed",
                   {{"w", {64, 96}, DType::kBFloat16, kCompute | kMaster},
                    {"b", {96}, DType::kFloat32, kCompute | kMaster | kStates}},
                   false,
                   Homes(Tier::kDevice, Tier::kHost, Tier::kNvme)});
  for (int i = 0; i < layers; ++i) {
    model.push_back({"layer." + std::to_string(i),
                     {{"w", {33, 128}, DType::kFloat16, kAllRoles},
                      {"n", {7}, DType::kBFloat16, kCompute}},
                     true,
                     {}});
  }
  model.push_back({"head",
                   {{"x", {1000}, DType::kFloat32, kMaster | kStates}},
                   false,
                   Homes(Tier::kHost, Tier::kHost, Tier::kHost)});
  return model;
}

// The target placement: every role on the host, tensors in reverse order
// (so the chunk layout differs too).
std::vector<GroupSpec> Rearranged(std::vector<GroupSpec> model) {
  for (GroupSpec& spec : model) {
    spec.use_default_placement = true;
    std::reverse(spec.tensors.begin(), spec.tensors.end());
  }
  return model;
}

uint64_t Key(const std::string& group, const TensorView& t, uint64_t seed) {
  const std::string name = group + "/" + t.name + "/" +
                           std::string(RoleName(t.role)) + "/" +
                           std::to_string(seed);
  return std::hash<std::string>()(name);
}

// Writes a pattern of (group, tensor, role, seed) into every tensor, even
// groups through the device, odd ones through the host.
void Write(Engine& engine, uint64_t seed) {
  for (int g = 0; g < engine.group_count(); ++g) {
    const Tier tier = g % 2 == 0 ? Tier::kDevice : Tier::kHost;
    auto view = engine.Fetch(g, tier, {kAllRoles, true});
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    for (const TensorView& t : view->tensors) {
      testutil::FillRandom(t.data, t.bytes, Key(engine.group_name(g), t, seed));
    }
    ASSERT_TRUE(view->pin.Release().ok());
  }
}

// "" when every tensor holds Write(seed)'s pattern, else the first that
// does not.
std::string Differs(Engine& engine, uint64_t seed) {
  for (int g = 0; g < engine.group_count(); ++g) {
    auto view = engine.Fetch(g, Tier::kHost);
    if (!view.ok()) return view.status().ToString();
    std::string bad;
    for (const TensorView& t : view->tensors) {
      std::vector<char> want(t.bytes);
      testutil::FillRandom(want.data(), t.bytes,
                           Key(engine.group_name(g), t, seed));
      if (bad.empty() && std::memcmp(want.data(), t.data, t.bytes) != 0) {
        bad = engine.group_name(g) + "/" + t.name + "/" +
              std::string(RoleName(t.role));
      }
    }
    if (Status s = view->pin.Release(); !s.ok()) return s.ToString();
    if (!bad.empty()) return bad;
  }
  return "";
}

// The entries of `parent` whose names start with `prefix`.
std::vector<std::string> Siblings(const std::string& parent,
                                  const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(parent)) {
    const std::string name = e.path().filename();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

class CheckpointTest : public ::testing::Test {
 protected:
  // A host-emulated engine whose roles default to `home`, with NVMe in a
  // swap directory of its own when `nvme` > 0.
  std::unique_ptr<Engine> Open(Tier home, uint64_t device, uint64_t host,
                               uint64_t nvme,
                               const std::vector<GroupSpec>& model) {
    EngineOptions o;
    o.device = "host";
    o.device_budget = device;
    o.host_budget = host;
    o.nvme_budget = nvme;
    o.placement.home.fill(home);
    o.state_format = state_;
    if (nvme > 0) {
      o.swap_dir = dir_.File("swap-" + std::to_string(getpid()) + "-" +
                             std::to_string(swaps_++));
      fs::create_directory(o.swap_dir);
    }
    return ckpt_test::OpenWithModel(o, model);
  }
  // Small budgets, layers on NVMe.
  std::unique_ptr<Engine> Source(int layers = 2) {
    return Open(Tier::kNvme, 160 * kKiB, 512 * kKiB, 4096 * kKiB,
                Model(layers));
  }
  // Other budgets, no NVMe, everything on the host, tensors reordered.
  std::unique_ptr<Engine> Target(int layers = 2) {
    return Open(Tier::kHost, 1024 * kKiB, 4096 * kKiB, 0,
                Rearranged(Model(layers)));
  }
  std::string Ckpt() const { return dir_.File("ckpt"); }

  testutil::ScratchDir dir_;
  int swaps_ = 0;
  StateFormat state_ = StateFormat::kF32;  // of the engines opened
};

TEST_F(CheckpointTest, RoundTripIntoAnotherPlacement) {
  auto source = Source();
  ASSERT_NE(source, nullptr);
  Write(*source, 1);
  for (int step = 0; step < 2; ++step) {
    source->BeginStep();
    ASSERT_TRUE(source->Fetch(1, Tier::kDevice).ok());  // released at once
    ASSERT_TRUE(source->EndStep().ok());
  }
  const std::string state = R"({"step": 2, "lr": 0.001, "note": "Grüße"})";
  Status s = source->Save(Ckpt(), {state});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Differs(*source, 1), "");
  EXPECT_EQ(Siblings(dir_.path(), "ckpt"), std::vector<std::string>{"ckpt"});

  // One file per group holding only the real elements: "embed" has 64*96
  // bf16 + fp32 elements and 96 fp32 elements in four roles.
  EXPECT_EQ(fs::file_size(Ckpt() + "/group-000000.bin"),
            64 * 96 * (2 + 4) + 96 * 4 * 4);
  EXPECT_TRUE(fs::exists(Ckpt() + "/group-000003.bin"));
  EXPECT_FALSE(fs::exists(Ckpt() + "/group-000004.bin"));

  auto target = Target();
  ASSERT_NE(target, nullptr);
  LoadResult result;
  s = target->Load(Ckpt(), &result);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Differs(*target, 1), "");
  EXPECT_EQ(result.user_state, state);
  EXPECT_EQ(result.format_version, ckpt::kOldestFormatVersion);  // fp32 state
  EXPECT_EQ(result.steps, 2u);
  EXPECT_FALSE(result.recovered);
  EXPECT_GT(result.bytes, 64u * 96 * 6);

  // And back into the source's own placement, over other data.
  Write(*source, 9);
  s = source->Load(Ckpt());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Differs(*source, 1), "");
}

// State in bf16 or int8 (EngineOptions::state_format) is stored so in the
// engine and the file and is named in the manifest; an engine of another
// format is refused, naming both and the fix. fp32 state is not named, as
// in checkpoints from before the field.
TEST_F(CheckpointTest, TheStateFormatIsSavedAndAnotherRefused) {
  struct Case {
    StateFormat state;
    int group;       // whose file size is checked
    uint64_t bytes;  // ... and its bytes
    std::vector<std::string> said;
  };
  const std::vector<Case> cases = {
      // "embed": w (bf16 compute, master) and b (fp32 compute and master,
      // two state roles of 2 bytes).
      {StateFormat::kBF16,
       0,
       64 * 96 * (2 + 4) + 96 * (4 + 4 + 2 + 2),
       {"group 'embed'", "tensor 'b'", "state in bf16"}},
      // "layer.0": w (4224 fp16 elements, a master, gradients and 17
      // blocks of codes and scales in each state role) and n (7 bf16).
      {StateFormat::kQ8,
       1,
       4224 * (2 + 4 + 4) + 2 * 17 * (256 + 4) + 7 * 2,
       {"group 'layer.0'", "tensor 'w'", "state in int8"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(StateFormatName(c.state)));
    const std::string ckpt = Ckpt() + std::string(StateFormatName(c.state));
    state_ = c.state;
    auto source = Source();
    ASSERT_NE(source, nullptr);
    Write(*source, 1);
    ASSERT_TRUE(source->Save(ckpt).ok());
    EXPECT_EQ(
        fs::file_size(ckpt + "/group-00000" + std::to_string(c.group) + ".bin"),
        c.bytes);
    auto target = Target();
    ASSERT_NE(target, nullptr);
    LoadResult result;
    Status s = target->Load(ckpt, &result);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(Differs(*target, 1), "");
    EXPECT_EQ(result.format_version, 3);

    state_ = StateFormat::kF32;
    auto fp32 = Target();
    ASSERT_NE(fp32, nullptr);
    Write(*fp32, 7);
    s = fp32->Load(ckpt);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    std::vector<std::string> said = c.said;
    said.insert(said.end(), {"fp32 in this engine", "state format"});
    for (const std::string& part : said) {
      EXPECT_NE(s.message().find(part), std::string::npos)
          << "'" << part << "' not in: " << s.message();
    }
    EXPECT_EQ(Differs(*fp32, 7), "");
  }
  const std::string saved = dir_.File("fp32");
  auto fp32 = Target();
  ASSERT_TRUE(fp32->Save(saved).ok());
  std::ifstream manifest(saved + "/manifest.json");
  const std::string text((std::istreambuf_iterator<char>(manifest)),
                         std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"dtype\""), std::string::npos);
  EXPECT_EQ(text.find("state_dtype"), std::string::npos);
}

TEST_F(CheckpointTest, SaveReplacesAnExistingCheckpoint) {
  auto source = Source();
  ASSERT_NE(source, nullptr);
  Write(*source, 1);
  ASSERT_TRUE(source->Save(Ckpt(), {"one"}).ok());
  Write(*source, 2);
  Status s = source->Save(Ckpt(), {"two"});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Siblings(dir_.path(), "ckpt"), std::vector<std::string>{"ckpt"});
  auto target = Target();
  ASSERT_NE(target, nullptr);
  LoadResult result;
  ASSERT_TRUE(target->Load(Ckpt(), &result).ok());
  EXPECT_EQ(result.user_state, "two");
  EXPECT_EQ(Differs(*target, 2), "");
}

TEST_F(CheckpointTest, DamagedCheckpointFailsAndChangesNothing) {
  {
    auto source = Source();
    ASSERT_NE(source, nullptr);
    Write(*source, 1);
    ASSERT_TRUE(source->Save(Ckpt()).ok());
  }
  struct Case {
    const char* what;
    std::function<void(const std::string& dir)> damage;
    StatusCode code;
    std::vector<std::string> said;  // parts of the message
  };
  const std::string file = "group-000001.bin";
  const uint64_t size = fs::file_size(Ckpt() + "/" + file);
  const std::vector<Case> cases = {
      {"flipped byte",
       [&](auto& d) { ckpt_test::FlipByte(d + "/" + file, size / 2); },
       StatusCode::kDataLoss,
       {"checksum mismatch", file, "backup"}},
      {"truncated",
       [&](auto& d) { fs::resize_file(d + "/" + file, 100); },
       StatusCode::kDataLoss,
       {file, "truncated",
        "has 100 bytes, manifest says " + std::to_string(size)}},
      {"deleted",
       [&](auto& d) { fs::remove(d + "/" + file); },
       StatusCode::kDataLoss,
       {file, "missing"}},
      {"flipped byte in the last file",
       [](auto& d) { ckpt_test::FlipByte(d + "/group-000003.bin", 10); },
       StatusCode::kDataLoss,
       {"checksum mismatch", "group-000003.bin"}},
      {"too long",
       [&](auto& d) { fs::resize_file(d + "/" + file, size + 1); },
       StatusCode::kDataLoss,
       {file, "too long", "manifest says " + std::to_string(size)}},
      {"other version",
       [](auto& d) {
         ckpt_test::EditManifest(d, [](auto& m) { m["format_version"] = 99; });
       },
       StatusCode::kFailedPrecondition,
       {"version 99", "reads versions 2 to 3"}},
      {"older version",
       [](auto& d) {
         ckpt_test::EditManifest(d, [](auto& m) { m["format_version"] = 0; });
       },
       StatusCode::kFailedPrecondition,
       {"version 0", "reads versions 2 to 3"}},
      {"offset beyond the file",
       [&](auto& d) {
         ckpt_test::EditManifest(d, [&](auto& m) {
           m["groups"][1]["tensors"][0]["roles"]["compute"] = size - 2;
         });
       },
       StatusCode::kDataLoss,
       {"groups[1].tensors[0].roles.compute", "beyond the file"}},
      {"offset moved within the file",
       [](auto& d) {
         ckpt_test::EditManifest(d, [](nlohmann::json& m) {
           nlohmann::json& roles = m["groups"][1]["tensors"][0]["roles"];
           roles["master"] = roles["master"].get<uint64_t>() - 2;
         });
       },
       StatusCode::kDataLoss,
       {"groups[1].tensors[0].roles.master", "packed in order"}},
      {"tensor listed twice",
       [](auto& d) {
         ckpt_test::EditManifest(d, [](auto& m) {
           m["groups"][1]["tensors"][1] = m["groups"][1]["tensors"][0];
         });
       },
       StatusCode::kDataLoss,
       {"groups[1]", "listed twice"}},
      {"file outside the checkpoint (the original's, intact)",
       [](auto& d) {
         ckpt_test::EditManifest(d, [](auto& m) {
           m["groups"][1]["file"] = "../ckpt/group-000001.bin";
         });
       },
       StatusCode::kDataLoss,
       {"groups[1].file", "not a file name"}},
      {"wrong field type",
       [](auto& d) {
         ckpt_test::EditManifest(
             d, [](auto& m) { m["groups"][2]["bytes"] = "many"; });
       },
       StatusCode::kDataLoss,
       {"manifest.json", "groups[2]", "bytes"}},
      {"garbage manifest",
       [](auto& d) {
         std::ofstream(d + "/manifest.json", std::ios::trunc) << "{\"gro";
       },
       StatusCode::kDataLoss,
       {"manifest.json", "not valid JSON"}},
      {"no manifest",
       [](auto& d) { fs::remove(d + "/manifest.json"); },
       StatusCode::kNotFound,
       {"not a strata checkpoint"}},
      {"no directory",
       [](auto& d) { fs::remove_all(d); },
       StatusCode::kNotFound,
       {"does not exist"}},
  };
  auto target = Target();
  ASSERT_NE(target, nullptr);
  Write(*target, 7);
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string copy = dir_.File("damaged-" + std::to_string(i++));
    fs::copy(Ckpt(), copy);
    c.damage(copy);
    Status s = target->Load(copy);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), c.code) << s.ToString();
    for (const std::string& part : c.said) {
      EXPECT_NE(s.message().find(part), std::string::npos)
          << "'" << part << "' not in: " << s.message();
    }
    EXPECT_EQ(Differs(*target, 7), "");
  }
  ASSERT_TRUE(target->Load(Ckpt()).ok());
  EXPECT_EQ(Differs(*target, 1), "");
}

TEST_F(CheckpointTest, MismatchedEngineIsRefusedNamingTheDifference) {
  {
    auto source = Source();
    ASSERT_NE(source, nullptr);
    ASSERT_TRUE(source->Save(Ckpt()).ok());
  }
  struct Case {
    const char* what;
    std::function<void(std::vector<GroupSpec>&)> change;
    std::vector<std::string> said;
  };
  const std::vector<Case> cases = {
      {"shape",
       [](auto& m) {
         m[2].tensors[1].shape = {33, 127};
       },
       {"group 'layer.1'", "tensor 'w'", "[33, 128]", "[33, 127]"}},
      {"dtype",
       [](auto& m) { m[0].tensors[1].dtype = DType::kFloat32; },
       {"group 'embed'", "tensor 'w'", "bf16", "fp32"}},
      {"roles",
       [](auto& m) { m[3].tensors[0].roles = kMaster; },
       {"group 'head'", "tensor 'x'", "master,state1,state2"}},
      {"tensor name",
       [](auto& m) { m[1].tensors[0].name = "v"; },
       {"group 'layer.0'", "'n'"}},
      {"group name",
       [](auto& m) { m[1].name = "layer.9"; },
       {"'layer.0'", "'layer.9'"}},
      {"extra tensor in the engine",
       [](auto& m) {
         m[3].tensors.push_back({"y", {5}, DType::kFloat32, kMaster});
       },
       {"group 'head'", "checkpoint has 1 tensors", "engine has 2"}},
      {"group count", [](auto& m) { m.pop_back(); }, {"4 groups", "has 3"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<GroupSpec> model = Rearranged(Model(2));
    c.change(model);
    auto target = Open(Tier::kHost, 1024 * kKiB, 4096 * kKiB, 0, model);
    ASSERT_NE(target, nullptr);
    Write(*target, 7);
    Status s = target->Load(Ckpt());
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    for (const std::string& part : c.said) {
      EXPECT_NE(s.message().find(part), std::string::npos)
          << "'" << part << "' not in: " << s.message();
    }
    EXPECT_EQ(Differs(*target, 7), "");
  }
}

TEST_F(CheckpointTest, FetchedGroupOrOpenStepIsAPrecondition) {
  auto source = Source();
  ASSERT_NE(source, nullptr);
  ASSERT_TRUE(source->Save(Ckpt()).ok());
  auto view = source->Fetch(2, Tier::kHost);
  ASSERT_TRUE(view.ok());
  for (Status s : {source->Save(Ckpt()), source->Load(Ckpt())}) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find("'layer.1'"), std::string::npos) << s.message();
  }
  ASSERT_TRUE(view->pin.Release().ok());
  source->BeginStep();
  Status s = source->Save(Ckpt());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("EndStep"), std::string::npos) << s.message();
  ASSERT_TRUE(source->EndStep().ok());
  EXPECT_TRUE(source->Save(Ckpt()).ok());
}

TEST_F(CheckpointTest, SaveRefusesADirectoryThatIsNotACheckpoint) {
  auto source = Source();
  ASSERT_NE(source, nullptr);
  fs::create_directory(Ckpt());
  std::ofstream(Ckpt() + "/notes.txt") << "mine";
  Status s = source->Save(Ckpt());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("not a strata checkpoint"), std::string::npos)
      << s.message();
  EXPECT_TRUE(fs::exists(Ckpt() + "/notes.txt"));
  EXPECT_EQ(Siblings(dir_.path(), "ckpt"), std::vector<std::string>{"ckpt"});
  s = source->Save(dir_.File("no-such-parent/ckpt"));
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
}

TEST_F(CheckpointTest, UserStateThatIsNotUtf8FailsBeforeWriting) {
  auto source = Source();
  ASSERT_NE(source, nullptr);
  Status s = source->Save(Ckpt(), {"\xff\xfe"});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("UTF-8"), std::string::npos) << s.message();
  EXPECT_TRUE(Siblings(dir_.path(), "ckpt").empty());
}

// 24 NVMe-homed layers of 96 KiB each through a 256 KiB host tier.
TEST_F(CheckpointTest, NvmeModelLargerThanTheHostBudgetStreams) {
  constexpr uint64_t kHostBudget = 256 * kKiB;
  std::vector<GroupSpec> model;
  for (int i = 0; i < 24; ++i) {
    model.push_back(Layer("layer." + std::to_string(i), 16 * 1024));
  }
  auto source = Open(Tier::kNvme, 256 * kKiB, kHostBudget, 4096 * kKiB, model);
  ASSERT_NE(source, nullptr);
  Write(*source, 1);
  Status s = source->Save(Ckpt());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_LE(source->stats().tiers[1].peak, kHostBudget);
  auto target = Open(Tier::kNvme, 256 * kKiB, kHostBudget, 4096 * kKiB, model);
  ASSERT_NE(target, nullptr);
  s = target->Load(Ckpt());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_LE(target->stats().tiers[1].peak, kHostBudget);
  EXPECT_EQ(Differs(*target, 1), "");
}

TEST_F(CheckpointTest, FullDiskKeepsThePreviousCheckpoint) {
  testutil::Mount small("tmpfs", "size=1m");
  if (!small.ok()) GTEST_SKIP() << small.error();
  const std::string dir = small.path() + "/ckpt";
  const std::vector<GroupSpec> tiny = {Layer("tiny", 1000)};
  {
    auto engine = Open(Tier::kHost, 64 * kKiB, 64 * kKiB, 0, tiny);
    ASSERT_NE(engine, nullptr);
    Write(*engine, 1);
    ASSERT_TRUE(engine->Save(dir).ok());
  }
  std::vector<GroupSpec> big;
  for (int i = 0; i < 16; ++i) {
    big.push_back(Layer("layer." + std::to_string(i), 16 * 1024));
  }
  auto engine = Open(Tier::kHost, 256 * kKiB, 4096 * kKiB, 0, big);
  ASSERT_NE(engine, nullptr);
  Status s = engine->Save(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNoSpace) << s.ToString();
  EXPECT_NE(s.message().find("previous checkpoint at '" + dir + "' is kept"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(Siblings(small.path(), "ckpt"), std::vector<std::string>{"ckpt"});
  auto again = Open(Tier::kHost, 64 * kKiB, 64 * kKiB, 0, tiny);
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(again->Load(dir).ok());
  EXPECT_EQ(Differs(*again, 1), "");
}

}  // namespace
}  // namespace strata
