// The optimizer pipeline's pass over one group: the CPU optimizer's step
// over the chunks a step holds, with the checksums of what it reads
// verified (src/optim/step_check.h) and of what it writes taken (Note
// [Checksums in the optimizer's pass] in src/optim/step_digest.h), piece
// by piece while each piece is in cache.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "src/optim/pipeline.h"

namespace strata {
namespace {

// One CpuOptimizer::Step call of a group's pass: the whole group's flat
// arrays (`t` null), or tensor `t`'s part of them with packed state.
struct Call {
  const store::TensorLayout* t = nullptr;
  OptimBuffers b;
};

// `bytes` past `base`; null for a buffer not given (SumSquares gives only
// the gradients).
char* At(const void* base, uint64_t bytes) {
  if (base == nullptr) return nullptr;
  return static_cast<char*>(const_cast<void*>(base)) + bytes;
}

// The calls of a pass over `whole` in the group's state format: one, or
// with packed state (kQ8: src/store/layout.h) one per tensor, each in its
// own format.
std::vector<Call> CallsOf(const store::GroupLayout& layout,
                          const OptimBuffers& whole) {
  if (!layout.packed_state) {
    Call call{nullptr, whole};
    call.b.state_format = layout.tensors[0].state;  // every tensor's
    return {call};
  }
  const size_t grad_width = FloatTypeSize(whole.grad_type);
  const size_t out_width = FloatTypeSize(whole.out_type);
  std::vector<Call> calls;
  for (const store::TensorLayout& t : layout.tensors) {
    OptimBuffers b = whole;
    b.params =
        reinterpret_cast<float*>(At(whole.params, t.element * sizeof(float)));
    b.grads = At(whole.grads, t.element * grad_width);
    b.state1 = At(whole.state1, t.offset[Role::kState1]);
    b.state2 = At(whole.state2, t.offset[Role::kState2]);
    b.state_format = t.state;
    if (t.state == StateFormat::kQ8) {
      const uint64_t codes = Q8Blocks(t.elements) * kQ8Block;
      b.state1_scale = reinterpret_cast<float*>(At(b.state1, codes));
      b.state2_scale = reinterpret_cast<float*>(At(b.state2, codes));
    }
    b.params_out = At(whole.params_out, t.element * out_width);
    b.n = t.elements;
    calls.push_back({&t, b});
  }
  return calls;
}

// Calls f(role, offset, bytes) for each chunk range that elements
// [begin, end) of `call` occupy: the params (roles.params' chunk), the
// copy written beside them (roles.out's), m and v (in 8-bit state, a
// tensor's codes and its scales are two ranges: Note [8-bit state] in
// strata/cpu_adam.h).
template <class F>
void ForEachRange(const Call& call, PassRoles roles, size_t begin, size_t end,
                  F&& f) {
  const OptimBuffers& b = call.b;
  const uint64_t first = call.t == nullptr ? 0 : call.t->element;
  f(roles.params, (first + begin) * 4, (end - begin) * 4);
  if (b.params_out != nullptr) {
    const uint64_t width = FloatTypeSize(b.out_type);
    f(roles.out, (first + begin) * width, (end - begin) * width);
  }
  for (Role r : {Role::kState1, Role::kState2}) {
    const uint64_t at = call.t == nullptr ? 0 : call.t->offset[r];
    if (b.state_format == StateFormat::kQ8) {
      constexpr uint64_t kScale = sizeof(float);
      const uint64_t codes = Q8Blocks(call.t->elements) * kQ8Block;
      const uint64_t block = begin / kQ8Block;
      const uint64_t blocks = (end + kQ8Block - 1) / kQ8Block - block;
      f(r, at + begin, end - begin);
      f(r, at + codes + block * kScale, blocks * kScale);
    } else {
      const uint64_t width = b.state_format == StateFormat::kBF16 ? 2 : 4;
      f(r, at + begin * width, (end - begin) * width);
    }
  }
}

// What the pass shows each piece of `call`: its old bytes to `check`
// before the step, its new ones to `digest` after.
CpuOptimizer::StepHooks HooksOf(const Call& call, PassRoles roles,
                                optim::StepDigest* digest,
                                optim::StepCheck* check) {
  CpuOptimizer::StepHooks hooks;
  if (check != nullptr && !check->empty()) {
    hooks.check = [=](size_t begin, size_t end) {
      bool ok = true;
      ForEachRange(call, roles, begin, end,
                   [&](Role r, uint64_t at, uint64_t n) {
                     ok = ok && check->Check(r, at, n);
                   });
      return ok;
    };
  }
  hooks.observer = [=](size_t begin, size_t end) {
    ForEachRange(call, roles, begin, end, [&](Role r, uint64_t at, uint64_t n) {
      digest->Add(r, at, n);
    });
  };
  return hooks;
}

// The ranges the pieces of `calls` will show `check` (CpuOptimizer::Step's
// pieces depend on n alone).
void ExpectPieces(const std::vector<Call>& calls, PassRoles roles,
                  optim::StepCheck& check) {
  for (const Call& call : calls) {
    for (size_t begin = 0; begin < call.b.n; begin += kStepPiece) {
      const size_t end = std::min(call.b.n, begin + kStepPiece);
      ForEachRange(
          call, roles, begin, end,
          [&](Role r, uint64_t at, uint64_t n) { check.Expect(r, at, n); });
    }
  }
}

}  // namespace

std::vector<optim::StepDigest::Chunk> OffloadOptimizer::Impl::DigestedChunks(
    int group, const OptimBuffers& b, PassRoles roles) const {
  const store::GroupLayout& layout = parts_.residency->layout(group);
  std::vector<optim::StepDigest::Chunk> chunks;
  auto add = [&](Role role, const void* base) {
    const store::ChunkLayout& c = layout.chunks[layout.chunk_of_role[role]];
    if (base == nullptr || c.home != Tier::kNvme) return;
    chunks.push_back({role, static_cast<const char*>(base), c.bytes});
  };
  add(roles.params, b.params);
  add(Role::kState1, b.state1);
  add(Role::kState2, b.state2);
  add(roles.out, b.params_out);
  return chunks;
}

std::unique_ptr<optim::StepCheck> OffloadOptimizer::Impl::CheckOf(
    int group, const store::Residency::Fetched& fetched) const {
  std::vector<optim::StepCheck::Chunk> chunks;
  for (Role r : {Role::kMaster, Role::kCompute, Role::kState1, Role::kState2}) {
    if ((groups_[group].checked & RoleBit(r)) == 0) continue;
    chunks.push_back({r, fetched.base[r], fetched.unchecked[r]});
  }
  store::Residency* residency = parts_.residency;
  return std::make_unique<optim::StepCheck>(
      chunks,
      [residency, group](Role role, const store::Residency::Unchecked& read,
                         const tier::Segment& bad, uint64_t got) {
        return residency->Mismatch(group, role, read, bad, got);
      });
}

// Note [The norm in the step's pass]
// A group's sum of squares of its gradients (the global checks: clipping,
// skip-on-overflow) is the sum, call by call in order, of SumSquares over
// each call's gradients (one call, or one per tensor with packed state).
// A step under backward that speculates reads every gradient anyway, so
// it takes the sums in its pass (CpuOptimizer::StepHooks::piece_sums), bit
// for bit the same: no pass of its own over the gradients (4 bytes a
// parameter read again, 0.43 GB a step for the 107M GPT of
// torch_offload_bench.py). A non-finite gradient stops that step partway;
// it is a speculative one, undone as the skipped step it belongs to is
// (Note [Exact steps under overlap]), and the norm comes from a pass of
// its own then. Steps that stand as they run (not speculative) still check
// the gradients first: they must never stop partway.
Result<SumSquaresResult> OffloadOptimizer::Impl::SumSquares(int group,
                                                            const void* grads,
                                                            FloatType type) {
  OptimBuffers whole;
  whole.grads = grads;
  whole.grad_type = type;
  whole.n = groups_[group].n;
  SumSquaresResult out;
  for (const Call& call : CallsOf(parts_.residency->layout(group), whole)) {
    STRATA_ASSIGN_OR_RETURN(SumSquaresResult r,
                            cpu_->SumSquares(call.b.grads, type, call.b.n));
    out.sum += r.sum;
  }
  out.finite = std::isfinite(out.sum);
  return out;
}

// Steps the group's buffers `whole`, call by call, stopping at the first
// that does not apply; the bytes no piece will verify are verified first.
Result<StepReport> OffloadOptimizer::Impl::Step(
    int group, const StepOptions& step, const OptimBuffers& whole,
    PassRoles roles, optim::StepDigest* digest, optim::StepCheck* check,
    SumSquaresResult* norm) {
  const std::vector<Call> calls =
      CallsOf(parts_.residency->layout(group), whole);
  if (check != nullptr && !check->empty()) {
    ExpectPieces(calls, roles, *check);
    STRATA_RETURN_IF_ERROR(check->VerifyUnexpected());
  }
  StepReport report;
  SumSquaresResult sum;
  std::vector<double> pieces;
  for (const Call& call : calls) {
    CpuOptimizer::StepHooks hooks = HooksOf(call, roles, digest, check);
    if (norm != nullptr) {
      pieces.assign((call.b.n + kStepPiece - 1) / kStepPiece, 0.0);
      hooks.piece_sums = pieces.data();
    }
    STRATA_ASSIGN_OR_RETURN(report, cpu_->Step(step, call.b, hooks));
    if (report.overflow()) return report;
    sum.sum += SumPieces(pieces.data(), pieces.size()).sum;
  }
  if (norm != nullptr) *norm = {sum.sum, std::isfinite(sum.sum)};
  return report;
}

Status OffloadOptimizer::Impl::Release(StepHold& hold) {
  const Status checked = hold.check ? hold.check->Finish() : Status();
  if (!checked.ok()) {
    parts_.residency->MarkLost(hold.fetched.hold, checked);
  }
  const Status released = hold.fetched.pin.Release();
  return checked.ok() ? released : checked;
}

}  // namespace strata
