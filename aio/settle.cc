// How one finished transfer moves its piece on: the fault injector's say,
// short transfers, EINTR/EAGAIN and errors. Shared by both backends, so
// that a result means the same whichever of them reaped it.
#include <cerrno>
#include <cstdint>

#include "aio/internal.h"

namespace strata::aio::internal {
namespace {

// What one transfer's result means for its piece.
enum class Progress { kDone, kResubmit, kFailed };

// Note [EAGAIN budget]
// EAGAIN and EINTR mean "try again", but a device that answers EAGAIN
// forever would spin a ring thread at 100%. After this many consecutive
// retries of one piece we give up and report the errno.
constexpr uint32_t kMaxRetries = 10000;

// The single place that interprets a transfer result (bytes or -errno):
// short transfers and EINTR/EAGAIN resubmit the remainder, zero-byte
// progress and other errors fail. Sets *err to a positive errno on kFailed.
Progress Advance(Piece& piece, int result, int* err) {
  if (result == -EINTR || result == -EAGAIN) {
    if (++piece.retries > kMaxRetries) {
      *err = -result;
      return Progress::kFailed;
    }
    return Progress::kResubmit;
  }
  if (result < 0) {
    *err = -result;
    return Progress::kFailed;
  }
  if (result == 0) {
    // No progress: a read at end of file, or a device that wrote nothing.
    *err = piece.op->write ? EIO : ENODATA;
    return Progress::kFailed;
  }
  piece.retries = 0;
  piece.done += static_cast<uint32_t>(result);
  return piece.done >= piece.len ? Progress::kDone : Progress::kResubmit;
}

}  // namespace

uint32_t NextLength(const Piece& piece) {
  const uint32_t rest = piece.len - piece.done;
  FaultInjector* fi = piece.op->injector;
  if (fi == nullptr) return rest;
  const uint32_t n =
      fi->SubmitLength(piece.op->write, piece.offset + piece.done, rest);
  return n == 0 || n > rest ? rest : n;
}

namespace {

// The kernel's result as the fault injector rewrites it (and the data, for
// reads, as it corrupts it).
int FilterResult(const Piece& piece, uint32_t submitted, int result) {
  FaultInjector* fi = piece.op->injector;
  if (fi == nullptr) return result;
  const uint64_t offset = piece.offset + piece.done;
  result = fi->CompletionResult(piece.op->write, offset, submitted, result);
  if (!piece.op->write && result > 0) {
    fi->AfterRead(offset, piece.buf + piece.done,
                  static_cast<uint32_t>(result));
  }
  return result;
}

// A sync's result (0 or -errno) as the fault injector rewrites it: EINTR
// and EAGAIN retry within Note [EAGAIN budget], anything else finishes it.
bool SettleSync(Piece* piece, int result) {
  FaultInjector* fi = piece->op->injector;
  if (fi != nullptr) result = fi->SyncResult(result);
  if ((result == -EINTR || result == -EAGAIN) &&
      ++piece->retries <= kMaxRetries) {
    return true;
  }
  CompletePiece(piece, result < 0 ? -result : 0);
  return false;
}

}  // namespace

bool Settle(Piece* piece, uint32_t submitted, int result) {
  if (piece->op->sync) return SettleSync(piece, result);
  int err = 0;
  switch (Advance(*piece, FilterResult(*piece, submitted, result), &err)) {
    case Progress::kResubmit:
      return true;
    case Progress::kDone:
      CompletePiece(piece, 0);
      return false;
    case Progress::kFailed:
      CompletePiece(piece, err);
      return false;
  }
  return false;
}

}  // namespace strata::aio::internal
