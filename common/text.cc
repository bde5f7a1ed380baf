#include "common/text.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace strata {
namespace {

// The multiplier of a size suffix ("K", "MiB", "gb", ""), or 0 when it is
// not one.
uint64_t UnitOf(std::string suffix) {
  if (!suffix.empty() && (suffix.back() == 'B' || suffix.back() == 'b')) {
    suffix.pop_back();
  }
  if (suffix.size() == 2 && (suffix[1] == 'i' || suffix[1] == 'I')) {
    suffix.pop_back();
  }
  if (suffix.empty()) return 1;
  if (suffix.size() != 1) return 0;
  switch (std::toupper(static_cast<unsigned char>(suffix[0]))) {
    case 'K':
      return 1ull << 10;
    case 'M':
      return 1ull << 20;
    case 'G':
      return 1ull << 30;
    case 'T':
      return 1ull << 40;
    default:
      return 0;
  }
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof(text), "%llu B",
                  static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(text, sizeof(text), "%.1f %s", value, kUnits[unit]);
  }
  return text;
}

std::string SizeText(uint64_t bytes) {
  if (bytes == 0) return "0";
  for (auto [shift, unit] :
       {std::pair{30, "G"}, std::pair{20, "M"}, std::pair{10, "K"}}) {
    if (bytes % (1ull << shift) == 0) {
      return std::to_string(bytes >> shift) + unit;
    }
  }
  return std::to_string(bytes);
}

Result<uint64_t> ParseSize(const std::string& text) {
  const Status invalid(
      StatusCode::kInvalidArgument,
      "'" + text + "' is not a size (e.g. 4096, 128K, 1M, 2G)");
  size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &used);
  } catch (const std::exception&) {
    return invalid;
  }
  const uint64_t unit = UnitOf(text.substr(used));
  if (unit == 0 || text[0] == '-') return invalid;
  return static_cast<uint64_t>(v) * unit;
}

std::vector<std::string> SplitList(const std::string& text, char separator) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= text.size();) {
    const size_t end = std::min(text.find(separator, at), text.size());
    if (end > at) out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

std::string ErrnoText(int err) {
  const char* name = strerrorname_np(err);
  std::string out = name ? name : "errno " + std::to_string(err);
  out += " (";
  out += std::strerror(err);
  out += ")";
  return out;
}

}  // namespace strata
