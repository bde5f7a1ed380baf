#include "tools/nvme_bench/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "common/text.h"

namespace strata::bench {

Progress::Progress(bool enabled)
    : enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0) {}

void Progress::Update(const std::string& text) {
  if (!enabled_) return;
  const uint64_t now = NowNs();
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
  } else if (now - last_ns_ >= 5'000'000'000ull) {
    std::fprintf(stderr, "%s\n", text.c_str());
  } else {
    return;
  }
  last_ns_ = now;
  dirty_ = tty_;
}

void Progress::Clear() {
  if (dirty_) std::fprintf(stderr, "\r\033[K");
  dirty_ = false;
}

std::string JobProgressText(const std::string& label, const JobSpec& spec,
                            ProgressSample prev, ProgressSample now) {
  const uint64_t total = spec.bs > 0 ? spec.size / spec.bs * spec.bs : 0;
  double percent = 0;
  if (spec.seconds > 0) {
    percent = 100 * now.seconds / (spec.ramp + spec.seconds);
  } else if (total > 0) {
    percent = 100.0 * now.bytes / total;
  }
  const double dt = now.seconds - prev.seconds;
  const double gbps = dt > 0 && now.bytes >= prev.bytes
                          ? (now.bytes - prev.bytes) / dt / 1e9
                          : 0.0;
  return fmt::format("{}: {:.0f}% {:.3f} GB/s", label,
                     std::clamp(percent, 0.0, 100.0), gbps);
}

std::string VerifyProgressText(VerifyPhase phase, uint64_t done,
                               uint64_t total) {
  switch (phase) {
    case VerifyPhase::kWrite:
      return fmt::format("verify: writing {} of {}", SizeText(done),
                         SizeText(total));
    case VerifyPhase::kRandom:
      return fmt::format("verify: {} of {} random ops", done, total);
    case VerifyPhase::kReadBack:
      return fmt::format("verify: reading back {} of {}", SizeText(done),
                         SizeText(total));
  }
  return "verify";
}

}  // namespace strata::bench
