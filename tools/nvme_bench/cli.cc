#include "tools/nvme_bench/cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <string_view>

#include "common/cli.h"
#include "common/text.h"

namespace strata::bench {
namespace {

constexpr char kDescription[] =
    R"(strata-nvme-bench: NVMe throughput and latency through strata's io_uring engine.

Runs every combination of --rw x --bs x --qd x --threads on one file, after
creating, preallocating and prefilling it with incompressible data. Reads and
writes use O_DIRECT, so the page cache never inflates a result; where the file
system refuses O_DIRECT the run says "buffered", drops the file's cache before
each read job and counts the final fdatasync of each write job.

A job with T threads uses T rings; each owns 1/T of the file and keeps qd
requests of bs bytes in flight (fio: numjobs=T, offset_increment=size/T).
GB/s is 10^9 bytes/s, GiB/s is 2^30 bytes/s; latency is submit to completion;
CPU % is the whole process, as a percentage of one core.

--path may name a raw block device (or a link to one, /dev/disk/by-id/...):
it is read as it is, and written (a write job, --verify) only with
--destroy-data-on naming the same device, while nothing mounts or holds it.

Examples:
  strata-nvme-bench --path /mnt/nvme --rw read,write --bs 1M --qd 32 --size 2G --vs-fio
  strata-nvme-bench --path /mnt/nvme --rw randread --bs 4K,128K --qd 1,32,128 --recommend
  strata-nvme-bench --path /mnt/nvme --verify --verify-ops 10000
  strata-nvme-bench --path /dev/nvme1n1 --rw randread --bs 4K --qd 128 --size 8G)";

Result<std::vector<int>> ParseInts(const std::string& flag,
                                   const std::string& text, int lo, int hi) {
  std::vector<int> out;
  for (const std::string& item : SplitList(text, ',')) {
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < lo || v > hi) {
      return Status::InvalidArgument(
          flag + ": '" + item + "' is not an integer in " + std::to_string(lo) +
          ".." + std::to_string(hi));
    }
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) return Status::InvalidArgument(flag + ": empty list");
  return out;
}

Result<std::vector<Rw>> ParseRws(const std::string& text) {
  std::vector<Rw> out;
  for (const std::string& item : SplitList(text, ',')) {
    STRATA_ASSIGN_OR_RETURN(Rw rw, ParseRw(item));
    out.push_back(rw);
  }
  if (out.empty()) return Status::InvalidArgument("--rw: empty list");
  return out;
}

Result<std::vector<size_t>> ParseBlockSizes(const std::string& text) {
  std::vector<size_t> out;
  for (const std::string& item : SplitList(text, ',')) {
    STRATA_ASSIGN_OR_RETURN(uint64_t bs, ForFlag("--bs", ParseSize(item)));
    if (bs < 4096 || bs % 4096 != 0 || bs > (1ull << 30)) {
      return Status::InvalidArgument(
          "--bs: '" + item + "' must be a multiple of 4K between 4K and 1G");
    }
    out.push_back(bs);
  }
  if (out.empty()) return Status::InvalidArgument("--bs: empty list");
  return out;
}

// --size must hold one block per thread of every configuration, in whole
// 4 KiB units (the largest direct-I/O alignment we meet).
Result<BenchOptions> CheckSize(BenchOptions o) {
  if (o.size == 0 || o.size % 4096 != 0) {
    return Status::InvalidArgument("--size must be a positive multiple of 4K");
  }
  if (o.verify) {
    if (o.verify_max < 4096 || o.verify_max % 4096 != 0 ||
        o.verify_max > o.size) {
      return Status::InvalidArgument(
          "--verify-max must be a multiple of 4K, at most --size");
    }
    return o;
  }
  const uint64_t bs = *std::max_element(o.bs.begin(), o.bs.end());
  const uint64_t th = *std::max_element(o.threads.begin(), o.threads.end());
  const uint64_t files = o.paths.size();
  if (o.size < bs * th * files) {
    return Status::InvalidArgument(
        "--size " + std::to_string(o.size) +
        " is too small: each thread needs at least one --bs block" +
        (files > 1 ? " in each of the " + std::to_string(files) + " files" +
                         " (largest bs x threads x files = "
                   : " (largest bs x threads = ") +
        std::to_string(bs * th * files) + ")");
  }
  return o;
}

Status CheckMixAndRamp(const BenchOptions& o) {
  if (o.rwmixread < 0 || o.rwmixread > 100) {
    return Status::InvalidArgument(
        "--rwmixread: " + std::to_string(o.rwmixread) +
        " is not a percentage; give the share of reads in 0..100");
  }
  return CheckRamp(o.ramp, o.seconds);
}

// The options given as text, checked after parsing.
struct Texts {
  std::string rw = "read,write", bs = "1M", qd = "32", threads = "1";
  std::string size = "1G", verify_max = "4M", fio_buffers;
};

// What a job is: the file, the patterns, sizes and depths, the engine.
void AddJobOptions(CLI::App& app, BenchOptions& o, Texts& text) {
  app.add_option("--path", o.paths,
                 "Directory (a strata-nvme-bench.dat file is created in it and "
                 "removed afterwards), existing file, or raw block device "
                 "(read freely; written only with --destroy-data-on) to "
                 "test; a path that does not exist is an error unless "
                 "--create. Several paths (repeat --path, or separate them "
                 "with ':' as fio's --filename): the job stripes over them, "
                 "one --bs block each; '\\:' is a ':' inside a name")
      ->required();
  app.add_flag("--create", o.create,
               "Let --path name a new file in an existing directory: created "
               "for the run and removed afterwards unless --keep");
  app.add_option("--rw", text.rw,
                 "Access patterns: read,write,randread,randwrite and the "
                 "mixed rw (sequential) and randrw")
      ->capture_default_str();
  app.add_option("--rwmixread", o.rwmixread,
                 "Mixed jobs (rw, randrw): each request is a read with this "
                 "probability, in percent")
      ->capture_default_str();
  app.add_option("--bs", text.bs,
                 "Request sizes, multiples of 4K, e.g. 128K,1M,8M")
      ->capture_default_str();
  app.add_option("--qd", text.qd,
                 "Queue depths (requests in flight per thread)")
      ->capture_default_str();
  app.add_option("--threads", text.threads,
                 "Thread counts; each thread is one ring with its own slice "
                 "of the file")
      ->capture_default_str();
  app.add_option("--size", text.size,
                 "File size; each job moves this many bytes once unless "
                 "--time is given")
      ->capture_default_str();
  app.add_option("--time", o.seconds,
                 "Seconds per job, looping over the file (0: one pass)");
  app.add_option("--ramp", o.ramp,
                 "With --time: seconds each job runs first, not counted in "
                 "its bytes, IOPS, latency or CPU (fio's ramp_time)");
  app.add_option("--backend", o.backend,
                 "aio backend: auto, io_uring or threads "
                 "(STRATA_AIO_BACKEND overrides)")
      ->capture_default_str();
  app.add_option("--submit-batch", o.submit_batch,
                 "Most requests a ring hands the kernel per io_uring_enter "
                 "(0: every ready one; more than 2 lets the kernel merge "
                 "contiguous ones)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  app.add_flag("--buffered", o.buffered,
               "Do not use O_DIRECT (results are labelled buffered)");
  app.add_flag("--sync", o.sync,
               "Open the file with O_DSYNC: every write returns once its "
               "data is durable (fio's --sync=1)");
  app.add_option("--fsync", o.fsync,
                 "Write jobs: each thread waits for its writes and "
                 "fdatasyncs the file after every N of them, inside the "
                 "timed run (fio's --fsync=N; 0: never)")
      ->capture_default_str();
  app.add_flag("!--no-pin", o.pin,
               "Do not lock the I/O buffers in memory (for a low "
               "RLIMIT_MEMLOCK)");
  app.add_flag("!--no-huge-pages", o.huge_pages,
               "Back the I/O buffers with 4 KiB pages instead of transparent "
               "huge pages (as fio's default buffers are)");
}

// How the sweep runs and reports, fio beside it, --verify.
void AddRunOptions(CLI::App& app, BenchOptions& o, Texts& text) {
  app.add_flag("--vs-fio", o.vs_fio,
               "Run fio's io_uring engine on the same file and job, "
               "interleaved with each strata run, and report the ratio");
  app.add_option("--fio", o.fio, "fio executable")->capture_default_str();
  app.add_option("--fio-opt", o.fio_opts,
                 "Extra fio option, repeatable, e.g. --fio-opt=--fixedbufs");
  app.add_option("--fio-buffers", text.fio_buffers,
                 "fio's I/O buffers: huge (huge pages, as strata's; the "
                 "default) or malloc (fio's own default, 4 KiB pages, which "
                 "splits large requests: the ratio then overstates strata). "
                 "With --no-huge-pages the default is malloc; a --mem in "
                 "--fio-opt replaces this");
  app.add_option("--repeat", o.repeat,
                 "Runs per configuration, alternating with fio; the median "
                 "is reported (default 3 with --vs-fio or --recommend, else "
                 "1)")
      ->check(CLI::Range(1, 100));
  app.add_option("--json", o.json, "Write one JSON record per configuration");
  app.add_option("--log", o.log,
                 "Write bandwidth, IOPS and mean latency of each run every "
                 "0.5 s (and at its end) to FILE, one JSON object per line; "
                 "with --vs-fio fio's runs too, from fio's own reports");
  app.add_flag("--recommend", o.recommend,
               "Print per pattern the cheapest configuration the best does "
               "not beat beyond the spread of their runs, and its aio "
               "options");
  app.add_flag("--verify", o.verify,
               "Instead of the sweep: write patterned data, then read it back "
               "and check it, with random sizes at random aligned offsets");
  app.add_option("--verify-ops", o.verify_ops, "Random operations for --verify")
      ->capture_default_str();
  app.add_option("--verify-max", text.verify_max,
                 "Largest random request for --verify")
      ->capture_default_str();
  app.add_flag("--keep", o.keep, "Keep the file the benchmark created");
  app.add_flag("--overwrite", o.overwrite,
               "Allow writing to an existing file named by --path");
  app.add_option("--destroy-data-on", o.destroy_data_on,
                 "Allow jobs that write (and --verify) on the raw block "
                 "device --path names, destroying the data on it; the value "
                 "must name the same device (each device, for a job striped "
                 "over several). Refused while it, a partition of it or what "
                 "it holds is mounted or in use");
  app.add_option("--seed", o.seed, "Seed for random offsets and data")
      ->capture_default_str();
  app.add_flag("--quiet", o.quiet, "No progress on stderr");
}

// fio's --filename separates files with ':', and '\:' is a ':' inside a
// name; --path (and --destroy-data-on) take that too, besides being
// repeated. Empty names are dropped.
std::vector<std::string> SplitColons(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const std::string& path : given) {
    std::string name;
    for (size_t i = 0; i <= path.size(); ++i) {
      if (i + 1 < path.size() && path[i] == '\\' && path[i + 1] == ':') {
        name += ':';
        ++i;
      } else if (i == path.size() || path[i] == ':') {
        if (!name.empty()) out.push_back(std::move(name));
        name.clear();
      } else {
        name += path[i];
      }
    }
  }
  return out;
}

Result<std::vector<std::string>> SplitPaths(
    const std::vector<std::string>& given, bool verify) {
  std::vector<std::string> out = SplitColons(given);
  if (out.empty()) return Status::InvalidArgument("--path: empty");
  if (verify && out.size() > 1) {
    return Status::InvalidArgument(
        "--verify checks one file: give one --path (it has " +
        std::to_string(out.size()) + ")");
  }
  return out;
}

// Options given that the run would ignore: an error, so that a script
// never reads success for what it asked and did not get.
Status CheckUnused(const BenchOptions& o, const CLI::App& app) {
  auto given = [&](const char* flag) { return app.count(flag) > 0; };
  if (o.verify) {
    for (const char* flag :
         {"--rw", "--json", "--log", "--vs-fio", "--recommend", "--time",
          "--fsync", "--rwmixread", "--repeat"}) {
      if (given(flag)) {
        return Status::InvalidArgument(
            std::string("--verify checks data and measures nothing, so it "
                        "does not take ") +
            flag + ": drop it, or run the sweep without --verify");
      }
    }
    if (o.bs.size() > 1 || o.qd.size() > 1 || o.threads.size() > 1) {
      return Status::InvalidArgument(
          "--verify runs one configuration: give one --bs, --qd and "
          "--threads each");
    }
  }
  for (const char* flag : {"--fio", "--fio-opt", "--fio-buffers"}) {
    if (given(flag) && !o.vs_fio) {
      return Status::InvalidArgument(std::string(flag) +
                                     " configures the fio of --vs-fio: add "
                                     "--vs-fio, or drop " +
                                     flag);
    }
  }
  if (given("--rwmixread") && std::none_of(o.rw.begin(), o.rw.end(), IsMixed)) {
    return Status::InvalidArgument(
        "--rwmixread sets the read share of a mixed job, and --rw has "
        "none: add rw or randrw to --rw, or drop --rwmixread");
  }
  return Status::Ok();
}

// --json and --log each write their file from the start: one file for
// both would keep only the last.
Status CheckOutputs(const BenchOptions& o) {
  if (o.json.empty() || o.log.empty()) return Status::Ok();
  std::error_code json_ec, log_ec;
  const auto json = std::filesystem::weakly_canonical(o.json, json_ec);
  const auto log = std::filesystem::weakly_canonical(o.log, log_ec);
  if (json_ec || log_ec || json != log) return Status::Ok();
  return Status::InvalidArgument("--json and --log both name '" + o.json +
                                 "': give each its own file");
}

// The options parsed from text, their defaults that depend on others, and
// the checks across them.
Result<BenchOptions> Finish(BenchOptions o, Texts text, const CLI::App& app) {
  STRATA_ASSIGN_OR_RETURN(o.paths, SplitPaths(o.paths, o.verify));
  o.destroy_data_on = SplitColons(o.destroy_data_on);
  if (app.count("--repeat") == 0) o.repeat = o.vs_fio || o.recommend ? 3 : 1;
  if (app.count("--fio-buffers") == 0) {
    text.fio_buffers = o.huge_pages ? "huge" : "malloc";
  }
  STRATA_ASSIGN_OR_RETURN(o.fio_buffers, ParseFioBufferKind(text.fio_buffers));
  STRATA_ASSIGN_OR_RETURN(o.rw, ParseRws(text.rw));
  STRATA_ASSIGN_OR_RETURN(o.bs, ParseBlockSizes(text.bs));
  STRATA_ASSIGN_OR_RETURN(o.qd, ParseInts("--qd", text.qd, 1, 4096));
  STRATA_ASSIGN_OR_RETURN(o.threads,
                          ParseInts("--threads", text.threads, 1, 64));
  STRATA_ASSIGN_OR_RETURN(o.size, ForFlag("--size", ParseSize(text.size)));
  STRATA_ASSIGN_OR_RETURN(o.verify_max,
                          ForFlag("--verify-max", ParseSize(text.verify_max)));
  if (o.seconds < 0) return Status::InvalidArgument("--time must be >= 0");
  STRATA_RETURN_IF_ERROR(CheckMixAndRamp(o));
  STRATA_RETURN_IF_ERROR(CheckTimedBuffered(!o.buffered, o.seconds));
  STRATA_RETURN_IF_ERROR(CheckUnused(o, app));
  STRATA_RETURN_IF_ERROR(CheckOutputs(o));
  if (o.fsync > 0 && std::none_of(o.rw.begin(), o.rw.end(), OnlyWrites)) {
    return Status::InvalidArgument(
        "--fsync syncs writes, and --rw has no write job: add write or "
        "randwrite to --rw, or drop --fsync");
  }
  return CheckSize(o);
}

}  // namespace

bool RunWrites(const BenchOptions& o) {
  return o.verify || std::any_of(o.rw.begin(), o.rw.end(), IsWrite);
}

Result<BenchOptions> ParseCommandLine(int argc, char** argv, bool* exit_now) {
  BenchOptions o;
  Texts text;
  CLI::App app(kDescription, "strata-nvme-bench");
  app.get_formatter()->column_width(34);
  AddJobOptions(app, o, text);
  AddRunOptions(app, o, text);
  STRATA_RETURN_IF_ERROR(ParseArgs(app, argc, argv, exit_now));
  if (*exit_now) return o;
  return Finish(std::move(o), std::move(text), app);
}

}  // namespace strata::bench
