#include "src/optim/step_check.h"

#include <algorithm>
#include <utility>

namespace strata::optim {

StepCheck::StepCheck(const std::vector<Chunk>& chunks, MismatchFn mismatch)
    : mismatch_(std::move(mismatch)) {
  for (const Chunk& c : chunks) {
    if (c.read.digest == nullptr) continue;
    chunks_.push_back(
        {c, std::vector<SegmentState>(c.read.digest->size(),
                                      SegmentState::kUnexpected)});
  }
}

int StepCheck::SegmentAt(const Checked& c, uint64_t offset, uint64_t n) {
  const tier::Digest& d = *c.chunk.read.digest;
  const auto it = std::lower_bound(
      d.begin(), d.end(), offset,
      [](const tier::Segment& s, uint64_t at) { return s.offset < at; });
  if (it == d.end() || it->offset != offset || it->bytes != n) return -1;
  return static_cast<int>(it - d.begin());
}

StepCheck::Checked* StepCheck::Find(Role role) {
  for (Checked& c : chunks_) {
    if (c.chunk.role == role) return &c;
  }
  return nullptr;
}

void StepCheck::Expect(Role role, uint64_t offset, uint64_t n) {
  Checked* c = Find(role);
  if (c == nullptr) return;
  const int i = SegmentAt(*c, offset, n);
  if (i >= 0) c->state[i] = SegmentState::kExpected;
}

bool StepCheck::Verify(Checked& c, size_t i) {
  const tier::Segment& s = (*c.chunk.read.digest)[i];
  const uint64_t got = tier::Hash(c.chunk.base + s.offset, s.bytes);
  c.state[i] = SegmentState::kVerified;
  if (got == s.hash) return true;
  Status failed = mismatch_(c.chunk.role, c.chunk.read, s, got);
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok()) error_ = std::move(failed);
  return false;
}

Status StepCheck::VerifyAll(std::initializer_list<SegmentState> states) {
  for (Checked& c : chunks_) {
    for (size_t i = 0; i < c.state.size(); ++i) {
      if (std::find(states.begin(), states.end(), c.state[i]) != states.end()) {
        Verify(c, i);
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

Status StepCheck::VerifyUnexpected() {
  return VerifyAll({SegmentState::kUnexpected});
}

bool StepCheck::Check(Role role, uint64_t offset, uint64_t n) {
  Checked* c = Find(role);
  if (c == nullptr) return true;
  const int i = SegmentAt(*c, offset, n);
  if (i < 0 || c->state[i] != SegmentState::kExpected) return true;
  return Verify(*c, i);
}

Status StepCheck::Finish() {
  return VerifyAll({SegmentState::kUnexpected, SegmentState::kExpected});
}

bool StepCheck::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !error_.ok();
}

}  // namespace strata::optim
