// strata-plan's arithmetic (tools/plan/estimate.h), without the binary.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "tools/plan/estimate.h"
#include "tools/plan/explain.h"

namespace strata::plan {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

Model Bf16(uint64_t params, uint32_t k = 12) {
  return Model{params, DType::kBFloat16, k};
}

Budgets MakeBudgets(std::optional<uint64_t> device,
                    std::optional<uint64_t> host,
                    std::optional<uint64_t> nvme) {
  return Budgets{device, host, nvme};
}

uint64_t LinkTotal(const std::vector<Transfer>& traffic, Link link) {
  return LinkBytes(traffic)[static_cast<int>(link)];
}

TEST(ParseParamCountTest, AcceptsSuffixesExponentsAndPlainNumbers) {
  EXPECT_EQ(*ParseParamCount("7.5B"), 7'500'000'000u);
  EXPECT_EQ(*ParseParamCount("7.5b"), 7'500'000'000u);
  EXPECT_EQ(*ParseParamCount("13e9"), 13'000'000'000u);
  EXPECT_EQ(*ParseParamCount("175M"), 175'000'000u);
  EXPECT_EQ(*ParseParamCount("350k"), 350'000u);
  EXPECT_EQ(*ParseParamCount("1.2T"), 1'200'000'000'000u);
  EXPECT_EQ(*ParseParamCount("1.1G"), 1'100'000'000u);
  EXPECT_EQ(*ParseParamCount("7500000000"), 7'500'000'000u);
  // Whole numbers past 2^53 stay exact.
  EXPECT_EQ(*ParseParamCount("900719925474099"), 900'719'925'474'099u);
  EXPECT_EQ(*ParseParamCount("1"), 1u);
}

TEST(ParseParamCountTest, RejectsGarbageAndOutOfRange) {
  for (const char* bad : {"", "abc", "7.5X", "7.5BB", "B", "1e", " 7B"}) {
    Result<uint64_t> r = ParseParamCount(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("7.5B"), std::string::npos)
        << "the message shows an example: " << r.status().message();
  }
  for (const char* bad : {"0", "-1", "0.1", "2e15", "1e300", "nan", "inf"}) {
    EXPECT_FALSE(ParseParamCount(bad).ok()) << bad;
  }
  EXPECT_TRUE(ParseParamCount(std::to_string(kMaxParams)).ok());
  EXPECT_FALSE(ParseParamCount(std::to_string(kMaxParams + 1)).ok());
}

TEST(DtypeTest, ParsesNamesAndSizes) {
  EXPECT_EQ(*ParseDType("bf16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("fp16"), DType::kFloat16);
  EXPECT_EQ(*ParseDType("fp32"), DType::kFloat32);
  EXPECT_FALSE(ParseDType("int8").ok());
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeName(DType::kFloat16), "fp16");
}

TEST(TransformerParamsTest, TwelveLHSquaredPlusEmbedding) {
  EXPECT_EQ(*TransformerParams(32, 4096, 0), 12ull * 32 * 4096 * 4096);
  EXPECT_EQ(*TransformerParams(32, 4096, 32000),
            12ull * 32 * 4096 * 4096 + 32000ull * 4096);
  EXPECT_EQ(*TransformerParams(1, 1, 0), 12u);
  EXPECT_FALSE(TransformerParams(0, 4096, 0).ok());
  EXPECT_FALSE(TransformerParams(32, 0, 0).ok());
  EXPECT_FALSE(TransformerParams(1, 1ull << 40, 0).ok());
  EXPECT_FALSE(TransformerParams(1ull << 62, 1ull << 62, 1ull << 62).ok());
  EXPECT_FALSE(TransformerParams(1, 1, kMaxParams).ok());
}

TEST(BytesPerParamTest, RolesSplitDtypeAndK) {
  const Model m = Bf16(1, 12);
  EXPECT_EQ(BytesPerParam(m, Role::kParams), 2u);
  EXPECT_EQ(BytesPerParam(m, Role::kGrads), 2u);
  EXPECT_EQ(BytesPerParam(m, Role::kMaster), 4u);
  EXPECT_EQ(BytesPerParam(m, Role::kOptimState), 8u);
  const Model fp32{1, DType::kFloat32, 16};
  EXPECT_EQ(BytesPerParam(fp32, Role::kParams), 4u);
  EXPECT_EQ(BytesPerParam(fp32, Role::kOptimState), 12u);
  EXPECT_EQ(BytesPerParam(Bf16(1, 4), Role::kOptimState), 0u);
}

TEST(PlaceTest, UnlimitedBudgetsKeepComputeOnDeviceAndStateOnHost) {
  const Placement p = Place(Bf16(1000), Budgets{});
  EXPECT_TRUE(p.fits());
  EXPECT_EQ(p.TierOf(Role::kParams), Tier::kDevice);
  EXPECT_EQ(p.TierOf(Role::kGrads), Tier::kDevice);
  EXPECT_EQ(p.TierOf(Role::kMaster), Tier::kHost);
  EXPECT_EQ(p.TierOf(Role::kOptimState), Tier::kHost);
  EXPECT_EQ(p.needs[0], 4000u);
  EXPECT_EQ(p.needs[1], 12000u);
  EXPECT_EQ(p.needs[2], 0u);
}

TEST(PlaceTest, DeviceBoundaryIsInclusive) {
  const Model m = Bf16(1000);  // params 2000 B, grads 2000 B
  Placement p = Place(m, MakeBudgets(4000, std::nullopt, 0));
  EXPECT_EQ(p.TierOf(Role::kParams), Tier::kDevice);
  EXPECT_EQ(p.TierOf(Role::kGrads), Tier::kDevice);
  p = Place(m, MakeBudgets(3999, std::nullopt, 0));
  EXPECT_EQ(p.TierOf(Role::kParams), Tier::kDevice);
  EXPECT_EQ(p.TierOf(Role::kGrads), Tier::kHost);
  p = Place(m, MakeBudgets(1999, std::nullopt, 0));
  EXPECT_EQ(p.TierOf(Role::kParams), Tier::kHost);
  EXPECT_EQ(p.TierOf(Role::kGrads), Tier::kHost);
  EXPECT_EQ(p.needs[0], 0u);
  EXPECT_TRUE(p.fits());
}

TEST(PlaceTest, HostBoundaryPushesStateToNvme) {
  const Model m = Bf16(1000);  // master 4000 B, m/v 8000 B
  Placement p = Place(m, MakeBudgets(std::nullopt, 12000, 0));
  EXPECT_EQ(p.TierOf(Role::kMaster), Tier::kHost);
  EXPECT_EQ(p.TierOf(Role::kOptimState), Tier::kHost);
  EXPECT_TRUE(p.fits());
  p = Place(m, MakeBudgets(std::nullopt, 11999, 8000));
  EXPECT_EQ(p.TierOf(Role::kMaster), Tier::kHost);
  EXPECT_EQ(p.TierOf(Role::kOptimState), Tier::kNvme);
  EXPECT_TRUE(p.fits());
  EXPECT_EQ(p.needs[1], 4000u);
  EXPECT_EQ(p.needs[2], 8000u);
}

TEST(PlaceTest, OptimizerStateNeverGoesToTheDevice) {
  const Placement p =
      Place(Bf16(1000), MakeBudgets(std::nullopt, 0, std::nullopt));
  EXPECT_EQ(p.TierOf(Role::kParams), Tier::kDevice);
  EXPECT_EQ(p.TierOf(Role::kMaster), Tier::kNvme);
  EXPECT_EQ(p.TierOf(Role::kOptimState), Tier::kNvme);
  EXPECT_EQ(p.needs[0], 4000u);
}

TEST(PlaceTest, ComputeFallsThroughToNvmeInOrder) {
  // The device holds nothing; the host holds the params only; the rest
  // lands on NVMe.
  const Placement p = Place(Bf16(1000), MakeBudgets(0, 2000, 1u << 20));
  EXPECT_EQ(p.TierOf(Role::kParams), Tier::kHost);
  EXPECT_EQ(p.TierOf(Role::kGrads), Tier::kNvme);
  EXPECT_EQ(p.TierOf(Role::kMaster), Tier::kNvme);
  EXPECT_EQ(p.TierOf(Role::kOptimState), Tier::kNvme);
  EXPECT_EQ(p.needs[2], 14000u);
}

TEST(PlaceTest, ARoleThatFitsNowhereIsChargedToNvme) {
  const Budgets b = MakeBudgets(0, 0, 15999);
  const Placement p = Place(Bf16(1000), b);
  EXPECT_FALSE(p.fits());
  EXPECT_TRUE(p.roles[0].fits);
  EXPECT_FALSE(p.roles[3].fits);
  EXPECT_EQ(p.TierOf(Role::kOptimState), Tier::kNvme);
  EXPECT_EQ(p.needs[2], 16000u);
  const std::vector<Shortfall> s = Shortfalls(p, b);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].tier, Tier::kNvme);
  EXPECT_EQ(s[0].needs, 16000u);
  EXPECT_EQ(s[0].budget, 15999u);
  EXPECT_TRUE(Shortfalls(Place(Bf16(1000), MakeBudgets(0, 0, 16000)),
                         MakeBudgets(0, 0, 16000))
                  .empty());
}

TEST(ShortfallTest, MessageNamesTierNeedsAndBudget) {
  // 812 GiB at 16 B/param, all of it on NVMe.
  const Budgets b = MakeBudgets(0, 0, 500 * kGiB);
  const Placement p = Place(Bf16(812 * kGiB / 16), b);
  EXPECT_EQ(DescribeShortfalls(Shortfalls(p, b)),
            "does not fit: needs 812.0 GiB on NVMe; NVMe budget is 500.0 GiB "
            "(312.0 GiB short)");
  EXPECT_EQ(DescribeShortfalls({}), "");
}

TEST(StepTrafficTest, DeviceResidentParamsCrossPcieOncePerDirection) {
  const Model m = Bf16(1000);
  const std::vector<Transfer> t = StepTraffic(m, Place(m, Budgets{}));
  EXPECT_EQ(LinkTotal(t, Link::kHostToDevice), 2000u);  // after optimizer
  EXPECT_EQ(LinkTotal(t, Link::kDeviceToHost), 2000u);  // gradients
  EXPECT_EQ(LinkTotal(t, Link::kNvmeToHost), 0u);
  EXPECT_EQ(LinkTotal(t, Link::kHostToNvme), 0u);
  // Optimizer: reads grads 2 + master 4 + m/v 8, writes 4 + 8 + params 2;
  // plus the 4000 B of PCIe transfers through host DRAM.
  EXPECT_EQ(LinkTotal(t, Link::kHostMemory), 28000u + 4000u);
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.back().link, Link::kHostToDevice);
  EXPECT_EQ(t.back().what, "after the optimizer");
}

TEST(StepTrafficTest, HostParamsCrossForForwardAndBackward) {
  const Model m = Bf16(1000);
  const Placement host = Place(m, MakeBudgets(0, std::nullopt, 0));
  ASSERT_EQ(host.TierOf(Role::kParams), Tier::kHost);
  const std::vector<Transfer> t = StepTraffic(m, host);
  EXPECT_EQ(LinkTotal(t, Link::kHostToDevice), 4000u);
  EXPECT_EQ(LinkTotal(t, Link::kDeviceToHost), 2000u);
  EXPECT_EQ(t[0].what, "forward");
  EXPECT_EQ(t[1].what, "backward");
}

TEST(StepTrafficTest, NvmeHomedRolesAreReadAndWrittenBack) {
  const Model m = Bf16(1000);
  const Placement p = Place(m, MakeBudgets(0, 0, std::nullopt));
  const std::vector<Transfer> t = StepTraffic(m, p);
  // Params twice (forward, backward), grads once, master, m/v.
  EXPECT_EQ(LinkTotal(t, Link::kNvmeToHost), 4000u + 2000u + 4000u + 8000u);
  // Grads, master, m/v, and the new params after the optimizer.
  EXPECT_EQ(LinkTotal(t, Link::kHostToNvme), 2000u + 4000u + 8000u + 2000u);
  EXPECT_EQ(LinkTotal(t, Link::kHostToDevice), 4000u);
  EXPECT_EQ(LinkTotal(t, Link::kDeviceToHost), 2000u);
  EXPECT_EQ(LinkTotal(t, Link::kHostMemory),
            28000u + 18000u + 16000u + 4000u + 2000u);
}

TEST(StepTrafficTest, ZeroByteRolesMoveNothing) {
  const Model m = Bf16(1000, 4);
  for (const Transfer& t : StepTraffic(m, Place(m, MakeBudgets(0, 0, {})))) {
    EXPECT_NE(t.role, Role::kOptimState);
    EXPECT_GT(t.bytes, 0u);
  }
  EXPECT_TRUE(StepTraffic(Bf16(0), Place(Bf16(0), Budgets{})).empty());
}

TEST(StepFloorTest, SlowestResourceBinds) {
  Bandwidths bw;
  bw.gbps = {10, 20, 1, 2, 100, 10};
  bw.adam_gparams = 1;
  const std::array<uint64_t, kNumLinks> bytes = {
      20'000'000'000, 20'000'000'000, 3'000'000'000, 2'000'000'000, 0};
  Floor f = StepFloor(Bf16(1'000'000'000), bytes, bw);
  EXPECT_DOUBLE_EQ(f.link_seconds[0], 2.0);
  EXPECT_DOUBLE_EQ(f.link_seconds[1], 1.0);
  EXPECT_DOUBLE_EQ(f.link_seconds[2], 3.0);
  EXPECT_DOUBLE_EQ(f.link_seconds[3], 1.0);
  EXPECT_DOUBLE_EQ(f.link_seconds[4], 0.0);
  // The drive's reads and writes take turns: 3 s + 1 s.
  EXPECT_DOUBLE_EQ(f.nvme_seconds, 4.0);
  EXPECT_TRUE(f.nvme_binds);
  EXPECT_EQ(f.transfer_binding, Link::kNvmeToHost);
  EXPECT_EQ(BindingName(f), "NVMe (reads + writes)");
  EXPECT_EQ(BindingKey(f), "nvme");
  EXPECT_DOUBLE_EQ(f.transfer_seconds, 4.0);
  EXPECT_DOUBLE_EQ(f.optimizer_seconds, 1.0);
  EXPECT_FALSE(f.optimizer_binds);
  EXPECT_DOUBLE_EQ(f.seconds, 4.0);
  bw.adam_gparams = 0.2;
  f = StepFloor(Bf16(1'000'000'000), bytes, bw);
  EXPECT_TRUE(f.optimizer_binds);
  EXPECT_EQ(BindingKey(f), "optimizer");
  EXPECT_DOUBLE_EQ(f.seconds, 5.0);
}

TEST(StepFloorTest, FullDuplexLinksDoNotAdd) {
  Bandwidths bw;
  bw.gbps = {10, 20, 1, 2, 100, 10};
  bw.adam_gparams = 1;
  // PCIe both ways: 2 s and 1 s overlap; reads alone leave the drive's
  // time equal to the read link's.
  const std::array<uint64_t, kNumLinks> bytes = {20'000'000'000, 20'000'000'000,
                                                 1'500'000'000, 0, 0};
  const Floor f = StepFloor(Bf16(1'000'000'000), bytes, bw);
  EXPECT_FALSE(f.nvme_binds);
  EXPECT_EQ(f.transfer_binding, Link::kHostToDevice);
  EXPECT_EQ(BindingName(f), "host->device");
  EXPECT_DOUBLE_EQ(f.nvme_seconds, 1.5);
  EXPECT_DOUBLE_EQ(f.seconds, 2.0);
}

TEST(LargestModelTest, UnboundedWhenHostOrNvmeIsUnlimited) {
  EXPECT_FALSE(LargestModel(Bf16(0), Budgets{}).has_value());
  EXPECT_FALSE(
      LargestModel(Bf16(0), MakeBudgets(0, std::nullopt, 0)).has_value());
  EXPECT_FALSE(
      LargestModel(Bf16(0), MakeBudgets(0, 0, std::nullopt)).has_value());
  EXPECT_EQ(LargestModel(Bf16(0), MakeBudgets(0, 0, 15)), 0u);
}

TEST(LargestModelTest, ResultFitsAndOneMoreDoesNot) {
  const std::vector<Budgets> cases = {
      MakeBudgets(80 * kGiB, 512 * kGiB, 4096 * kGiB),
      MakeBudgets(24 * kGiB, 64 * kGiB, 1024 * kGiB),
      MakeBudgets(std::nullopt, 64 * kGiB, 0), MakeBudgets(0, 0, 500 * kGiB),
      MakeBudgets(kMaxBudget, kMaxBudget, kMaxBudget)};
  for (const Model& shape :
       {Bf16(0), Bf16(0, 4), Bf16(0, 64), Model{0, DType::kFloat32, 16}}) {
    for (const Budgets& b : cases) {
      const std::optional<uint64_t> n = LargestModel(shape, b);
      ASSERT_TRUE(n.has_value());
      Model m = shape;
      m.params = *n;
      EXPECT_TRUE(Place(m, b).fits()) << *n;
      m.params = *n + 1;
      EXPECT_FALSE(Place(m, b).fits()) << *n;
    }
  }
  // All on NVMe at 16 B/param: exactly budget / 16.
  EXPECT_EQ(LargestModel(Bf16(0), MakeBudgets(0, 0, 1600)), 100u);
}

// A linear scan over every small budget combination finds the same largest
// model as the search, so the answer is the largest that fits, not merely a
// boundary.
TEST(LargestModelTest, MatchesExhaustiveScanOnSmallBudgets) {
  const std::vector<std::optional<uint64_t>> devices = {0,  3,  7,
                                                        20, 45, std::nullopt};
  for (const Model& shape : {Bf16(0), Bf16(0, 4), Bf16(0, 5), Bf16(0, 13),
                             Model{0, DType::kFloat32, 8}}) {
    for (const auto& device : devices) {
      for (uint64_t host = 0; host <= 120; host += 4) {
        for (uint64_t nvme = 0; nvme <= 150; nvme += 5) {
          const Budgets b = MakeBudgets(device, host, nvme);
          uint64_t best = 0;
          Model m = shape;
          for (m.params = 1; m.params * shape.k <= host + nvme; ++m.params) {
            if (Place(m, b).fits()) best = m.params;
          }
          ASSERT_EQ(LargestModel(shape, b), best)
              << "host " << host << " nvme " << nvme << " k " << shape.k;
        }
      }
    }
  }
}

TEST(ZeroTest, PaperFiguresFor7Point5BOn64Gpus) {
  const Model m = Bf16(7'500'000'000);
  EXPECT_EQ(ZeroBytesPerGpu(m, 0, 64), 120'000'000'000u);
  EXPECT_EQ(ZeroBytesPerGpu(m, 1, 64), 31'406'250'000u);
  EXPECT_EQ(ZeroBytesPerGpu(m, 2, 64), 16'640'625'000u);
  EXPECT_EQ(ZeroBytesPerGpu(m, 3, 64), 1'875'000'000u);
}

TEST(ZeroTest, StagesAgreeOnOneGpuAndDivideWithMore) {
  const Model m = Bf16(1'000'000);
  for (int stage = 0; stage < kNumZeroStages; ++stage) {
    EXPECT_EQ(ZeroBytesPerGpu(m, stage, 1), 16'000'000u) << stage;
  }
  EXPECT_EQ(ZeroBytesPerGpu(m, 1, 4), 4'000'000u + 3'000'000u);
  EXPECT_EQ(ZeroBytesPerGpu(m, 2, 4), 2'000'000u + 3'500'000u);
  EXPECT_EQ(ZeroBytesPerGpu(m, 3, 4), 4'000'000u);
  const Model fp32{1'000'000, DType::kFloat32, 12};
  EXPECT_EQ(ZeroBytesPerGpu(fp32, 0, 8), 20'000'000u);
  EXPECT_EQ(ZeroBytesPerGpu(fp32, 3, 8), 2'500'000u);
  // A partial byte rounds up: 16 B over 3 GPUs.
  EXPECT_EQ(ZeroBytesPerGpu(Bf16(1), 3, 3), 6u);
  EXPECT_EQ(ZeroBytesPerGpu(Bf16(kMaxParams, kMaxK), 0, kMaxGpus),
            kMaxParams * 68);
}

TEST(ZeroTest, FormulasNameTheDtypeBytes) {
  EXPECT_EQ(ZeroFormula(DType::kBFloat16, 0), "(2+2+K)Ψ");
  EXPECT_EQ(ZeroFormula(DType::kBFloat16, 1), "2Ψ+2Ψ+KΨ/N");
  EXPECT_EQ(ZeroFormula(DType::kBFloat16, 2), "2Ψ+(2+K)Ψ/N");
  EXPECT_EQ(ZeroFormula(DType::kBFloat16, 3), "(2+2+K)Ψ/N");
  EXPECT_EQ(ZeroFormula(DType::kFloat32, 2), "4Ψ+(4+K)Ψ/N");
}

// 7.5B bf16 parameters on 24 GiB of device, 64 GiB of host and 50 GiB of
// NVMe per rank, at the default rates.
Plan Plan7B(uint64_t gpus) {
  Bandwidths bw;
  bw.gbps = {25, 25, 6, 4, 50, 25};
  bw.adam_gparams = 1.8;
  return MakePlan(Bf16(7'500'000'000),
                  MakeBudgets(24 * kGiB, 64 * kGiB, 50 * kGiB), bw, gpus);
}

TEST(MakePlanTest, CombinesEveryEstimate) {
  const Plan plan = Plan7B(1);
  const Model& m = plan.model;
  const Budgets& b = plan.budgets;
  EXPECT_EQ(plan.rank_model.params, m.params);
  EXPECT_FALSE(plan.placement.fits());
  ASSERT_EQ(plan.shortfalls.size(), 1u);
  EXPECT_EQ(plan.shortfalls[0].needs, 60'000'000'000u);
  EXPECT_EQ(plan.link_bytes, LinkBytes(plan.traffic));
  EXPECT_EQ(plan.link_bytes[static_cast<int>(Link::kNetwork)], 0u);
  // 60 GB read at 6 GB/s, then written at 4 GB/s, by one drive.
  EXPECT_DOUBLE_EQ(plan.floor.seconds, 25.0);
  EXPECT_TRUE(plan.floor.nvme_binds);
  EXPECT_EQ(plan.floor.transfer_binding, Link::kHostToNvme);
  EXPECT_EQ(plan.largest_model, LargestModel(m, b));
  EXPECT_EQ(plan.zero_bytes[3], ZeroBytesPerGpu(m, 3, 1));
}

// 8 ranks: each places, moves and steps its 1/8 (budgets per rank), and the
// gathers and the reduce-scatter cross the network.
TEST(MakePlanTest, RanksPlanTheirShareAndAddTheCollectives) {
  const Plan plan = Plan7B(8);
  const Model& m = plan.model;
  EXPECT_EQ(plan.rank_model.params, 937'500'000u);
  EXPECT_TRUE(plan.shortfalls.empty());
  EXPECT_EQ(plan.placement.TierOf(Role::kOptimState), Tier::kHost);
  EXPECT_EQ(plan.placement.roles[static_cast<int>(Role::kMaster)].bytes,
            3'750'000'000u);
  // All-gather twice and reduce-scatter once, (N-1) * 2 B * Ψ/N each.
  const std::vector<Transfer> net = CollectiveTraffic(plan.rank_model, 8);
  ASSERT_EQ(net.size(), 3u);
  for (const Transfer& t : net) EXPECT_EQ(t.bytes, 13'125'000'000u);
  EXPECT_EQ(plan.link_bytes[static_cast<int>(Link::kNetwork)], 39'375'000'000u);
  // Collectives stay off host memory (NCCL: device to device).
  const auto alone = LinkBytes(StepTraffic(plan.rank_model, plan.placement));
  EXPECT_EQ(plan.link_bytes[static_cast<int>(Link::kHostMemory)],
            alone[static_cast<int>(Link::kHostMemory)]);
  EXPECT_EQ(plan.floor.transfer_binding, Link::kNetwork);
  EXPECT_DOUBLE_EQ(plan.floor.seconds, 39.375 / 25);
  EXPECT_DOUBLE_EQ(plan.floor.optimizer_seconds, 0.9375 / 1.8);
  EXPECT_EQ(plan.largest_model, *LargestModel(m, plan.budgets) * 8);
  EXPECT_TRUE(CollectiveTraffic(m, 1).empty());
  EXPECT_EQ(RankModel(Bf16(10), 3).params, 4u);
}

}  // namespace
}  // namespace strata::plan

namespace strata::plan {
namespace {

// 4 groups of 100M params each: params 200 MB, grads 200 MB, master
// 400 MB and m/v 800 MB per group.
Plan ExplainPlan(const Budgets& budgets) {
  Bandwidths rates;
  rates.gbps.fill(10);
  rates.adam_gparams = 1;
  return MakePlan(Bf16(400'000'000), budgets, rates, 1);
}

TEST(ExplainTest, TraceIsForwardThenBackwardWithTheOptimizerAfterEach) {
  const sched::PlanInput in = ExplainInput(
      ExplainPlan(MakeBudgets(std::nullopt, std::nullopt, std::nullopt)), 4);
  ASSERT_EQ(in.trace.size(), 12u);
  for (int g = 0; g < 4; ++g) {
    EXPECT_EQ(in.trace[g].group, g);
    EXPECT_EQ(in.trace[g].tier, strata::Tier::kDevice);
    EXPECT_EQ(in.trace[g].roles, RoleBit(strata::Role::kCompute));
  }
  for (int i = 0; i < 4; ++i) {
    const sched::TraceEntry& backward = in.trace[4 + 2 * i];
    const sched::TraceEntry& optimizer = in.trace[5 + 2 * i];
    EXPECT_EQ(backward.group, 3 - i);
    EXPECT_EQ(backward.tier, strata::Tier::kDevice);
    EXPECT_EQ(optimizer.group, 3 - i);
    EXPECT_EQ(optimizer.tier, strata::Tier::kHost);
    EXPECT_EQ(optimizer.roles, kAllRoles);
  }
}

TEST(ExplainTest, GroupBytesFollowThePlacementAndWindowsTheBudgets) {
  // Device 500 MB: params and grads (1.6 GB) go to the host with the
  // master (4.8 GB in all with 5 GB of host); m/v go to NVMe.
  const Plan plan =
      ExplainPlan(MakeBudgets(500'000'000, 5'000'000'000, std::nullopt));
  ASSERT_EQ(plan.placement.TierOf(Role::kParams), Tier::kHost);
  ASSERT_EQ(plan.placement.TierOf(Role::kOptimState), Tier::kNvme);
  const sched::PlanInput in = ExplainInput(plan, 4);
  ASSERT_EQ(in.groups.size(), 4u);
  for (const sched::PlanGroup& g : in.groups) {
    EXPECT_EQ(g.cached[0], 400'000'000u);  // params + grads, never state
    EXPECT_EQ(g.cached[1], 800'000'000u);  // m/v staged from NVMe
    EXPECT_EQ(g.nvme_homed, 800'000'000u);
  }
  EXPECT_EQ(in.window[0], 500'000'000u);
  // Host: 5 GB - 3.2 GB homed - one group's 0.8 GB of write-back room.
  EXPECT_EQ(in.window[1], 1'000'000'000u);

  // The planner over it: the device holds one group, so each backward
  // fetch is prefetched while the previous group's optimizer runs.
  const sched::Plan schedule = sched::MakePlan(in);
  int device_prefetches = 0;
  for (const sched::PlanStep& step : schedule.steps) {
    for (const sched::PlanAction& a : step.prefetch) {
      device_prefetches += a.tier == strata::Tier::kDevice;
    }
  }
  EXPECT_GE(device_prefetches, 3);
  EXPECT_GT(schedule.bytes[2][1], 0u);  // m/v read from NVMe every step
}

TEST(ExplainTest, UnlimitedTiersHoldEveryGroupAndRemaindersLandLast) {
  Bandwidths rates;
  rates.gbps.fill(10);
  rates.adam_gparams = 1;
  const Plan plan =
      MakePlan(Bf16(10), MakeBudgets(std::nullopt, 0, 1000), rates, 1);
  const sched::PlanInput in = ExplainInput(plan, 3);
  uint64_t device_total = 0;
  for (const sched::PlanGroup& g : in.groups) device_total += g.cached[0];
  EXPECT_EQ(in.window[0], device_total);
  // Host budget 0: the master (40 B) and m/v (80 B) go to NVMe. Split
  // over 3 groups, the last takes the remainders: 13 + 26, 13 + 26,
  // 14 + 28.
  EXPECT_EQ(in.groups[0].nvme_homed, 39u);
  EXPECT_EQ(in.groups[1].nvme_homed, 39u);
  EXPECT_EQ(in.groups[2].nvme_homed, 42u);
}

}  // namespace
}  // namespace strata::plan
