#include "tools/plan/cli.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "common/cli.h"
#include "common/text.h"
#include "strata/aio.h"
#include "tools/plan/explain.h"
#include "tools/plan/probe.h"
#include "tools/plan/report.h"

namespace strata::plan {
namespace {

constexpr char kDescription[] =
    R"(strata-plan: where a model's training state lives, and how fast a step can be.

Offload mode, mixed-precision Adam family: each role is homed whole on the
fastest tier with room, in this order: compute params and gradients on the
device, else host, else NVMe; the fp32 master and Adam's m and v on host,
else NVMe, never the device. Prints the bytes each tier needs, the bytes each
link moves per step, the step-time floor they imply (every link and the CPU
optimizer at full speed, overlapped), the largest model the budgets hold, and
ZeRO's per-GPU model-state memory for stages 0-3.

A budget not given leaves its tier unlimited. Rates are assumed (the defaults
below), given, or measured with --measure (about 2 s: host memcpy, an NVMe
write and read in --swap-dir, PCIe copies when a GPU is present); given rates
win over measured ones.

Sizes are binary (GiB = 2^30 B), traffic and rates decimal (GB = 1e9 B).
Exit status: 0 fits, 1 bad input or a failed probe, 2 does not fit.

Examples:
  strata-plan --params 7.5B --gpus 64
  strata-plan --layers 80 --hidden 8192 --vocab 32000 --device-budget 80GiB \
      --host-budget 512GiB --nvme-budget 4TiB
  strata-plan --params 13B --device-budget 24GiB --host-budget 64GiB \
      --nvme-budget 1TiB --measure --swap-dir /mnt/nvme --json
)";

// Option text as typed, resolved after parsing so every error names its flag.
struct RawOptions {
  std::string params;
  uint64_t layers = 0;
  uint64_t hidden = 0;
  uint64_t vocab = 0;
  std::string dtype = "bf16";
  std::array<std::string, kNumTiers> budgets;
  double pcie = kDefaultPcieGbps;
  double nvme_read = kDefaultNvmeReadGbps;
  double nvme_write = kDefaultNvmeWriteGbps;
  double host_mem = kDefaultHostMemGbps;
  double net = kDefaultNetGbps;
  double adam = kDefaultAdamGparams;
};

void AddModelOptions(CLI::App& app, RawOptions* raw, PlanOptions* o) {
  app.add_option("--params", raw->params,
                 "Total parameters: 7.5B, 13e9, 175M, 7500000000");
  app.add_option("--layers", raw->layers,
                 "Transformer layers L (with --hidden): 12*L*H^2 params");
  app.add_option("--hidden", raw->hidden, "Hidden size H (with --layers)");
  app.add_option("--vocab", raw->vocab,
                 "Vocabulary V (with --layers): adds V*H embedding params");
  app.add_option("--dtype", raw->dtype, "Compute dtype: bf16, fp16 or fp32")
      ->capture_default_str();
  app.add_option("--k", o->model.k,
                 "Optimizer bytes per param, fp32 master included "
                 "(Adam: 4 master + 4 m + 4 v)")
      ->capture_default_str()
      ->check(CLI::Range(kMinK, kMaxK));
  app.add_option("--gpus", o->gpus,
                 "Data-parallel ranks N: placement, traffic and floor are "
                 "each rank's (its 1/N of the model; budgets per rank), "
                 "and the ZeRO table's N")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, kMaxGpus));
}

void AddBudgetOptions(CLI::App& app, RawOptions* raw) {
  for (Tier tier : kTiers) {
    app.add_option(kBudgetFlags[static_cast<int>(tier)],
                   raw->budgets[static_cast<int>(tier)],
                   fmt::format("Bytes strata may use on {}, e.g. 80GiB "
                               "(default: unlimited)",
                               TierName(tier)));
  }
}

void AddRateOptions(CLI::App& app, RawOptions* raw, PlanOptions* o) {
  auto rate = [&](const char* flag, double* value, const char* help) {
    app.add_option(flag, *value, help)->capture_default_str();
  };
  rate("--pcie-gbps", &raw->pcie,
       "host<->device GB/s, each direction (default: PCIe 4.0 x16)");
  rate("--nvme-read-gbps", &raw->nvme_read,
       "NVMe read GB/s (default: one PCIe 4.0 x4 drive)");
  rate("--nvme-write-gbps", &raw->nvme_write,
       "NVMe write GB/s, sustained (default: one PCIe 4.0 x4 drive)");
  rate("--host-mem-gbps", &raw->host_mem,
       "Host DRAM GB/s, bytes read + written (default: a few DDR4 channels)");
  rate("--net-gbps", &raw->net,
       "Collectives GB/s per rank, each direction (default: a 200 Gb/s "
       "NIC; NVLink is about 10x)");
  rate("--adam-gparams", &raw->adam,
       "CPU optimizer rate, 1e9 params/s (default: DeepSpeed's CPU Adam on 2 "
       "vCPUs)");
  app.add_flag("--measure", o->measure,
               "Measure host memcpy, NVMe (in --swap-dir) and, with a GPU, "
               "PCIe bandwidth instead of assuming them (about 2 s)");
  app.add_option("--swap-dir", o->swap_dir,
                 "Existing directory on the NVMe for --measure (default: a "
                 "temporary directory under the current one)");
}

Status ResolveModel(const CLI::App& app, const RawOptions& raw,
                    PlanOptions* o) {
  const bool by_params = app.count("--params") > 0;
  const bool by_shape = app.count("--layers") + app.count("--hidden") > 0;
  if (by_params && (by_shape || app.count("--vocab") > 0)) {
    return Status::InvalidArgument(
        "give the model either as --params or as --layers/--hidden/--vocab, "
        "not both");
  }
  if (!by_params && !by_shape) {
    return Status::InvalidArgument(
        "no model: give --params (e.g. --params 7.5B) or --layers and "
        "--hidden (e.g. --layers 32 --hidden 4096)");
  }
  if (by_params) {
    Result<uint64_t> n = ParseParamCount(raw.params);
    if (!n.ok()) {
      return Status::InvalidArgument("--params: " + n.status().message());
    }
    o->model.params = *n;
    o->model_source = "--params " + raw.params;
  } else {
    STRATA_ASSIGN_OR_RETURN(
        o->model.params, TransformerParams(raw.layers, raw.hidden, raw.vocab));
    o->model_source = fmt::format("12*L*H^2 + V*H, L={} H={} V={}", raw.layers,
                                  raw.hidden, raw.vocab);
  }
  Result<DType> dtype = ParseDType(raw.dtype);
  if (!dtype.ok()) {
    return Status::InvalidArgument("--dtype: " + dtype.status().message());
  }
  o->model.dtype = *dtype;
  return Status::Ok();
}

Status ResolveBudgets(const CLI::App& app, const RawOptions& raw,
                      PlanOptions* o) {
  for (Tier tier : kTiers) {
    const int i = static_cast<int>(tier);
    if (app.count(kBudgetFlags[i]) == 0) continue;
    Result<uint64_t> bytes = ParseSize(raw.budgets[i]);
    if (!bytes.ok()) {
      return Status::InvalidArgument(std::string(kBudgetFlags[i]) + ": " +
                                     bytes.status().message() +
                                     "; units 512MiB, 80GiB, 4TiB");
    }
    if (*bytes > kMaxBudget) {
      return Status::InvalidArgument(std::string(kBudgetFlags[i]) + ": '" +
                                     raw.budgets[i] + "' is more than " +
                                     HumanBytes(kMaxBudget));
    }
    o->budgets[i] = *bytes;
  }
  return Status::Ok();
}

Status ResolveRates(const CLI::App& app, const RawOptions& raw,
                    PlanOptions* o) {
  Status st;
  auto set = [&](Rate* rate, const char* flag, double value) {
    const bool given = app.count(flag) > 0;
    if (!(value > 0 && std::isfinite(value)) && st.ok()) {
      st = Status::InvalidArgument(
          fmt::format("{}: {} is not a rate; give a number > 0", flag, value));
    }
    *rate = {value, given ? Source::kGiven : Source::kAssumed,
             given ? "from " + std::string(flag) : ""};
  };
  auto link = [&](Link l) { return &o->links[static_cast<int>(l)]; };
  set(link(Link::kHostToDevice), "--pcie-gbps", raw.pcie);
  set(link(Link::kDeviceToHost), "--pcie-gbps", raw.pcie);
  set(link(Link::kNvmeToHost), "--nvme-read-gbps", raw.nvme_read);
  set(link(Link::kHostToNvme), "--nvme-write-gbps", raw.nvme_write);
  set(link(Link::kHostMemory), "--host-mem-gbps", raw.host_mem);
  set(link(Link::kNetwork), "--net-gbps", raw.net);
  set(&o->adam, "--adam-gparams", raw.adam);
  return st;
}

Status ResolveGroups(const CLI::App& app, const RawOptions& raw,
                     PlanOptions* o) {
  if (!o->explain) {
    if (app.count("--groups") > 0) {
      return Status::InvalidArgument("--groups needs --explain");
    }
    return Status::Ok();
  }
  if (app.count("--groups") == 0) {
    if (raw.layers == 0) {
      return Status::InvalidArgument(
          "--explain needs the group count: give --groups N (usually the "
          "layer count) or describe the model with --layers");
    }
    o->groups = raw.layers;
  }
  if (o->groups < 1 || o->groups > kMaxExplainGroups) {
    return Status::InvalidArgument(fmt::format(
        "--groups must be in 1..{}, not {}", kMaxExplainGroups, o->groups));
  }
  return Status::Ok();
}

// A measured figure replaces an assumed one; a given one stays, and the
// measurement is kept beside it in the note.
void Apply(const ProbeResult& probe, Rate* rate) {
  if (probe.gbps <= 0) {
    if (rate->source == Source::kAssumed) rate->note = probe.note;
    return;
  }
  if (rate->source == Source::kGiven) {
    rate->note +=
        fmt::format("; measured {:.2f} GB/s ({})", probe.gbps, probe.note);
    return;
  }
  *rate = {probe.gbps, Source::kMeasured, probe.note};
}

// A fresh directory under the cwd for the NVMe probe, when one is wanted;
// removed with its contents on every way out.
class TempDir {
 public:
  explicit TempDir(bool wanted) {
    if (!wanted) return;
    std::string name = "strata-plan-probe.XXXXXX";
    if (mkdtemp(name.data()) == nullptr) {
      error_ = errno;
    } else {
      path_ = name;
    }
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  int error() const { return error_; }  // errno of mkdtemp, or 0

 private:
  std::string path_;
  int error_ = 0;
};

}  // namespace

std::string_view SourceName(Source source) {
  switch (source) {
    case Source::kAssumed:
      return "assumed";
    case Source::kGiven:
      return "given";
    case Source::kMeasured:
      return "measured";
  }
  return "?";
}

Result<PlanOptions> ParseCommandLine(int argc, char** argv, bool* exit_now) {
  PlanOptions o;
  RawOptions raw;
  CLI::App app(kDescription, "strata-plan");
  app.get_formatter()->column_width(30);
  AddModelOptions(app, &raw, &o);
  AddBudgetOptions(app, &raw);
  AddRateOptions(app, &raw, &o);
  app.add_flag("--json", o.json, "Print one JSON document instead of tables");
  app.add_flag("--explain", o.explain,
               "Also print the engine's per-step prefetch and eviction "
               "schedule, with its byte windows");
  app.add_option("--groups", o.groups,
                 "Groups (prefetch units) for --explain; default: --layers");
  STRATA_RETURN_IF_ERROR(ParseArgs(app, argc, argv, exit_now));
  if (*exit_now) return o;
  STRATA_RETURN_IF_ERROR(ResolveModel(app, raw, &o));
  STRATA_RETURN_IF_ERROR(ResolveBudgets(app, raw, &o));
  STRATA_RETURN_IF_ERROR(ResolveRates(app, raw, &o));
  STRATA_RETURN_IF_ERROR(ResolveGroups(app, raw, &o));
  return o;
}

Status Measure(PlanOptions* options) {
  Apply(ProbeHostMemory(),
        &options->links[static_cast<int>(Link::kHostMemory)]);
  const TempDir temp(options->swap_dir.empty());
  if (temp.error() != 0) {
    return aio::ErrnoStatus(temp.error(),
                            "--measure: cannot create a probe directory under "
                            "the current one; pass --swap-dir");
  }
  const std::string dir =
      options->swap_dir.empty() ? temp.path() : options->swap_dir;
  Result<NvmeProbe> nvme = ProbeNvme(dir);
  if (!nvme.ok()) {
    return Status(nvme.status().code(), "--measure: NVMe probe in '" + dir +
                                            "': " + nvme.status().message());
  }
  Apply(nvme->read, &options->links[static_cast<int>(Link::kNvmeToHost)]);
  Apply(nvme->write, &options->links[static_cast<int>(Link::kHostToNvme)]);
  const PcieProbe pcie = ProbePcie();
  Apply(pcie.h2d, &options->links[static_cast<int>(Link::kHostToDevice)]);
  Apply(pcie.d2h, &options->links[static_cast<int>(Link::kDeviceToHost)]);
  if (options->adam.source == Source::kAssumed) {
    options->adam.note =
        "not probed: measure it with cpu_adam_bench (bench/) and give "
        "--adam-gparams";
  }
  return Status::Ok();
}

Bandwidths RatesOf(const PlanOptions& options) {
  Bandwidths b;
  for (Link link : kLinks) {
    b.gbps[static_cast<int>(link)] =
        options.links[static_cast<int>(link)].value;
  }
  b.adam_gparams = options.adam.value;
  return b;
}

Result<int> Run(PlanOptions options) {
  if (options.measure) {
    STRATA_RETURN_IF_ERROR(Measure(&options));
  }
  const Plan plan =
      MakePlan(options.model, options.budgets, RatesOf(options), options.gpus);
  std::printf("%s\n", Report(plan, options).c_str());
  if (plan.shortfalls.empty()) return 0;
  std::fprintf(stderr, "strata-plan: %s\n", Verdict(plan).c_str());
  return 2;
}

}  // namespace strata::plan
