#include "src/optim/step_digest.h"

#include <algorithm>

#include "strata/status.h"

namespace strata::optim {

StepDigest::StepDigest(const std::vector<Chunk>& chunks)
    : chunks_(chunks), segments_(chunks.size()) {}

int StepDigest::IndexOf(Role role) const {
  for (size_t i = 0; i < chunks_.size(); ++i) {
    if (chunks_[i].role == role) return static_cast<int>(i);
  }
  return -1;
}

void StepDigest::Add(Role role, uint64_t offset, uint64_t n) {
  const int i = IndexOf(role);
  if (n == 0 || i < 0) return;
  const Chunk& c = chunks_[i];
  STRATA_CHECK(offset <= c.bytes && n <= c.bytes - offset);
  const tier::Segment segment{offset, n, tier::Hash(c.base + offset, n)};
  std::lock_guard<std::mutex> lock(mu_);
  segments_[i].push_back(segment);
}

std::vector<std::pair<Role, std::shared_ptr<const tier::Digest>>>
StepDigest::Finish() {
  std::vector<std::pair<Role, std::shared_ptr<const tier::Digest>>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const Chunk& c = chunks_[i];
    tier::Digest& added = segments_[i];
    std::sort(added.begin(), added.end(),
              [](const tier::Segment& a, const tier::Segment& b) {
                return a.offset < b.offset;
              });
    auto digest = std::make_shared<tier::Digest>();
    uint64_t at = 0;
    auto gap_to = [&](uint64_t end) {
      if (end > at) {
        digest->push_back({at, end - at, tier::Hash(c.base + at, end - at)});
      }
    };
    for (const tier::Segment& s : added) {
      STRATA_CHECK(s.offset >= at && "pieces of a step overlap");
      gap_to(s.offset);
      digest->push_back(s);
      at = s.offset + s.bytes;
    }
    gap_to(c.bytes);
    out.emplace_back(c.role, std::move(digest));
  }
  return out;
}

}  // namespace strata::optim
