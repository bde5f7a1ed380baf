#include "tools/plan/report.h"

#include <fmt/format.h>

#include <cmath>
#include <optional>

#include "common/text.h"
#include "tools/plan/explain.h"

namespace strata::plan {
namespace {

std::string ParamText(uint64_t n) {
  static constexpr const char* kUnits[] = {"", "K", "M", "B", "T"};
  double value = static_cast<double>(n);
  int unit = 0;
  while (value >= 1000 && unit < 4) {
    value /= 1000;
    ++unit;
  }
  return unit == 0 ? std::to_string(n)
                   : fmt::format("{:.2f}{}", value, kUnits[unit]);
}

std::string BudgetText(const std::optional<uint64_t>& budget) {
  return budget ? HumanBytes(*budget) : "unlimited";
}

double Gb(uint64_t bytes) { return bytes / 1e9; }

// ZeRO figures are reported to one decimal of a GB; the table and the JSON
// share this rounding so they always agree.
double ZeroGb(uint64_t bytes) { return std::round(bytes / 1e8) / 10; }

// With N ranks every figure up to the ZeRO table is one rank's.
std::string RanksLine(const Plan& plan) {
  if (plan.gpus == 1) return "";
  return fmt::format(
      "  {} ranks, ZeRO-3: each holds and steps {} parameters (Ψ/N) in its "
      "own tiers, budgets per rank; placement, traffic and floor below are "
      "one rank's\n",
      plan.gpus, ParamText(plan.rank_model.params));
}

std::string TextModel(const Plan& plan, const PlanOptions& o) {
  const Model& m = plan.model;
  std::string out = fmt::format(
      "strata-plan: {} parameters ({}), {} compute, K = {} optimizer "
      "bytes/param\n  sizes in GiB = 2^30 B; traffic in GB = 1e9 B, rates "
      "in GB/s\n{}\nplacement (offload mode: the optimizer runs on the "
      "CPU){}\n  {:<24}{:>8}  {:<8}{:>12}\n",
      ParamText(m.params), o.model_source, DTypeName(m.dtype), m.k,
      RanksLine(plan), plan.gpus > 1 ? ", per rank" : "", "role", "B/param",
      "tier", "bytes");
  for (const RolePlacement& r : plan.placement.roles) {
    out += fmt::format("  {:<24}{:>8}  {:<8}{:>12}{}\n",
                       RoleLabel(r.role, m.dtype), BytesPerParam(m, r.role),
                       TierName(r.tier), HumanBytes(r.bytes),
                       r.fits ? "" : "  (no tier has room)");
  }
  out +=
      fmt::format("\ntiers\n  {:<8}{:>12}{:>14}\n", "tier", "needs", "budget");
  for (Tier tier : kTiers) {
    const int i = static_cast<int>(tier);
    out += fmt::format("  {:<8}{:>12}{:>14}\n", TierName(tier),
                       HumanBytes(plan.placement.needs[i]),
                       BudgetText(plan.budgets[i]));
  }
  return out + "verdict: " + Verdict(plan) + "\n";
}

std::string TextTraffic(const Plan& plan) {
  std::string out = "\nper-step traffic\n";
  for (Link link : kLinks) {
    out += fmt::format("  {:<50}{:>10.2f} GB\n", LinkName(link),
                       Gb(plan.link_bytes[static_cast<int>(link)]));
    if (link == Link::kHostMemory) {
      const uint64_t moved = plan.link_bytes[static_cast<int>(link)];
      uint64_t own = 0;
      for (const Transfer& t : plan.traffic) {
        if (t.link == link) own += t.bytes;
      }
      out += fmt::format("    {:<48}{:>10.2f}\n", "every transfer above",
                         Gb(moved - own));
    }
    for (const Transfer& t : plan.traffic) {
      if (t.link != link) continue;
      out += fmt::format(
          "    {:<48}{:>10.2f}\n",
          RoleLabel(t.role, plan.model.dtype) + ", " + std::string(t.what),
          Gb(t.bytes));
    }
  }
  return out;
}

std::string FloorLine(const Floor& f) {
  if (f.optimizer_binds) {
    return fmt::format(
        "floor: {:.3f} s/step, bound by the CPU optimizer (slowest transfer: "
        "{}, {:.3f} s)\n",
        f.seconds, TransferBindingName(f), f.transfer_seconds);
  }
  return fmt::format(
      "floor: {:.3f} s/step, bound by {} (CPU optimizer: {:.3f} s)\n",
      f.seconds, TransferBindingName(f), f.optimizer_seconds);
}

std::string TextFloor(const Plan& plan, const PlanOptions& o) {
  const Floor& f = plan.floor;
  std::string out = fmt::format(
      "\nstep-time floor (every resource and the CPU optimizer at full "
      "speed, overlapped; the NVMe drive's reads and writes take turns)\n  "
      "{:<16}{:>16}{:>18}  {:<9}{:>10}\n",
      "resource", "per step", "rate", "source", "seconds");
  for (Link link : kLinks) {
    const int i = static_cast<int>(link);
    out += fmt::format("  {:<16}{:>13.2f} GB{:>13.2f} GB/s  {:<9}{:>10.3f}\n",
                       LinkName(link), Gb(plan.link_bytes[i]), o.links[i].value,
                       SourceName(o.links[i].source), f.link_seconds[i]);
  }
  out += fmt::format("  {:<16}{:>16}{:>18}  {:<9}{:>10.3f}\n", "NVMe drive",
                     "read + write", "takes turns", "", f.nvme_seconds);
  out +=
      fmt::format("  {:<16}{:>9} params{:>9.2f} Gparam/s  {:<9}{:>10.3f}\n",
                  "CPU optimizer", ParamText(plan.rank_model.params),
                  o.adam.value, SourceName(o.adam.source), f.optimizer_seconds);
  out += FloorLine(f);
  for (Link link : kLinks) {
    const Rate& r = o.links[static_cast<int>(link)];
    if (!r.note.empty()) {
      out += fmt::format("  {}: {}\n", LinkName(link), r.note);
    }
  }
  if (!o.adam.note.empty()) out += "  CPU optimizer: " + o.adam.note + "\n";
  return out;
}

std::string TextCapacity(const Plan& plan) {
  std::string out =
      fmt::format("\nlargest model these budgets hold with this placement{}: ",
                  plan.gpus > 1 ? fmt::format(" on {} ranks", plan.gpus) : "");
  if (!plan.largest_model) {
    out += "any (host or NVMe is unlimited; give both budgets to bound it)\n";
  } else if (*plan.largest_model == 0) {
    out += "none (not even one parameter fits)\n";
  } else {
    out += fmt::format("{} parameters ({})\n", ParamText(*plan.largest_model),
                       *plan.largest_model);
  }
  out += fmt::format(
      "\nZeRO model-state memory per GPU (N = {} data-parallel GPU{}, {} "
      "params and gradients, K = {}; GB = 1e9 B)\n",
      plan.gpus, plan.gpus == 1 ? "" : "s", DTypeName(plan.model.dtype),
      plan.model.k);
  for (int stage = 0; stage < kNumZeroStages; ++stage) {
    out += fmt::format("  stage {}  {:<16}{:>10.1f} GB\n", stage,
                       ZeroFormula(plan.model.dtype, stage),
                       ZeroGb(plan.zero_bytes[stage]));
  }
  return out;
}

nlohmann::ordered_json JsonOptional(const std::optional<uint64_t>& value) {
  return value ? nlohmann::ordered_json(*value)
               : nlohmann::ordered_json(nullptr);
}

nlohmann::ordered_json JsonRate(const Rate& rate, const char* unit) {
  return {{unit, rate.value},
          {"source", SourceName(rate.source)},
          {"note", rate.note}};
}

nlohmann::ordered_json JsonPlacement(const Plan& plan) {
  nlohmann::ordered_json roles = nlohmann::ordered_json::array();
  for (const RolePlacement& r : plan.placement.roles) {
    roles.push_back({{"role", RoleKey(r.role)},
                     {"label", RoleLabel(r.role, plan.model.dtype)},
                     {"bytes_per_param", BytesPerParam(plan.model, r.role)},
                     {"bytes", r.bytes},
                     {"tier", TierKey(r.tier)},
                     {"fits", r.fits}});
  }
  nlohmann::ordered_json tiers = nlohmann::ordered_json::object();
  for (Tier tier : kTiers) {
    const int i = static_cast<int>(tier);
    tiers[std::string(TierKey(tier))] = {
        {"needs", plan.placement.needs[i]},
        {"budget", JsonOptional(plan.budgets[i])}};
  }
  nlohmann::ordered_json shortfalls = nlohmann::ordered_json::array();
  for (const Shortfall& s : plan.shortfalls) {
    shortfalls.push_back({{"tier", TierKey(s.tier)},
                          {"needs", s.needs},
                          {"budget", s.budget},
                          {"missing", s.needs - s.budget}});
  }
  return {{"roles", roles},
          {"tiers", tiers},
          {"fits", plan.shortfalls.empty()},
          {"verdict", Verdict(plan)},
          {"shortfalls", shortfalls}};
}

nlohmann::ordered_json JsonTraffic(const Plan& plan, const PlanOptions& o) {
  nlohmann::ordered_json links = nlohmann::ordered_json::object();
  for (Link link : kLinks) {
    const int i = static_cast<int>(link);
    nlohmann::ordered_json transfers = nlohmann::ordered_json::array();
    for (const Transfer& t : plan.traffic) {
      if (t.link != link) continue;
      transfers.push_back(
          {{"role", RoleKey(t.role)}, {"what", t.what}, {"bytes", t.bytes}});
    }
    links[std::string(LinkKey(link))] = {
        {"name", LinkName(link)},
        {"bytes", plan.link_bytes[i]},
        {"rate", JsonRate(o.links[i], "gbps")},
        {"seconds", plan.floor.link_seconds[i]},
        {"transfers", transfers}};
  }
  const Floor& f = plan.floor;
  return {{"links", links},
          {"optimizer",
           {{"params", plan.rank_model.params},
            {"rate", JsonRate(o.adam, "gparams")},
            {"seconds", f.optimizer_seconds}}},
          {"floor",
           {{"seconds", f.seconds},
            {"nvme_seconds", f.nvme_seconds},
            {"binding", BindingKey(f)},
            {"transfer_seconds", f.transfer_seconds},
            {"transfer_binding", TransferBindingKey(f)}}}};
}

}  // namespace

std::string Verdict(const Plan& plan) {
  if (plan.shortfalls.empty()) return "fits";
  std::string out = DescribeShortfalls(plan.shortfalls);
  for (const Shortfall& s : plan.shortfalls) {
    out += fmt::format("; raise {} to at least {}",
                       kBudgetFlags[static_cast<int>(s.tier)],
                       HumanBytes(s.needs));
  }
  if (plan.largest_model) {
    out += fmt::format(", or plan at most {} parameters ({})",
                       ParamText(*plan.largest_model), *plan.largest_model);
  }
  return out;
}

std::string TextReport(const Plan& plan, const PlanOptions& options) {
  return TextModel(plan, options) + TextTraffic(plan) +
         TextFloor(plan, options) + TextCapacity(plan);
}

nlohmann::ordered_json JsonReport(const Plan& plan,
                                  const PlanOptions& options) {
  const Model& m = plan.model;
  nlohmann::ordered_json budgets = nlohmann::ordered_json::object();
  for (Tier tier : kTiers) {
    budgets[std::string(TierKey(tier))] =
        JsonOptional(plan.budgets[static_cast<int>(tier)]);
  }
  nlohmann::ordered_json zero = nlohmann::ordered_json::array();
  for (int stage = 0; stage < kNumZeroStages; ++stage) {
    zero.push_back({{"stage", stage},
                    {"formula", ZeroFormula(m.dtype, stage)},
                    {"bytes", plan.zero_bytes[stage]},
                    {"gb", ZeroGb(plan.zero_bytes[stage])}});
  }
  nlohmann::ordered_json traffic = JsonTraffic(plan, options);
  return {{"model",
           {{"params", m.params},
            {"source", options.model_source},
            {"dtype", DTypeName(m.dtype)},
            {"dtype_bytes", DTypeSize(m.dtype)},
            {"k", m.k}}},
          {"budgets", budgets},
          {"ranks",
           {{"gpus", plan.gpus}, {"params_per_rank", plan.rank_model.params}}},
          {"placement", JsonPlacement(plan)},
          {"traffic", traffic["links"]},
          {"optimizer", traffic["optimizer"]},
          {"floor", traffic["floor"]},
          {"largest_model",
           {{"params", JsonOptional(plan.largest_model)},
            {"bounded", plan.largest_model.has_value()}}},
          {"zero", {{"gpus", plan.gpus}, {"k", m.k}, {"stages", zero}}}};
}

std::string Report(const Plan& plan, const PlanOptions& options) {
  if (options.json) {
    nlohmann::ordered_json report = JsonReport(plan, options);
    if (options.explain) {
      report["explain"] = {{"groups", options.groups},
                           {"schedule", Explain(plan, options.groups)}};
    }
    return report.dump(2);
  }
  std::string out = TextReport(plan, options);
  if (options.explain) {
    out += fmt::format("\nschedule ({} groups; --explain)\n{}", options.groups,
                       Explain(plan, options.groups));
  }
  return out;
}

}  // namespace strata::plan
