// The NVMe reads one optimizer step verifies in its pass: the bytes its
// hold was handed unchecked (Note [Unchecked host copies] in
// src/store/residency_checks.cc), each segment of their digest hashed just
// before the piece of the pass that covers it is stepped, while the bytes
// are in cache (the write side: Note [Checksums in the optimizer's pass]
// in src/optim/step_digest.h).
//
// A segment is verified in the pass when it is exactly one piece's range
// of its chunk; the previous step's pass made its digest of those same
// ranges (CpuOptimizer::Step's pieces depend on n alone), so in the steady
// state every segment is. The rest (the gaps its digest filled, and
// digests the store made of its own segments, after a caller's write or a
// load) are verified before the pass, in one of its own.
//
// Usage:
//   StepCheck check({{Role::kState1, m, fetched.unchecked[Role::kState1]}},
//                   mismatch);
//   for each piece's range: check.Expect(role, offset, bytes);
//   if (!check.VerifyUnexpected().ok()) ...;          // before the pass
//   hooks.check = [&](b, e) { return check.Check(role, offset, bytes); };
//   Status verified = check.Finish();                  // after it
//
// Thread safety: Check may be called from several threads at once, for
// distinct ranges; everything else from one thread, not during the pass.
#ifndef STRATA_SRC_OPTIM_STEP_CHECK_H_
#define STRATA_SRC_OPTIM_STEP_CHECK_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "src/store/residency.h"
#include "strata/engine.h"
#include "strata/status.h"

namespace strata::optim {

class StepCheck {
 public:
  struct Chunk {
    Role role = Role::kMaster;
    const char* base = nullptr;  // the host copy the hold pins
    store::Residency::Unchecked read;
  };
  // The error of segment `bad` of `role`'s chunk hashing to `got`
  // (Residency::Mismatch).
  using MismatchFn =
      std::function<Status(Role role, const store::Residency::Unchecked& read,
                           const tier::Segment& bad, uint64_t got)>;
  // Chunks without a digest (verified already) are left out.
  StepCheck(const std::vector<Chunk>& chunks, MismatchFn mismatch);

  bool empty() const { return chunks_.empty(); }
  // Before the pass: `role`'s bytes [offset, offset + n) will be shown to
  // Check; a segment of exactly that range is left to it.
  void Expect(Role role, uint64_t offset, uint64_t n);
  // Verifies every segment that no Expect named; the first mismatch.
  Status VerifyUnexpected();
  // During the pass, before the range is stepped: verifies the segment
  // Expect left to it (nothing for a role or range without one). False on
  // a mismatch, which Finish returns.
  bool Check(Role role, uint64_t offset, uint64_t n);
  // After the pass: verifies what it did not reach (a step that stopped
  // early); the first mismatch of all, or OK when every byte matched.
  Status Finish();
  bool failed() const;

 private:
  enum class SegmentState : uint8_t { kUnexpected, kExpected, kVerified };
  struct Checked {
    Chunk chunk;
    std::vector<SegmentState> state;  // per segment of chunk.read.digest
  };
  // The index of the segment of `c` at exactly [offset, offset + n), or -1.
  static int SegmentAt(const Checked& c, uint64_t offset, uint64_t n);
  Checked* Find(Role role);
  // Hashes segment `i` of `c`; false (and the error kept) on a mismatch.
  bool Verify(Checked& c, size_t i);
  // Verifies every segment of a state in `states`.
  Status VerifyAll(std::initializer_list<SegmentState> states);

  // Fixed after construction, but for `state`, of which each element is
  // written by one thread at a time (Check: the piece's owner).
  std::vector<Checked> chunks_;
  MismatchFn mismatch_;

  // Guarded by mu_.
  mutable std::mutex mu_;
  Status error_;  // the first mismatch
};

}  // namespace strata::optim

#endif  // STRATA_SRC_OPTIM_STEP_CHECK_H_
