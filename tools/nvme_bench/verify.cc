#include "tools/nvme_bench/verify.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <vector>

#include "strata/aio.h"

namespace strata::bench {
namespace {

// Generations are tracked per unit (the file's direct-I/O alignment, at
// least 512 bytes); every request is a whole number of units.
struct Span {
  uint64_t first = 0;  // unit index
  uint64_t units = 0;
};

bool Overlaps(const Span& a, const Span& b) {
  return a.first < b.first + b.units && b.first < a.first + a.units;
}

struct Slot {
  char* buf = nullptr;
  Span span;
  bool write = false;
  bool busy = false;
  uint32_t gen = 0;
};

class Verifier {
 public:
  Verifier(const VerifyOptions& o, aio::Engine* engine, aio::File* file,
           const std::atomic<bool>* cancel, uint64_t unit, uint64_t units)
      : o_(o),
        engine_(engine),
        file_(file),
        cancel_(cancel),
        unit_(unit),
        gens_(units, 0),
        rng_(o.seed) {}

  Status Run(char* buffers, const VerifyProgressFn& progress);
  VerifyResult& result() { return result_; }

 private:
  Status Submit(Slot& slot);
  Status Complete(Slot& slot);
  Status WaitOne();
  Slot* FreeSlot();
  void Fill(Slot& slot) const;
  void Check(const Slot& slot);
  bool Collides(const Span& span) const;
  Status Sequential(bool write, const VerifyProgressFn& progress);
  Status Drain();
  Status Random(const VerifyProgressFn& progress);
  void Report(const VerifyProgressFn& progress, VerifyPhase phase,
              uint64_t done, uint64_t total);
  bool Cancelled() const { return cancel_ != nullptr && cancel_->load(); }

  const VerifyOptions o_;
  aio::Engine* engine_;
  aio::File* file_;
  const std::atomic<bool>* cancel_;
  const uint64_t unit_;
  std::vector<uint32_t> gens_;
  std::mt19937_64 rng_;
  uint32_t next_gen_ = 1;  // the first pass writes generation 1
  std::vector<Slot> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Slot*, Status>> done_;
  uint64_t last_report_ns_ = 0;
  VerifyResult result_;
};

void Verifier::Fill(Slot& s) const {
  auto* words = reinterpret_cast<uint64_t*>(s.buf);
  const uint64_t base = s.span.first * unit_;
  const uint64_t n = s.span.units * unit_ / 8;
  for (uint64_t i = 0; i < n; ++i) {
    words[i] = PatternWord(base + i * 8, s.gen, o_.seed);
  }
}

void Verifier::Check(const Slot& s) {
  const auto* words = reinterpret_cast<const uint64_t*>(s.buf);
  const uint64_t per_unit = unit_ / 8;
  for (uint64_t u = 0; u < s.span.units; ++u) {
    const uint32_t gen = gens_[s.span.first + u];
    const uint64_t base = (s.span.first + u) * unit_;
    for (uint64_t w = 0; w < per_unit; ++w) {
      const uint64_t off = base + w * 8;
      const uint64_t want = PatternWord(off, gen, o_.seed);
      const uint64_t got = words[u * per_unit + w];
      if (got == want) continue;
      if (result_.mismatched_words++ == 0) {
        result_.first_mismatch = fmt::format(
            "offset {}: expected {:#018x} (generation {}), read {:#018x}", off,
            want, gen, got);
      }
    }
  }
}

bool Verifier::Collides(const Span& span) const {
  for (const Slot& s : slots_) {
    if (s.busy && Overlaps(s.span, span)) return true;
  }
  return false;
}

Status Verifier::Submit(Slot& s) {
  const size_t len = s.span.units * unit_;
  const uint64_t off = s.span.first * unit_;
  if (s.write) {
    Fill(s);
  } else {
    // A read that completes without moving data must not pass on what the
    // slot held before.
    std::memset(s.buf, 0xa5, len);
  }
  s.busy = true;
  Slot* slot = &s;
  auto cb = [this, slot](const Status& st) {
    std::lock_guard<std::mutex> lock(mu_);
    done_.emplace_back(slot, st);
    cv_.notify_one();
  };
  Result<aio::Handle> h =
      s.write ? engine_->Write(file_, s.buf, len, off, std::move(cb))
              : engine_->Read(file_, s.buf, len, off, std::move(cb));
  if (!h.ok()) s.busy = false;
  return h.ok() ? Status::Ok() : h.status();
}

Status Verifier::Complete(Slot& s) {
  const uint64_t bytes = s.span.units * unit_;
  if (s.write) {
    std::fill_n(gens_.begin() + s.span.first, s.span.units, s.gen);
    ++result_.writes;
    result_.bytes_written += bytes;
  } else {
    Check(s);
    ++result_.reads;
    result_.bytes_read += bytes;
  }
  s.busy = false;
  return Status::Ok();
}

Status Verifier::WaitOne() {
  std::pair<Slot*, Status> item;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !done_.empty(); });
    item = std::move(done_.front());
    done_.pop_front();
  }
  if (!item.second.ok()) {
    item.first->busy = false;
    return item.second;
  }
  return Complete(*item.first);
}

Slot* Verifier::FreeSlot() {
  for (Slot& s : slots_) {
    if (!s.busy) return &s;
  }
  return nullptr;
}

void Verifier::Report(const VerifyProgressFn& progress, VerifyPhase phase,
                      uint64_t done, uint64_t total) {
  const uint64_t now = NowNs();
  if (!progress || now - last_report_ns_ < 500'000'000) return;
  last_report_ns_ = now;
  progress(phase, done, total);
}

Status Verifier::Drain() {
  while (std::any_of(slots_.begin(), slots_.end(),
                     [](const Slot& s) { return s.busy; })) {
    STRATA_RETURN_IF_ERROR(WaitOne());
  }
  return Status::Ok();
}

// Covers the whole file in max_bytes requests: generation 1 on the way in,
// a full check on the way out.
Status Verifier::Sequential(bool write, const VerifyProgressFn& progress) {
  const uint64_t per_op = o_.max_bytes / unit_;
  const VerifyPhase phase =
      write ? VerifyPhase::kWrite : VerifyPhase::kReadBack;
  for (uint64_t next = 0; next < gens_.size();) {
    if (Cancelled()) return Status::Cancelled("interrupted");
    Slot* s = FreeSlot();
    if (s == nullptr) {
      STRATA_RETURN_IF_ERROR(WaitOne());
      continue;
    }
    s->span = {next, std::min<uint64_t>(per_op, gens_.size() - next)};
    s->write = write;
    s->gen = 1;
    next += s->span.units;
    STRATA_RETURN_IF_ERROR(Submit(*s));
    Report(progress, phase, next * unit_, gens_.size() * unit_);
  }
  return Drain();
}

Status Verifier::Random(const VerifyProgressFn& progress) {
  const uint64_t max_units = std::max<uint64_t>(
      1, std::min<uint64_t>(o_.max_bytes / unit_, gens_.size()));
  for (uint64_t issued = 0; issued < o_.ops; ++issued) {
    // Drawn before anything waits, so that the operations are the seed's
    // alone, whatever completes when.
    Span span;
    span.units = 1 + rng_() % max_units;
    span.first = rng_() % (gens_.size() - span.units + 1);
    const bool write = rng_() % 2 == 0;
    Slot* s = nullptr;
    while ((s = FreeSlot()) == nullptr || Collides(span)) {
      if (Cancelled()) return Status::Cancelled("interrupted");
      STRATA_RETURN_IF_ERROR(WaitOne());
    }
    if (Cancelled()) return Status::Cancelled("interrupted");
    s->span = span;
    s->write = write;
    if (s->write) s->gen = ++next_gen_;
    STRATA_RETURN_IF_ERROR(Submit(*s));
    Report(progress, VerifyPhase::kRandom, issued + 1, o_.ops);
  }
  return Drain();
}

Status Verifier::Run(char* buffers, const VerifyProgressFn& progress) {
  slots_.resize(static_cast<size_t>(o_.qd) * o_.threads);
  for (Slot& s : slots_) {
    s.buf = buffers;
    buffers += o_.max_bytes;
  }
  STRATA_RETURN_IF_ERROR(Sequential(true, progress));
  STRATA_RETURN_IF_ERROR(Random(progress));
  return Sequential(false, progress);
}

}  // namespace

uint64_t PatternWord(uint64_t offset, uint32_t gen, uint64_t seed) {
  return Mix64(offset ^ Mix64(seed + gen));
}

Result<VerifyResult> RunVerify(const Target& target, uint64_t file_size,
                               const VerifyOptions& options, void* buffers,
                               size_t buffer_bytes,
                               const VerifyProgressFn& progress) {
  STRATA_ASSIGN_OR_RETURN(auto session,
                          OpenSession(target, options.threads, options.qd,
                                      options.block_size, file_size));
  aio::Engine* engine = session.engine.get();
  aio::File* file = session.files[0];
  const uint64_t unit = std::max<uint64_t>(
      512, std::max(file->offset_align(), file->mem_align()));
  if (options.max_bytes < unit || options.max_bytes % unit != 0) {
    return Status::InvalidArgument(
        fmt::format("--verify request size {} must be a multiple "
                    "of the file's alignment {}",
                    options.max_bytes, unit));
  }
  const size_t need = options.max_bytes * options.qd * options.threads;
  STRATA_CHECK(buffer_bytes >= need);
  STRATA_RETURN_IF_ERROR(engine->RegisterBuffer(buffers, need));

  Verifier v(options, engine, file, target.cancel, unit, file_size / unit);
  const uint64_t start = NowNs();
  const Status st = v.Run(static_cast<char*>(buffers), progress);
  Status wait = engine->WaitAll();
  (void)engine->UnregisterBuffer(buffers);
  if (!st.ok()) return st;
  if (!wait.ok()) return wait;
  v.result().seconds = (NowNs() - start) / 1e9;
  return v.result();
}

}  // namespace strata::bench
