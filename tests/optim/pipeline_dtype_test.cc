// The offloaded optimizer over a model that mixes what pipeline_test's
// uniform bf16 layers do not: fp32 and fp16 compute copies, an fp32 group
// without a master (stepped in place), a frozen group (neither master nor
// state) beside the trained ones, and sparse gradients (only some elements
// written, the rest left as the zeros AcquireGradients promises). Each
// trained group is checked against cpu_adam stepping a flat copy of its
// chunks in memory, bit for bit: with the state on the host, and on NVMe
// with speculative steps and a skipped one; with the state in fp32, in bf16
// (the reference rounding as the pipeline must: seed = group id) and in
// int8 (stepped tensor by tensor: the tensor of 4096 elements or more in
// 8 bits, the smaller ones in fp32).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "strata/cpu_adam.h"
#include "strata/engine.h"
#include "strata/offload_optimizer.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr int kFrozen = 0;
constexpr int kSteps = 4;
// Group ids 1.. are trained: one per compute dtype with a master, and an
// fp32 one without.
struct Trained {
  DType dtype;
  bool master;
};
const std::vector<Trained> kTrained = {{DType::kFloat32, true},
                                       {DType::kFloat16, true},
                                       {DType::kBFloat16, true},
                                       {DType::kFloat32, false}};
constexpr int kWithMaster = 3;
// With the state on NVMe: the step whose gradients carry a NaN.
constexpr int kPoisoned = 2;

FloatType FloatTypeOf(DType dtype) {
  return dtype == DType::kFloat32   ? FloatType::kF32
         : dtype == DType::kFloat16 ? FloatType::kF16
                                    : FloatType::kBF16;
}

// The parameters: optimizer state (and masters, kept gradients) homed on
// NVMe, with clipping that never fires and skip-on-overflow, so groups
// with a master step speculatively and one step is skipped; the state
// format.
class MixedModelTest
    : public testing::TestWithParam<std::tuple<bool, StateFormat>> {
 protected:
  // A tensor's place in the flat arrays and, with int8 state, its own
  // state (codes and scales, or fp32 for a small tensor).
  struct Tensor {
    std::string name;
    uint64_t element = 0, elements = 0;
    StateFormat state = StateFormat::kF32;
    std::vector<char> m, v;
  };
  struct Group {
    DType dtype = DType::kFloat32;
    bool has_master = true;
    uint64_t n = 0;  // elements of each role's chunk, padding included
    std::vector<float> master, grads;
    std::vector<char> compute;  // n elements of dtype
    std::vector<char> m, v;     // n elements of the state format (not int8)
    std::vector<Tensor> tensors;
  };

  bool OnNvme() const { return std::get<0>(GetParam()); }
  StateFormat State() const { return std::get<1>(GetParam()); }
  bool Packed() const { return State() == StateFormat::kQ8; }
  size_t StateWidth() const { return State() == StateFormat::kBF16 ? 2 : 4; }

  void SetUp() override {
    EngineOptions options;
    options.device = "host";
    options.device_budget = options.host_budget = 4 * kMiB;
    options.state_format = State();
    if (OnNvme()) {
      options.nvme_budget = 16 * kMiB;
      options.swap_dir = scratch_.path();
      for (Role role :
           {Role::kMaster, Role::kState1, Role::kState2, Role::kGrad}) {
        options.placement.home[static_cast<int>(role)] = Tier::kNvme;
      }
    }
    auto engine = Engine::Open(options);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    engine_ = std::move(*engine);
    GroupSpec frozen;
    frozen.name = "frozen";
    frozen.tensors.push_back(
        {"embed", {3000}, DType::kBFloat16, RoleBit(Role::kCompute)});
    ASSERT_EQ(*engine_->RegisterGroup(frozen), kFrozen);
    for (const Trained& t : kTrained) {
      GroupSpec spec;
      spec.name = "layer." + std::string(DTypeName(t.dtype)) +
                  (t.master ? "" : ".in_place");
      const RoleMask roles =
          t.master ? kAllRoles : kAllRoles & ~RoleBit(Role::kMaster);
      // Sizes off the vector width and the tensor alignment: padding sits
      // between the tensors, and the last element is a real one.
      spec.tensors.push_back({"w", {37, 29}, t.dtype, roles});
      spec.tensors.push_back({"b", {333}, t.dtype, roles});
      spec.tensors.push_back({"u", {65, 64}, t.dtype, roles});  // 8-bit
      ASSERT_TRUE(engine_->RegisterGroup(spec).ok());
    }
    OffloadOptimizerOptions o;
    o.threads = 2;
    if (OnNvme()) {
      o.clip_norm = 1e6;
      o.skip_on_overflow = true;
    }
    auto opt = OffloadOptimizer::Create(engine_.get(), o);
    ASSERT_TRUE(opt.ok()) << opt.status().message();
    optimizer_ = std::move(*opt);
    auto cpu = CpuOptimizer::Create({CpuIsa::kAuto, 2});
    ASSERT_TRUE(cpu.ok());
    cpu_ = std::move(*cpu);
    InitWeights();
  }

  // Random masters in the engine and the reference (the compute copy of a
  // group without one); the frozen group's compute copy gets random bits,
  // which no step may change.
  void InitWeights() {
    std::mt19937_64 rng(5);
    std::normal_distribution<float> dist(0.0f, 0.5f);
    groups_.resize(engine_->group_count());
    for (int g = 1; g < engine_->group_count(); ++g) {
      Group& r = groups_[g];
      r.dtype = kTrained[g - 1].dtype;
      r.has_master = kTrained[g - 1].master;
      const Role role = r.has_master ? Role::kMaster : Role::kCompute;
      auto view = engine_->Fetch(g, Tier::kHost, {RoleBit(role), true});
      ASSERT_TRUE(view.ok()) << view.status().message();
      const auto* base = static_cast<const char*>(view->tensors[0].data);
      for (const TensorView& t : view->tensors) {
        const char* at = static_cast<const char*>(t.data);
        base = std::min(base, at);
      }
      for (const TensorView& t : view->tensors) {
        const uint64_t at = (static_cast<const char*>(t.data) - base) / 4;
        r.n = std::max(r.n, at + t.bytes / 4);
        Tensor& rt = r.tensors.emplace_back();
        rt.name = t.name;
        rt.element = at;
        rt.elements = t.bytes / 4;
        rt.state = Packed() && rt.elements >= 4096 ? StateFormat::kQ8
                                                   : StateFormat::kF32;
        const uint64_t bytes = rt.state == StateFormat::kQ8
                                   ? Q8Blocks(rt.elements) * (kQ8Block + 4)
                                   : rt.elements * 4;
        rt.m.assign(bytes, 0);
        rt.v.assign(bytes, 0);
      }
      r.master.assign(r.n, 0.0f);
      r.m.assign(r.n * StateWidth(), 0);
      r.v.assign(r.n * StateWidth(), 0);
      r.compute.assign(r.n * DTypeSize(r.dtype), 0);
      for (const TensorView& t : view->tensors) {
        auto* data = static_cast<float*>(t.data);
        const uint64_t at = (static_cast<const char*>(t.data) - base) / 4;
        for (uint64_t i = 0; i < t.bytes / 4; ++i) {
          data[i] = r.master[at + i] = dist(rng);
        }
      }
      ASSERT_TRUE(view->pin.Release().ok());
    }
    auto view = engine_->Fetch(kFrozen, Tier::kHost, {kAllRoles, true});
    ASSERT_TRUE(view.ok()) << view.status().message();
    const TensorView& t = view->tensors[0];
    frozen_.resize(t.bytes);
    for (char& c : frozen_) c = static_cast<char>(rng());
    std::memcpy(t.data, frozen_.data(), t.bytes);
    ASSERT_TRUE(view->pin.Release().ok());
  }

  // Gradients of step `s` for group `g`: a third of the elements (a
  // different third each step) get values, the rest stay zero; `poison`
  // makes the first of them a NaN.
  void Backward(int s, int g, bool poison = false) {
    Group& r = groups_[g];
    auto buffer = optimizer_->AcquireGradients(g);
    ASSERT_TRUE(buffer.ok()) << buffer.status().message();
    ASSERT_EQ(buffer->bytes, r.n * DTypeSize(r.dtype));
    std::mt19937_64 rng(s * 131 + g);
    std::normal_distribution<float> dist(0.0f, 0.05f);
    std::vector<float> wide(r.n, 0.0f);
    for (uint64_t i = (s + g) % 3; i < r.n; i += 3) wide[i] = dist(rng);
    if (poison) wide[(s + g) % 3] = std::nanf("");
    // Written through the compute dtype, so the reference sees exactly
    // the gradients the pipeline gets.
    std::vector<char> narrow(buffer->bytes);
    r.grads.resize(r.n);
    if (r.dtype == DType::kFloat32) {
      std::memcpy(narrow.data(), wide.data(), narrow.size());
      r.grads = wide;
    } else {
      const FloatType type = FloatTypeOf(r.dtype);
      ASSERT_TRUE(
          cpu_->Convert(wide.data(), FloatType::kF32, narrow.data(), type, r.n)
              .ok());
      ASSERT_TRUE(cpu_->Convert(narrow.data(), type, r.grads.data(),
                                FloatType::kF32, r.n)
                      .ok());
    }
    auto* out = static_cast<char*>(buffer->data);
    for (uint64_t i = (s + g) % 3; i < r.n; i += 3) {
      const size_t width = DTypeSize(r.dtype);
      std::memcpy(out + i * width, narrow.data() + i * width, width);
    }
    ASSERT_TRUE(optimizer_->HandOff(*buffer).ok());
  }

  void ReferenceStep(const StepHyper& h, int64_t step) {
    StepOptions o;
    o.algo = OptimAlgo::kAdamW;
    o.hyper = {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.lr_decay, step};
    o.prep = {static_cast<float>(1.0 / h.loss_scale), 1.0f};
    for (size_t g = 1; g < groups_.size(); ++g) {
      Group& r = groups_[g];
      const bool f32 = r.dtype == DType::kFloat32;
      OptimBuffers b;
      b.params = r.master.data();
      b.grads = r.grads.data();
      b.grad_type = FloatType::kF32;
      b.state1 = r.m.data();
      b.state2 = r.v.data();
      b.state_format = State();
      b.seed = static_cast<uint32_t>(g);
      b.params_out = f32 ? nullptr : r.compute.data();
      b.out_type = f32 ? FloatType::kBF16 : FloatTypeOf(r.dtype);
      b.n = r.n;
      if (Packed()) {
        StepTensors(o, b, r);
      } else {
        auto report = cpu_->Step(o, b);
        ASSERT_TRUE(report.ok() && !report->overflow());
      }
      if (f32) std::memcpy(r.compute.data(), r.master.data(), r.n * 4);
    }
  }

  // The reference of a group with int8 state: a step per tensor, each in
  // its own format, over the group's buffers `b`.
  void StepTensors(const StepOptions& o, const OptimBuffers& b, Group& r) {
    for (Tensor& t : r.tensors) {
      OptimBuffers tb = b;
      tb.params = r.master.data() + t.element;
      tb.grads = r.grads.data() + t.element;
      tb.state1 = t.m.data();
      tb.state2 = t.v.data();
      tb.state_format = t.state;
      if (t.state == StateFormat::kQ8) {
        const uint64_t codes = Q8Blocks(t.elements) * kQ8Block;
        tb.state1_scale = reinterpret_cast<float*>(t.m.data() + codes);
        tb.state2_scale = reinterpret_cast<float*>(t.v.data() + codes);
      }
      if (b.params_out != nullptr) {
        tb.params_out = r.compute.data() + t.element * DTypeSize(r.dtype);
      }
      tb.n = t.elements;
      auto report = cpu_->Step(o, tb);
      ASSERT_TRUE(report.ok() && !report->overflow());
    }
  }

  // The reference's bytes of state role `role` of tensor `name`.
  const char* ReferenceState(const Group& r, const std::string& name,
                             Role role) const {
    for (const Tensor& t : r.tensors) {
      if (t.name != name) continue;
      if (Packed()) return (role == Role::kState1 ? t.m : t.v).data();
      return (role == Role::kState1 ? r.m : r.v).data() +
             t.element * StateWidth();
    }
    return nullptr;
  }

  // Every trained chunk, padding included, against the reference; the
  // frozen group's compute copy as it was written.
  void ExpectEqualToReference(int steps) {
    for (size_t g = 1; g < groups_.size(); ++g) {
      const Group& r = groups_[g];
      for (Role role :
           {Role::kCompute, Role::kMaster, Role::kState1, Role::kState2}) {
        if (role == Role::kMaster && !r.has_master) continue;
        auto view = engine_->Fetch(g, Tier::kHost, {RoleBit(role)});
        ASSERT_TRUE(view.ok()) << view.status().message();
        const char* base = static_cast<const char*>(view->tensors[0].data);
        for (const TensorView& t : view->tensors) {
          base = std::min(base, static_cast<const char*>(t.data));
          if (role != Role::kState1 && role != Role::kState2) continue;
          const bool q8 = Packed() && t.name == "u";
          EXPECT_EQ(t.dtype, q8         ? DType::kUInt8
                             : Packed() ? DType::kFloat32
                                        : RoleDType(role, r.dtype, State()));
          EXPECT_EQ(t.bytes, t.name == "w"   ? 37 * 29 * StateWidth()
                             : t.name == "b" ? 333 * StateWidth()
                             : q8            ? 17 * (256 + 4)
                                             : 65 * 64 * StateWidth());
          EXPECT_EQ(
              std::memcmp(t.data, ReferenceState(r, t.name, role), t.bytes), 0)
              << "tensor '" << t.name << "' of group '"
              << engine_->group_name(g) << "' role " << RoleName(role)
              << " differs after " << steps << " steps";
        }
        if (Packed() && role != Role::kCompute && role != Role::kMaster) {
          ASSERT_TRUE(view->pin.Release().ok());
          continue;  // compared tensor by tensor
        }
        const void* expect = role == Role::kCompute  ? r.compute.data()
                             : role == Role::kMaster ? r.master.data()
                             : role == Role::kState1
                                 ? static_cast<const void*>(r.m.data())
                                 : r.v.data();
        const uint64_t bytes =
            r.n * (role == Role::kCompute  ? DTypeSize(r.dtype)
                   : role == Role::kMaster ? 4
                                           : StateWidth());
        EXPECT_EQ(std::memcmp(base, expect, bytes), 0)
            << "group '" << engine_->group_name(g) << "' role "
            << RoleName(role) << " differs after " << steps << " steps";
        ASSERT_TRUE(view->pin.Release().ok());
      }
    }
    auto view = engine_->Fetch(kFrozen, Tier::kHost);
    ASSERT_TRUE(view.ok()) << view.status().message();
    EXPECT_EQ(
        std::memcmp(view->tensors[0].data, frozen_.data(), frozen_.size()), 0)
        << "the frozen group changed";
    ASSERT_TRUE(view->pin.Release().ok());
  }

  // The store hashed nothing: the optimizer's pass verified every byte it
  // read from NVMe (Note [Unchecked host copies]), and every write-down
  // of a step's bytes came with the digest the pass made of them (Note
  // [Checksums in the optimizer's pass]).
  void ExpectThePassHashedWhatItReadAndWrote() const {
    const EngineStats st = engine_->stats();
    uint64_t read = 0, written = 0;
    for (const EngineStats::TierBytes& role : st.role_bytes) {
      read +=
          role[static_cast<int>(Tier::kNvme)][static_cast<int>(Tier::kHost)];
      written +=
          role[static_cast<int>(Tier::kHost)][static_cast<int>(Tier::kNvme)];
    }
    EXPECT_GT(read, 0u);
    EXPECT_GT(written, 0u);
    EXPECT_EQ(st.nvme_bytes_hashed, 0u)
        << "of " << read << " bytes read and " << written << " written";
  }

  testutil::ScratchDir scratch_;  // outlives the engine's swap files
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<OffloadOptimizer> optimizer_;
  std::unique_ptr<CpuOptimizer> cpu_;
  std::vector<Group> groups_;
  std::vector<char> frozen_;
};

// fp32 and fp16 compute copies are written in their own dtype, an fp32
// group without a master steps its compute copy in place, a frozen group
// needs no hand-off and is never touched, and the elements a caller leaves
// unwritten count as zero gradients in every step, whichever group last
// used the buffer. With the state on NVMe, every group with a master steps
// speculatively from the second step on, the one without never does (its
// old bytes could not be restored), and a step with a NaN changes nothing.
TEST_P(MixedModelTest, EveryDtypeStepsExactlyAndFrozenGroupsStayAsTheyWere) {
  EXPECT_EQ(optimizer_->AcquireGradients(kFrozen).status().code(),
            StatusCode::kFailedPrecondition)
      << "outside a step";
  int64_t steps = 0;
  for (int s = 0; s < kSteps; ++s) {
    StepHyper h;
    h.lr = 1e-2 * (1 + s);
    h.weight_decay = 0.01;
    h.loss_scale = 4.0;
    ASSERT_TRUE(optimizer_->BeginStep(h).ok());
    if (s == 0) {
      EXPECT_EQ(optimizer_->AcquireGradients(kFrozen).status().code(),
                StatusCode::kInvalidArgument);
    }
    // The NaN is in the first hand-off (the group without a master), so
    // every other group still steps speculatively, to be undone.
    const bool poison = OnNvme() && s == kPoisoned;
    const int last = engine_->group_count() - 1;
    for (int g = last; g >= 1; --g) Backward(s, g, poison && g == last);
    Result<OptimStepReport> report = optimizer_->FinishStep();
    ASSERT_TRUE(report.ok()) << report.status().message();
    ASSERT_EQ(report->skipped, poison);
    if (!poison) ReferenceStep(h, ++steps);
    ASSERT_EQ(report->step, steps);
    EXPECT_EQ(report->speculated, OnNvme() && s > 0 ? kWithMaster : 0)
        << "step " << s + 1;
    ASSERT_TRUE(engine_->Drain().ok());
    ExpectEqualToReference(s + 1);
  }
  if (OnNvme()) ExpectThePassHashedWhatItReadAndWrote();
}

// With the state on NVMe, every byte a step wrote is in the swap files,
// checksummed in the optimizer's pass (Note [Checksums in the optimizer's
// pass]). A byte flipped in every 4 KiB of them is caught by the next
// step's pass, which verifies what it reads: the step fails with kDataLoss
// and never trains on the bytes.
TEST_P(MixedModelTest, AByteFlippedInTheSwapFilesFailsTheNextStep) {
  if (!OnNvme()) GTEST_SKIP() << "the state is on the host";
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(optimizer_->BeginStep(StepHyper{}).ok());
    for (int g = engine_->group_count() - 1; g >= 1; --g) Backward(s, g);
    ASSERT_TRUE(optimizer_->FinishStep().ok());
  }
  ASSERT_TRUE(engine_->Drain().ok());
  ExpectThePassHashedWhatItReadAndWrote();
  for (int g = 0; g < engine_->group_count(); ++g) {
    ASSERT_TRUE(engine_->Evict(g, Tier::kHost).ok());
  }
  int files = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(scratch_.path())) {
    if (entry.path().extension() != ".bin") continue;
    const int fd = open(entry.path().c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << entry.path();
    for (off_t at = 100; at < static_cast<off_t>(entry.file_size());
         at += 4096) {
      char byte = 0;
      ASSERT_EQ(pread(fd, &byte, 1, at), 1);
      byte ^= 0x20;
      ASSERT_EQ(pwrite(fd, &byte, 1, at), 1);
    }
    ASSERT_EQ(fsync(fd), 0);
    close(fd);
    ++files;
  }
  ASSERT_GT(files, 0);
  Status status = optimizer_->BeginStep(StepHyper{});
  for (int g = engine_->group_count() - 1; status.ok() && g >= 1; --g) {
    Result<GradientBuffer> buffer = optimizer_->AcquireGradients(g);
    status = buffer.ok() ? optimizer_->HandOff(*buffer) : buffer.status();
  }
  if (status.ok()) status = optimizer_->FinishStep().status();
  ASSERT_EQ(status.code(), StatusCode::kDataLoss) << status.ToString();
  // Found by the pass (Note [Unchecked host copies]), naming the chunk.
  EXPECT_NE(status.message().find("): NVMe tier: checksum mismatch"),
            std::string::npos)
      << status.message();
  // And no group hands its state out afterwards: each is lost, or back on
  // NVMe as it was and failing its checksum again.
  for (int g = 1; g < engine_->group_count(); ++g) {
    auto view = engine_->Fetch(g, Tier::kHost, {RoleBit(Role::kState1)});
    EXPECT_EQ(view.status().code(), StatusCode::kDataLoss)
        << "group " << g << ": " << view.status().ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(
    StateHome, MixedModelTest,
    testing::Combine(testing::Bool(),
                     testing::Values(StateFormat::kF32, StateFormat::kBF16,
                                     StateFormat::kQ8)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) ? "nvme_speculative"
                                                 : "host") +
             "_" + std::string(StateFormatName(std::get<1>(info.param)));
    });

// Only an fp32 compute copy can be its own master: a bf16 group with state
// but no master is refused, naming the group and the fix.
TEST(OffloadOptimizerCreateTest, ANarrowGroupWithoutAMasterIsRefused) {
  EngineOptions options;
  options.device = "host";
  options.device_budget = options.host_budget = 4 * kMiB;
  auto opened = Engine::Open(options);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  GroupSpec spec;
  spec.name = "layer.0";
  spec.tensors.push_back(
      {"w", {1000}, DType::kBFloat16, kAllRoles & ~RoleBit(Role::kMaster)});
  ASSERT_TRUE((*opened)->RegisterGroup(spec).ok());
  auto opt = OffloadOptimizer::Create(opened->get(), {});
  ASSERT_EQ(opt.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(opt.status().message().find("group 'layer.0'"), std::string::npos)
      << opt.status().message();
  EXPECT_NE(opt.status().message().find("register its tensors with 'master'"),
            std::string::npos)
      << opt.status().message();
}

// An engine on the host with int8 state and one group, "layer.0", of one
// tensor "w" of 5000 elements.
std::unique_ptr<Engine> Int8Engine(DType dtype, RoleMask roles) {
  EngineOptions options;
  options.device = "host";
  options.device_budget = options.host_budget = 4 * kMiB;
  options.state_format = StateFormat::kQ8;
  auto opened = Engine::Open(options);
  EXPECT_TRUE(opened.ok()) << opened.status().message();
  if (!opened.ok()) return nullptr;
  GroupSpec spec;
  spec.name = "layer.0";
  spec.tensors.push_back({"w", {5000}, dtype, roles});
  EXPECT_TRUE((*opened)->RegisterGroup(spec).ok());
  return std::move(*opened);
}

// int8 state is Adam's and AdamW's alone: another algorithm is refused at
// Create, naming the group and the formats it can step.
TEST(OffloadOptimizerCreateTest, Int8StateOfAnotherAlgorithmIsRefused) {
  std::unique_ptr<Engine> engine =
      Int8Engine(DType::kBFloat16, kAllRoles & ~RoleBit(Role::kState2));
  ASSERT_NE(engine, nullptr);
  auto opt = OffloadOptimizer::Create(engine.get(), {.algo = OptimAlgo::kLion});
  ASSERT_EQ(opt.status().code(), StatusCode::kFailedPrecondition);
  for (const char* part : {"group 'layer.0'", "int8", "fp32 or bf16"}) {
    EXPECT_NE(opt.status().message().find(part), std::string::npos)
        << opt.status().message();
  }
}

// A finite gradient whose square overflows stops an int8 step (the block's
// v would not be finite): FinishStep fails naming the group, int8 and the
// ways out, not as an internal error.
TEST(OffloadOptimizerInt8Test, AGradientThatOverflowsTheStateNamesTheFix) {
  std::unique_ptr<Engine> engine = Int8Engine(DType::kFloat32, kAllRoles);
  ASSERT_NE(engine, nullptr);
  auto opt = OffloadOptimizer::Create(engine.get(), {});
  ASSERT_TRUE(opt.ok()) << opt.status().message();
  ASSERT_TRUE((*opt)->BeginStep({}).ok());
  auto buffer = (*opt)->AcquireGradients(0);
  ASSERT_TRUE(buffer.ok()) << buffer.status().message();
  static_cast<float*>(buffer->data)[10] = 1e30f;
  ASSERT_TRUE((*opt)->HandOff(*buffer).ok());
  Result<OptimStepReport> report = (*opt)->FinishStep();
  ASSERT_EQ(report.status().code(), StatusCode::kFailedPrecondition)
      << report.status().ToString();
  for (const char* part : {"group 'layer.0'", "int8", "clip_norm"}) {
    EXPECT_NE(report.status().message().find(part), std::string::npos)
        << report.status().message();
  }
}

// The device budget holds the gradient buffers beside a compute copy, but a
// warm-up pass left every compute copy cached there: Create makes room by
// evicting them, as every other allocation of the engine does, instead of
// failing with "raise the device budget".
TEST(OffloadOptimizerCreateTest, CachedCopiesMakeRoomForTheBuffers) {
  EngineOptions options;
  options.device = "host";
  options.device_budget = 1 * kMiB;
  options.host_budget = 16 * kMiB;
  options.placement.device_roles = RoleBit(Role::kCompute);
  auto opened = Engine::Open(options);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  std::unique_ptr<Engine> engine = std::move(*opened);
  for (int g = 0; g < 4; ++g) {  // 200 KB of bf16 compute each
    GroupSpec spec;
    spec.name = "layer." + std::to_string(g);
    spec.tensors.push_back({"w", {100000}, DType::kBFloat16, kAllRoles});
    ASSERT_TRUE(engine->RegisterGroup(spec).ok());
  }
  for (int g = 0; g < 4; ++g) {
    // The view's pin is released with the temporary.
    ASSERT_TRUE(
        engine->Fetch(g, Tier::kDevice, {RoleBit(Role::kCompute)}).ok());
  }
  ASSERT_LT(engine->stats().tiers[0].budget - engine->stats().tiers[0].used,
            400000u)
      << "the warm-up should leave less than the buffers free";
  auto opt = OffloadOptimizer::Create(engine.get(), {});
  ASSERT_TRUE(opt.ok()) << opt.status().message();
  ASSERT_TRUE((*opt)->BeginStep({}).ok());
  for (int g = 3; g >= 0; --g) {
    auto buffer = (*opt)->AcquireGradients(g);
    ASSERT_TRUE(buffer.ok()) << buffer.status().message();
    ASSERT_TRUE((*opt)->HandOff(*buffer).ok());
  }
  auto report = (*opt)->FinishStep();
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->step, 1);
}

}  // namespace
}  // namespace strata
