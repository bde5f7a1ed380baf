// The residency manager: which tiers hold a valid copy of every chunk, and
// the moves that change it. This is the store's state machine; the engine
// wires it to the trace, the plan and the executor.
//
// Model
// - Every chunk has a home tier, allocated at registration and never
//   evicted, and may have cached copies in the tiers above it. A chunk that
//   was never written, or whose bytes were discarded (Note [Discarded
//   bytes]), reads as zeros without any I/O.
// - All valid copies of a chunk hold the same bytes. A write fetch makes the
//   fetched copy the only valid one. A copy may be dropped when another valid
//   copy exists; otherwise it is first written one tier toward its home.
//   So nothing is lost, and a failed write leaves the copy above valid.
// - Every transfer records the chunk's version when it starts and only
//   validates its destination if no write fetch intervened.
// - Pins (Fetch) keep a copy in place; readers (a transfer in flight from
//   it) do too, and a write fetch waits for them to finish. Each fetch is
//   one hold with its own Pin token, released on its own. Each copy's
//   state and its transitions: Note [Copy states] below.
// - A write fetch's copy changes until its release, so no copy is made from
//   it meanwhile: demand fetches of the chunk at other tiers wait for the
//   release, prefetches skip it (Note [Waits the caller could end]).
// - A read view keeps the bytes it was given: Note [Retired copies].
//
// Note [Eviction order]
// An allocation that does not fit drops copies at that tier, cheapest
// first: invalid copies, then the copy whose group's next use in the trace
// is furthest away (Belady), or the least recently used one when no trace
// is being followed. A prefetch for trace position q may only drop copies
// whose next use comes after q, so speculation never evicts data needed
// sooner than what it brings in; when nothing qualifies the prefetch is
// abandoned (counted, not an error). A caller's prefetch (Engine::Prefetch)
// may drop any copy but those of its own group (it pins nothing, so it
// would drop what it just read), and is abandoned when none can go once
// no copy is in flight. A demand fetch waits while copies at the tier are
// in flight or fenced, and fails only when no copy there can go: its
// error then says what stays (homes, copies fetched by views). A
// fetch places its chunks largest first, so that its own small chunks do
// not split the room a large one needs; and when its own first chunks,
// placed into holes between copies that were evicted later, split that
// room, it drops them and places them all again, while prefetches
// allocate nothing at that tier (they would land in the middle of it
// again); if that fails too, once more after every other unpinned copy
// at the tier went (once none is in flight), into a room in one piece. Memory
// held for good (homes at registration, the optimizer's buffers) is allocated
// only once every unpinned cached copy at the tier has gone: best fit then puts
// it at the low end, beside the earlier homes, and the room for copies
// that come and go stays one range. So with nothing else pinned, a fetch
// that registration admitted finds its room.
//
// Notes [Retired copies], [Waits the caller could end] and [Fences] are
// in residency_holds.cc, Note [Speculative writes] in
// residency_speculation.cc, Note [Discarded bytes] in residency_moves.cc,
// Note [Unchecked host copies] in residency_checks.cc.
//
// Thread safety: one mutex guards all state; transfers run without it.
#ifndef STRATA_SRC_STORE_RESIDENCY_H_
#define STRATA_SRC_STORE_RESIDENCY_H_

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/enum_array.h"
#include "src/sched/trace.h"
#include "src/store/layout.h"
#include "src/store/pin_owner.h"
#include "src/tier/device.h"
#include "src/tier/nvme_store.h"
#include "src/tier/pinned_pool.h"
#include "src/transport/mover.h"

namespace strata::store {

// Testing hook, for crash tests: EndSpeculation calls it after each chunk
// it settles. Null (the default) for none; set it before any step runs.
using SpeculationHook = void (*)();
void SetSpeculationHookForTesting(SpeculationHook hook);

class Residency {
 public:
  // `nvme` may be null (no NVMe tier). The tiers must outlive this object.
  Residency(tier::Device* device, tier::PinnedPool* host, tier::NvmeStore* nvme,
            transport::Mover* mover);
  ~Residency();

  // Note [Updates below the device] (residency_holds.cc): called, without
  // the residency's lock, after the release of a write hold below the
  // device whose written `roles` the trace fetches to the device, first at
  // trace `position`. Setting it (null: none) waits for a call in progress.
  using RefetchHook =
      std::function<void(int group, RoleMask roles, int position)>;
  void SetRefetchHook(RefetchHook hook);
  // The chunk of `role` reads as zeros: never written, or its bytes
  // discarded (or restored to never written).
  bool Blank(int group, Role role) const;

  // Allocates the group's home copies and checks that fetching it can ever
  // fit; on failure nothing is registered.
  Result<int> AddGroup(GroupLayout layout);
  int group_count() const;
  const GroupLayout& layout(int group) const;
  // Whether GroupBytes counts the chunks homed at the tier it is asked
  // about, or only those a fetch would cache there.
  enum class Homed { kIncluded, kExcluded };
  // Bytes the group's chunks in `roles` take at `tier` (size-class rounded
  // for the host).
  uint64_t GroupBytes(int group, Tier tier, RoleMask roles, Homed homed) const;
  uint64_t NvmeHomedBytes(int group, RoleMask roles) const;
  // Bytes of the device or host budget beside every home there and the
  // largest fetch of any one group (CheckFits): what a caller may take
  // from the tier's allocator for good without starving a fetch.
  uint64_t SpareBytes(Tier tier) const;

  // Trace bookkeeping, under the residency lock because eviction reads it.
  void BeginStep();
  // Returns true when a new trace was adopted; `diverged` gets the log line
  // when this step left the trace.
  bool EndStep(std::string* diverged);
  sched::Trace TraceSnapshot() const;

  // Note [Unchecked host copies] (residency_checks.cc). The host copies
  // of the group's chunks in `roles` read from NVMe are left for the
  // fetch that names them in Access::checked to verify, in its own pass.
  void CheckInPass(int group, RoleMask roles);
  // What such a fetch is handed for a chunk: the digest the bytes must
  // match (null: verified already) and the extent they were read from.
  struct Unchecked {
    std::shared_ptr<const tier::Digest> digest;
    tier::Extent extent;
  };
  // A pass found segment `bad` of the group's `role` chunk, read as
  // `read`, hashing to `got`: counted as the store counts a read that
  // fails, and returned as its kDataLoss, naming the chunk.
  Status Mismatch(int group, Role role, const Unchecked& read,
                  const tier::Segment& bad, uint64_t got) const;
  // The bytes of the chunks write hold `hold` writes are lost (its pass
  // found corrupt bytes part-way through): every copy goes stale, and
  // every later fetch of them fails with `why` until a fetch overwrites
  // them (FetchOptions::discard) or EndSpeculation restores old bytes.
  void MarkLost(uint64_t hold, const Status& why);

  // What a demand fetch returns: its trace position (-1 when not following
  // a trace, or when FetchOptions::record is false: the fetch is then not
  // part of the trace) and the pin that releases exactly this fetch.
  struct Fetched {
    int position = -1;
    Pin pin;
    // The fetched chunk of each role (null for a role not fetched): where
    // the views point, valid while `pin` is held.
    RoleArray<char*> base;
    uint64_t hold = 0;  // names the hold for AttachDigest
    // The roles of Access::checked whose bytes the caller must verify
    // (Note [Unchecked host copies] in residency_checks.cc).
    RoleArray<Unchecked> unchecked;
  };
  // Demand fetch (Engine::Fetch): validates and pins the group's chunks in
  // `opt.roles` at `tier`.
  Result<Fetched> Fetch(int group, Tier tier, const FetchOptions& opt);
  // How one fetch uses each role it holds: reads it, updates it (a write
  // fetch's), or overwrites every byte (FetchOptions::discard). The
  // optimizer pipeline holds a step's working set (its gradients and
  // state) as one fetch with several of these, so that the set is placed
  // together (Note [Eviction order]): two fetches in turn could split the
  // room that fits both.
  struct Access {
    RoleMask read = 0;
    RoleMask update = 0;
    RoleMask overwrite = 0;
    // Of these, the roles whose unchecked host copies the caller verifies
    // itself (CheckInPass): handed over in Fetched::unchecked.
    RoleMask checked = 0;
    RoleMask all() const { return read | update | overwrite; }
    RoleMask written() const { return update | overwrite; }
  };
  // An agent's fetch to the host (not recorded in the trace); with
  // `speculative`, the updated roles keep their old bytes (Note
  // [Speculative writes]).
  Result<Fetched> FetchToHost(int group, const Access& access,
                              bool speculative);
  // The digest of what write hold `hold` wrote to its `role` chunk, before
  // its release: a write-down of those bytes to NVMe records it instead of
  // hashing them (Note [Checksums in the optimizer's pass] in
  // src/optim/step_digest.h); void once another write fetch began.
  void AttachDigest(uint64_t hold, Role role,
                    std::shared_ptr<const tier::Digest> digest);
  // Undoes hold `pin` (Pin::Release); its copies stay in use until
  // `after` completes (Note [Fences]). kFailedPrecondition for a hold that
  // is not outstanding, kInvalidArgument for a fence the device cannot use
  // (the hold then stays).
  Status Release(uint64_t pin, const Fence& after);
  // Background fetch for trace position `position` (-1: a caller's
  // explicit prefetch, which may evict like a demand fetch, except its own
  // group's copies). Pins nothing (Note [Eviction order]).
  Status Prefetch(int group, Tier tier, RoleMask roles, int position);
  // Drops the group's cached copies of `roles` at `tier` (Engine::Evict).
  Status Evict(int group, Tier tier, RoleMask roles = kAllRoles);
  // Ends the bytes of the group's chunks in `roles` (Note [Discarded
  // bytes]). kFailedPrecondition while one of them is fetched for writing
  // or holds speculative bytes.
  Status Discard(int group, RoleMask roles);
  // Evicts every unpinned cached copy at `tier` (device or host), before a
  // caller takes memory for good from the tier's allocator (the
  // optimizer's buffers; Note [Eviction order]). Returns a failed
  // write-back.
  Status EvictCached(Tier tier);

  // Note [Speculative writes]. AddSpares gives the group's chunks in
  // `roles` homed on NVMe their second extent (kResourceExhausted when the
  // NVMe budget cannot hold them; none is kept then). FetchSpeculative is
  // a write fetch of `roles` to the host that keeps the old bytes of those
  // chunks (FetchToHost with `speculative`); EndSpeculation ends it on
  // every chunk of the group. kRestore needs the group's speculative
  // chunks unpinned above NVMe and waits for moves in flight.
  Status AddSpares(int group, RoleMask roles);
  void DropSpares(int group);  // of chunks not speculative now
  enum class Outcome { kKeep, kRestore };
  Status EndSpeculation(int group, Outcome outcome);
  // Bumped by every write fetch of the chunk (and by a restore or a
  // Discard).
  uint64_t Version(int group, Role role) const;
  // Whether the last writes of the group's `a` and `b` chunks were one
  // caller's write fetch of both (FetchOptions::record; not the engine's
  // agents, a Load or a step): Note [Masters from compute copies].
  bool WrittenTogether(int group, Role a, Role b) const;
  // The group's chunks count as written by no caller fetch from now on
  // (their contents were checked: Note [Masters from compute copies]).
  void ForgetCallerWrites(int group);

  // The address of `tensor` in `role` at `tier`; valid while pinned there.
  void* Address(int group, Role role, Tier tier, uint64_t offset) const;
  // The fetch, prefetch and eviction counters of EngineStats; the tier,
  // byte and trace fields are left for the engine to fill.
  EngineStats counters() const;
  // For checkpoints and close: the first group with an unreleased Fetch
  // (-1 when none), and whether a step is open.
  int FirstPinnedGroup() const;
  bool in_step() const;

 private:
  // Note [Copy states]
  // One copy of a chunk at one tier is in exactly one state, changed only by
  // the moves in residency_moves.cc (and by AllocateHomes):
  //
  //   state      its memory                 transitions
  //   kAbsent    none                       -> kStale     Allocate
  //   kStale     allocated, bytes invalid   -> kFilling   Fill starts
  //                                         -> kAbsent    FreeCopy
  //   kFilling   being written by a fill    -> kValid     the fill succeeded
  //                                                       and no write fetch
  //                                                       intervened
  //                                         -> kStale     otherwise
  //   kValid     valid, at rest             -> kFlushing  Drop writes it one
  //                                                       tier toward home
  //                                         -> kStale     Invalidate (a write
  //                                                       fetch elsewhere, or
  //                                                       a Discard)
  //                                         -> kAbsent    FreeCopy
  //   kFlushing  valid, being copied down   -> kAbsent    the write-down
  //                                                       succeeded
  //                                         -> kValid     it failed (kStale
  //                                                       if a write fetch
  //                                                       intervened)
  //
  // Beside the state: `pins` counts unreleased fetches and `readers` the
  // fills copying from the copy; a copy with either is not dropped, and a
  // write fetch waits for its readers. Pins sit on kValid copies, with two
  // exceptions. A read on the caller's stream may pin a kFilling copy to
  // the device, whose fill keeps its event in `landing` meanwhile
  // (PinLanding); the fill then ends as above. A pinned copy made kStale by
  // a write elsewhere keeps its old bytes for the view that holds it:
  // nothing fills it (or writes down into it); a move that needs the tier
  // retires it (Note [Retired copies]).
  // `fences` counts the releases whose device work has not yet run (Note
  // [Fences]); until it is 0 the copy is treated like a busy one. Its
  // state is unchanged meanwhile. `prefetched` marks a kValid copy that a
  // prefetch made and no fetch used yet; `unchecked` a kValid host copy
  // read from NVMe whose bytes no one verified yet (Note [Unchecked host
  // copies]). A home copy is never kAbsent.
  // Every write fetch bumps the chunk's version, and a transfer validates
  // its destination only if the version it started with still holds
  // (a Discard bumps it too). A `blank` chunk was never written, or its
  // bytes were discarded: it reads as zeros.
  enum class CopyState { kAbsent, kStale, kFilling, kValid, kFlushing };
  struct Copy {
    CopyState state = CopyState::kAbsent;
    void* ptr = nullptr;
    tier::Extent extent;
    int pins = 0;
    int readers = 0;
    int fences = 0;       // Note [Fences] not yet complete
    tier::Event landing;  // while kFilling from the host to the device
    bool prefetched = false;
    Unchecked unchecked;
    uint64_t serial = 0;  // names the memory for holds (Note [Retired
                          // copies]); set by each allocation
    uint64_t last_use = 0;

    bool allocated() const { return state != CopyState::kAbsent; }
    bool busy() const {
      return state == CopyState::kFilling || state == CopyState::kFlushing;
    }
    bool fenced() const { return fences > 0; }
    // Valid and at rest: may be pinned, read or used as a source.
    bool usable() const { return state == CopyState::kValid; }
    // Holds the chunk's current bytes, moving or not.
    bool holds_data() const {
      return state == CopyState::kValid || state == CopyState::kFlushing;
    }
  };
  struct Chunk {
    int group = -1;
    Role role = Role::kCompute;
    Tier home = Tier::kHost;
    uint64_t bytes = 0;
    int writers = 0;  // unreleased write fetches
    uint64_t version = 0;
    bool blank = true;  // reads as zeros: never written, or discarded
    TierArray<Copy> copy;
    // Note [Speculative writes]: the second NVMe extent (invalid: none);
    // while `speculative`, it holds the chunk's old bytes (none when
    // `old_blank`).
    tier::Extent spare;
    bool speculative = false;
    bool old_blank = false;
    // The caller's write fetch that wrote `caller_version` (0: none).
    uint64_t caller_fetch = 0;
    uint64_t caller_version = 0;
    // The bytes' digest, while `version` is `digest_version` (AttachDigest).
    std::shared_ptr<const tier::Digest> digest;
    uint64_t digest_version = 0;
    std::string lost;  // MarkLost's message (empty: not lost)
    // A write hold verifies the host copy's bytes in its pass (Note
    // [Unchecked host copies]): other host fetches wait for its release.
    bool checking = false;
  };
  // Why a copy is being made valid; it decides what the move may evict
  // (Note [Eviction order]), whether it waits or gives up, and what the
  // statistics count.
  struct Reason {
    enum class Kind {
      kDemand,    // Fetch
      kHop,       // the host copy a demand fetch to the device passes through
      kPrefetch,  // Engine::Prefetch, a caller's explicit prefetch
      kPlanned,   // a prefetch of the plan for trace `position`
      kDiscard,   // a write fetch that overwrites the chunk: nothing is
                  // read, only the padding between tensors is zeroed
    };
    Kind kind = Kind::kDemand;
    int position = -1;  // for kPlanned

    static Reason Demand() { return {Kind::kDemand, -1}; }
    static Reason For(bool discard) {
      return {discard ? Kind::kDiscard : Kind::kDemand, -1};
    }
    static Reason Planned(int position) { return {Kind::kPlanned, position}; }
    // Demands wait for writers and for room; prefetches give up.
    bool demand() const {
      return kind == Kind::kDemand || kind == Kind::kHop ||
             kind == Kind::kDiscard;
    }
    bool prefetch() const {
      return kind == Kind::kPrefetch || kind == Kind::kPlanned;
    }
    bool planned() const { return kind == Kind::kPlanned; }
  };
  // One unreleased fetch: what its Pin releases.
  struct Hold {
    int group = -1;
    Tier tier = Tier::kHost;
    RoleMask written = 0;  // the roles it writes (Access::written)
    std::vector<int> chunks;
    std::vector<uint64_t> serials;   // of the copy pinned, per chunk
    std::vector<uint64_t> versions;  // of a written chunk, after its write
    std::thread::id thread;          // that fetched it
  };
  // The bytes a group's chunks take at their homes, and the bytes a fetch
  // of the whole group needs beside them (at the device, its device roles;
  // at the host, everything homed below it), per tier.
  struct Footprint {
    TierArray<uint64_t> homed;
    TierArray<uint64_t> fetched;
  };
  struct Group {
    GroupLayout layout;
    Footprint footprint;
    std::vector<int> chunks;       // ids, in layout.chunks order
    RoleMask checked_in_pass = 0;  // CheckInPass
  };
  using Lock = std::unique_lock<std::mutex>;

  Footprint FootprintOf(const GroupLayout& layout) const;
  Status CheckFits(const GroupLayout& layout) const;
  // CheckFits' errors: the group alone does not fit beside the homes, or
  // it leaves group `other` no room to be fetched.
  Status TooLarge(const GroupLayout& layout, Tier t, uint64_t need,
                  uint64_t budget) const;
  Status Starves(const GroupLayout& layout, const std::string& other, Tier t,
                 uint64_t homes, uint64_t fetch, uint64_t budget) const;
  Status CheckFetch(int group, Tier tier, const FetchOptions& opt) const;
  // Fetch and FetchToHost: `opt` for its roles, trace and stream, `access`
  // for what it does with each role.
  Result<Fetched> FetchFor(int group, Tier tier, const FetchOptions& opt,
                           const Access& access, bool speculative);
  // FetchFor's part for the roles it writes: writers counted, transfers
  // reading them waited for, old bytes kept (`speculative`), other copies
  // invalidated. On failure the hold is undone.
  Status BeginWrites(Lock& lk, Hold& hold, const Access& access,
                     bool speculative);
  bool Writes(const Hold& hold, int id) const {
    return (hold.written & RoleBit(chunks_[id].role)) != 0;
  }
  // A speculative fetch's part: the chunks of `hold` with a spare and their
  // only valid copy above NVMe are written down; then, each chunk about to
  // be written keeps its old bytes in the extent that holds them.
  Status WriteDownForSpeculation(Lock& lk, const Hold& hold);
  void StartSpeculation(Chunk& c);
  Status RestoreOldBytes(Lock& lk, int id);
  // What one fetch found, counted once per chunk (Count) whether it is
  // placed at the first try or again after DropUnpinned.
  struct FetchTally {
    uint64_t hits = 0;
    uint64_t prefetch_hits = 0;
    uint64_t late = 0;
    double stall = 0;  // summed over the tries
    void Restart() { hits = prefetch_hits = late = 0; }
  };
  Status PinAll(Lock& lk, std::vector<int>& ids, const FetchOptions& opt,
                const Access& access, Hold& hold, FetchTally& tally);
  void Count(size_t chunks, const FetchTally& tally);
  // The hold on a write view of chunk `id` that keeps a demand from the
  // calling thread waiting, when only that thread could release it (Note
  // [Waits the caller could end]); an error naming it, else OK.
  Status CheckSelfWait(const Chunk& c, int id, Tier tier) const;
  Status DropUnpinned(Lock& lk, const std::vector<int>& ids, Tier tier);
  Status MakeRoomInOnePiece(Lock& lk, const std::vector<int>& ids, Tier tier);
  // One chunk of a fetch: `write` for a written role, `discard` for an
  // overwritten one, `stream` as FetchOptions::stream.
  struct ChunkAccess {
    bool write = false;
    bool discard = false;
    bool checked = false;  // Access::checked
    void* stream = nullptr;
  };
  Status FetchChunk(Lock& lk, int id, Tier tier, const ChunkAccess& how,
                    FetchTally& tally);
  // Note [Unchecked host copies]: verifies the host copy of chunk `id`
  // (without the lock meanwhile); on a mismatch it goes stale. Returns
  // with the lock held.
  Status CheckHost(Lock& lk, int id);
  // FetchFor's part for Access::checked: the unchecked host copies of
  // `checked` in `hold` handed over to `out`; with `back`, handed back to
  // the copies still valid (the fetch failed after all).
  void HandOverChecks(const Hold& hold, RoleMask checked,
                      RoleArray<Unchecked>& out, bool back);
  // kDataLoss naming a chunk that MarkLost marked, else OK.
  Status CheckNotLost(const Chunk& c) const;
  // FetchChunk's way for a read on the caller's stream: pins a copy still
  // landing on the device and makes the stream wait for it. False when the
  // copy is not landing.
  Result<bool> PinLanding(int id, Tier tier, const ChunkAccess& how);
  void Unpin(const Hold& hold);
  // What a released write hold leaves stale on the device that the trace
  // fetches there (Note [Updates below the device]): the roles (0: none)
  // and the position of their first fetch.
  struct Refetch {
    RoleMask roles = 0;
    int position = -1;
  };
  Refetch RefetchOf(const Hold& hold) const;
  // The copy at `tier` may not be filled or written into: a view holds its
  // old bytes. It is retired instead (Note [Retired copies]).
  static bool HeldStale(const Copy& copy) {
    return copy.state == CopyState::kStale && copy.pins > 0;
  }
  // Retires the held stale copy of chunk `id` at `tier` and gives the
  // chunk a fresh one there (Note [Retired copies]). Returns with the lock
  // held; on failure a home copy is back in place.
  Status Retire(Lock& lk, int id, Tier tier, Reason why);
  // Retire's first half: the held stale copy leaves the chunk, whose copy
  // at `tier` is then absent.
  void Detach(int id, Tier tier);
  // The copy of chunk `id` at `tier` with `serial`: the chunk's own, or a
  // retired one.
  Copy& CopyBySerial(int id, Tier tier, uint64_t serial);
  // After a pin or fence of a retired copy ended: frees it once nothing
  // holds it (or gives it back to its chunk as the home copy).
  void FreeIfUnheld(uint64_t serial);
  Status AllocateHomes(Group& group, std::vector<int>& ids);
  std::vector<int> ChunksOf(int group, RoleMask roles) const;
  Status Ensure(Lock& lk, int id, Tier tier, Reason why, bool* hit);
  // The tier to fill chunk `c` at `tier` from (`tier` itself: zeros).
  Tier SourceOf(const Chunk& c, Tier tier) const;
  Status Fill(Lock& lk, int id, Tier tier, Tier from, Reason why);
  Status Transfer(Lock& lk, int id, Tier tier, Tier from, Reason why);
  // Zeros the bytes of chunk `c` at `to` that no tensor covers.
  Status ZeroPadding(const Chunk& c, const transport::Place& to);
  Status Allocate(Lock& lk, int id, Tier tier, Reason why);
  Status TryAllocate(Chunk& c, Tier tier);
  std::string Occupants(Tier tier) const;
  // The copy at `tier` to evict for chunk `requester` (-1: none), or -1.
  int PickVictim(Tier tier, int requester, Reason why) const;
  uint64_t FreeBytes(Tier tier) const;  // device or host
  // Dropping the copy at `tier` needs a write-down first: it holds the only
  // valid bytes.
  bool MustWriteDown(const Chunk& c, Tier tier) const;
  Status Drop(Lock& lk, int id, Tier tier);
  Status EvictCached(Lock& lk, Tier tier);
  Status WriteDown(Lock& lk, int id, Tier tier);
  void FreeCopy(Chunk& c, Tier tier);
  void FreeMemory(Tier tier, const Copy& copy);
  // Every copy of `c` but the one at `keep` goes stale (`keep` null: all),
  // and the version moves on.
  void Invalidate(Chunk& c, const Tier* keep);
  bool OtherValid(const Chunk& c, Tier tier) const;
  bool AnyBusy(Tier tier) const;  // or fenced
  // The fence watcher's loop (Note [Fences]).
  void WatchFences();
  transport::Place PlaceOf(const Chunk& c, Tier tier) const;
  static std::string TierLabel(Tier t) { return std::string(TierName(t)); }
  std::string Describe(const Chunk& c) const;

  // Fixed after construction (the tiers lock for themselves).
  tier::Device* const device_;
  tier::PinnedPool* const host_;
  tier::NvmeStore* const nvme_;
  transport::Mover* const mover_;
  const std::shared_ptr<internal::PinOwner> pin_owner_;

  // Guarded by mu_. A transfer runs without it and marks its copies busy
  // (or counts a reader) instead; changed_ wakes every waiter on any change.
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Group> groups_;  // deques: references survive growth
  std::deque<Chunk> chunks_;
  TierArray<uint64_t> homed_;       // Footprint::homed over every group
  std::map<uint64_t, Hold> holds_;  // by pin id
  uint64_t next_pin_ = 1;
  uint64_t caller_writes_ = 0;  // the callers' write fetches so far
  // Fences not yet complete, oldest first, and the copies each keeps in use.
  struct Fenced {
    tier::Event event;
    Tier tier = Tier::kHost;
    std::vector<int> chunks;
    std::vector<uint64_t> serials;
  };
  std::deque<Fenced> fenced_;
  // Fetches placing their chunks again into a room in one piece, per tier:
  // prefetches allocate nothing there meanwhile (Note [Eviction order]).
  TierArray<int> placing_;
  // Note [Retired copies], by serial.
  struct RetiredCopy {
    int chunk = -1;
    Tier tier = Tier::kHost;
    Copy copy;
  };
  std::map<uint64_t, RetiredCopy> retired_;
  uint64_t next_serial_ = 1;
  std::condition_variable fence_added_;
  bool stopping_ = false;

  // Guarded by hook_mu_, which is held while the hook runs (and taken
  // after mu_ is released, never before it).
  std::mutex hook_mu_;
  RefetchHook refetch_hook_;

  // Last: starts once everything above exists; joined by the destructor.
  std::thread watcher_;
  sched::Trace trace_;
  int position_ = -1;
  uint64_t reported_invalidations_ = 0;
  uint64_t clock_ = 0;
  EngineStats counters_;
};

}  // namespace strata::store

#endif  // STRATA_SRC_STORE_RESIDENCY_H_
