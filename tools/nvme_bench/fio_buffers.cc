#include "tools/nvme_bench/fio_buffers.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "strata/aio.h"

namespace strata::bench {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr int kSlackPages = 2;  // per job, over bs x (qd + 1)

// What a signal handler needs to give the pages back: fixed buffers, set
// before the handlers are installed (Note [Fair fio buffers]).
char g_restore_path[256];
char g_restore_value[24];
struct sigaction g_previous[std::size(kSignals)];

void RestoreAndReraise(int sig) {
  const int fd = open(g_restore_path, O_WRONLY);
  if (fd >= 0) {
    ssize_t ignored = write(fd, g_restore_value, strlen(g_restore_value));
    (void)ignored;
    close(fd);
  }
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    sigaction(kSignals[i], &g_previous[i], nullptr);
  }
  raise(sig);
}

void InstallHandlers(const std::string& path, uint64_t value) {
  fmt::format_to_n(g_restore_path, sizeof(g_restore_path) - 1, "{}", path);
  fmt::format_to_n(g_restore_value, sizeof(g_restore_value) - 1, "{}\n", value);
  struct sigaction action {};
  action.sa_handler = RestoreAndReraise;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    sigaction(kSignals[i], &action, &g_previous[i]);
  }
}

void RemoveHandlers() {
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    sigaction(kSignals[i], &g_previous[i], nullptr);
  }
}

// A "Name:   value" field of /proc/meminfo; -1 when absent.
int64_t MeminfoField(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + ":", 0) == 0) {
      return std::strtoll(line.c_str() + name.size() + 1, nullptr, 10);
    }
  }
  return -1;
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  *out = text.str();
  return static_cast<bool>(in);
}

// Writes `value` to vm.nr_hugepages and reads back what the kernel kept.
Result<uint64_t> SetHugePages(const std::string& path, uint64_t value) {
  const int fd = open(path.c_str(), O_WRONLY | O_TRUNC);
  const std::string text = std::to_string(value) + "\n";
  if (fd < 0 || write(fd, text.data(), text.size()) < 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    return Status(StatusCode::kPermissionDenied,
                  fmt::format("cannot raise vm.nr_hugepages ({}: {}; needs "
                              "root and a writable /proc/sys)",
                              path, why));
  }
  close(fd);
  std::string now;
  ReadFile(path, &now);
  return std::strtoull(now.c_str(), nullptr, 10);
}

// Puts vm.nr_hugepages back, saying how to do it by hand when it cannot.
void GiveBack(const std::string& path, uint64_t old_nr) {
  Result<uint64_t> now = SetHugePages(path, old_nr);
  if (!now.ok() || *now != old_nr) {
    std::fprintf(
        stderr,
        "strata-nvme-bench: warning: could not put %s back to %llu "
        "(%s); run: echo %llu > %s\n",
        path.c_str(), static_cast<unsigned long long>(old_nr),
        now.ok() ? "the kernel kept more" : now.status().message().c_str(),
        static_cast<unsigned long long>(old_nr), path.c_str());
  }
}

}  // namespace

Result<FioBufferKind> ParseFioBufferKind(const std::string& name) {
  if (name == "huge") return FioBufferKind::kHugePages;
  if (name == "malloc") return FioBufferKind::kMalloc;
  return Status(StatusCode::kInvalidArgument,
                "--fio-buffers: '" + name + "' is not one of huge, malloc");
}

uint64_t FioHugePagesNeeded(const std::vector<JobSpec>& specs,
                            uint64_t page_bytes) {
  uint64_t most = 0;
  for (const JobSpec& s : specs) {
    const uint64_t per_job =
        (s.bs * (s.qd + 1ull) + page_bytes - 1) / page_bytes + kSlackPages;
    most = std::max(most, per_job * s.threads);
  }
  return most;
}

bool FioOptsChooseBuffers(const std::vector<std::string>& fio_opts) {
  return std::any_of(fio_opts.begin(), fio_opts.end(), [](const auto& o) {
    return o == "--mem" || o == "--iomem" || o.rfind("--mem=", 0) == 0 ||
           o.rfind("--iomem=", 0) == 0;
  });
}

std::unique_ptr<FioBuffers> FioBuffers::Prepare(
    FioBufferKind wanted, const std::vector<JobSpec>& specs,
    const std::vector<std::string>& fio_opts, const HugePageFiles& files) {
  std::unique_ptr<FioBuffers> b(new FioBuffers);
  if (FioOptsChooseBuffers(fio_opts)) {
    b->kind_ = "--fio-opt";
    b->description_ = "fio: buffers as --fio-opt chose them";
    return b;
  }
  b->kind_ = "malloc";
  b->description_ =
      "fio: buffers from malloc on 4 KiB pages, as asked (--fio-buffers "
      "malloc)";
  if (wanted == FioBufferKind::kMalloc) return b;
  std::string meminfo, why;
  ReadFile(files.meminfo, &meminfo);
  const int64_t kib = MeminfoField(meminfo, "Hugepagesize");
  if (kib <= 0) {
    why = "this kernel has no huge page pool (no Hugepagesize in " +
          files.meminfo + ")";
  } else if (b->Reserve(FioHugePagesNeeded(specs, kib * 1024ull), kib * 1024ull,
                        files, &why)) {
    b->kind_ = "huge pages";
    b->options_ = {"--mem=mmaphuge",
                   "--hugepage-size=" + std::to_string(kib * 1024)};
    return b;
  }
  b->description_ =
      "fio: buffers from malloc on 4 KiB pages: huge pages could not be "
      "had (" +
      why + ")";
  return b;
}

bool FioBuffers::Reserve(uint64_t pages, uint64_t page_bytes,
                         const HugePageFiles& files, std::string* why) {
  std::string meminfo, nr_text;
  ReadFile(files.meminfo, &meminfo);
  const int64_t free_pages = std::max<int64_t>(
      0, MeminfoField(meminfo, "HugePages_Free") -
             std::max<int64_t>(0, MeminfoField(meminfo, "HugePages_Rsvd")));
  const std::string page = aio::HumanBytes(page_bytes);
  if (static_cast<uint64_t>(free_pages) >= pages) {
    description_ = fmt::format(
        "fio: buffers on {} huge pages (--mem=mmaphuge), as strata's; {} of "
        "the {} free huge pages, none reserved",
        page, pages, free_pages);
    return true;
  }
  if (!ReadFile(files.nr_hugepages, &nr_text)) {
    *why = "cannot read " + files.nr_hugepages;
    return false;
  }
  const uint64_t old_nr = std::strtoull(nr_text.c_str(), nullptr, 10);
  const uint64_t want = old_nr + pages - free_pages;
  Result<uint64_t> got = SetHugePages(files.nr_hugepages, want);
  if (!got.ok() || *got < want) {
    if (got.ok()) GiveBack(files.nr_hugepages, old_nr);
    *why = got.ok() ? fmt::format(
                          "the kernel gave {} of the {} huge pages "
                          "asked for (memory too fragmented?)",
                          *got - std::min(*got, old_nr), pages - free_pages)
                    : got.status().message();
    return false;
  }
  nr_path_ = files.nr_hugepages;
  old_nr_ = old_nr;
  reserved_ = want - old_nr;
  InstallHandlers(nr_path_, old_nr_);
  description_ = fmt::format(
      "fio: buffers on {} huge pages (--mem=mmaphuge), as strata's; {} "
      "reserved for this run (vm.nr_hugepages {} -> {}), given back at its "
      "end",
      page, reserved_, old_nr, want);
  return true;
}

FioBuffers::~FioBuffers() {
  if (nr_path_.empty()) return;
  RemoveHandlers();
  GiveBack(nr_path_, old_nr_);
}

bool FioBuffers::unequal(bool strata_huge_pages) const {
  if (kind_ == "--fio-opt") return false;
  return (kind_ == "huge pages") != strata_huge_pages;
}

}  // namespace strata::bench
