"""strata.torch across ranks: ZeRO data parallelism over torch.distributed
(NCCL on GPUs, gloo on the host-emulated device). The C++ core stays one
process; every collective is a torch one, issued here.

Note [Partitions]
At world size N > 1 a group's parameters are laid out flat (Flat, in
flat.py), in the group's order, each starting at a multiple of ALIGN
elements, and the flat vector is padded to N * S elements, S (the
shard) a multiple of ALIGN: the layout depends only on the group's
shapes, so a checkpoint can be cut again for another N. Rank r
registers elements [r * S, (r + 1) * S) as the group's one tensor SHARD,
with every role (compute copy, master, optimizer state), in its own
strata engine with the config's budgets (per rank) and its own swap
subdirectory rank-<r>. The padding is zeros, gets zero gradients and
stays zero.

- Forward: a group's fetch all-gathers every rank's compute shard into a
  flat buffer (all_gather_into_tensor) and points the parameters at
  their ranges of it; the buffer goes when the group is released (stage
  3) or is kept until the next optimizer step changes the shards (stages
  1 and 2, whose compute copies stay whole on every rank).
- Backward: the parameters' .grad are ranges of a zeroed flat gradient
  buffer; when the group is due (Note [The order of the reductions] in
  handoff.py) its gradients are reduce-scattered,
  averaged over the ranks as DeepSpeed does, into this rank's strata
  gradient buffer (stage 1 all-reduces and keeps its shard) and handed to
  the CPU optimizer, which steps the shard.
- The step: the global norm and the overflow flag come from one
  all-gather of every rank's Optimizer.local_checks(), so every rank
  clips and skips alike (finish_step(global_checks)).
strata's memory never enters a collective: the shard is copied into its
slot of the flat buffer, which is gathered in place, and gradients are
reduce-scattered in place and then copied into strata's buffer, because
a backend may hold its tensors after the call returns (gloo's worker
thread does), which would keep strata's views pinned past a release.
Collectives are issued in module order in forward and in autograd's order
in backward, the same on every rank.

Note [Gathering ahead]
A fetch's all-gather stalls the rank for the whole collective. So when
a unit starts its forward the hooks fetch the shards of the unit that
followed it in the last step's forward and start their all-gathers
(async_op); when a unit's backward fetch runs they start the gathers of
the unit before it. The gathers run on
gloo's thread or NCCL's stream while the current unit computes, and the
next unit's fetch only waits for their end (Flat.gather). Every rank
issues the same gathers in the same order, since every rank runs the same
modules in the same order. A gather started ahead that no fetch took (the
pass went another way, or failed) is waited for and dropped at the end of
backward, on reset, and before the step changes the shards
(Flat.stepped): never used across a step. The cost: one more group's
gathered buffer at a time; and since the first step has no order to go
by, the second fetches in another order and the engine records its trace
again, once (its message says so).

Note [Reducing behind]
A group's gradients are due in backward when the rank is about to run
the units before it. Their reduction (gloo: an all-reduce, NCCL: a
reduce-scatter) is therefore started async and left running under the
next group's backward; the next group's hand-off (after issuing its own,
so that the copy and the wait for a strata buffer run under that), or
the end of backward, waits for it, copies this rank's part into a strata
gradient buffer and hands that to the CPU optimizer. The cost: two more
flat gradient buffers at a time (besides those of groups waiting to be
due), and the optimizer starts each group one hand-off later. On reset
a reduction in flight is abandoned (Note [Abandoned collectives]).

Note [Abandoned collectives]
A collective this rank stopped waiting for (Ctrl-C, the timeout, an
error) may still run on gloo's worker thread, blocked on a peer that
never comes. ProcessGroupGloo's destructor joins that thread, so the
process would hang at exit until the group's own timeout (30 minutes by
default), and the group's abort() and shutdown() do not end it (torch
2.11). strata therefore leaks one reference to the group: its destructor
never runs, the process exits at once with Python's status (130 after
Ctrl-C), and the group, unusable anyway, goes with the process. NCCL's
watchdog aborts its communicator instead: nothing is leaked there.
Either way the ranks' collectives are out of step from then on (the
others may have issued more, or fewer, and a later collective would pair
with an old one of the same size: wrong bytes, no error), so after a
wait given up, a collective that failed to issue or a pass that failed
on this rank, every collective fails naming the cause (Ranks.give_up),
and the group is leaked as above, since a collective may be in flight
that nothing waits for (Ctrl-C between its issue and its wait).

Note [Failing together]
A task of several collectives that every rank runs (the export, a
GatheredParameters write, a checkpoint's save) may fail on one rank
outside its collectives: a full disk under rank 0's export, an exception
in one rank's GatheredParameters body. The others would wait for it in
their next collective until strata.rank_timeout and then fail naming
only the wait. Such a task therefore ends with one small all-reduce of
every rank's outcome (Ranks.agree): a rank where it failed first runs the
rest of its collectives of the task, so that nobody waits for them; then
the ranks where it failed raise their own error, and the others a
StrataError naming those ranks and what was left undone, at once and
alike. A rank interrupted (Ctrl-C), or whose collectives are out of step,
gives up instead (Note [Abandoned collectives]); the others' wait ends
when it exits (torchrun stops every rank on Ctrl-C).

Note [Waiting for the other ranks]
On gloo, whose collectives block the host, every collective is issued
async and waited for by polling, so the wait returns to Python every few
milliseconds (Ctrl-C, and torchrun's SIGINT to every rank, stop it) and
ends after strata.rank_timeout seconds even under a process group made
with a longer timeout. On NCCL Work.wait() only queues the wait on the
current stream and returns; NCCL's own watchdog (the process group's
timeout, strata.rank_timeout when strata makes the group) ends a stuck
collective. A rank that exits or fails makes the others' collectives
fail (gloo and NCCL see the peer go); either way the error is a
StrataError naming the collective, the group and the cause, and the
engine recovers as from any error in a pass (Note [Recovery] in
engine.py): the job cannot go on, and the last checkpoint loads."""
from __future__ import annotations

import ctypes
import datetime
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar

import torch
import torch.distributed as dist

import strata
from strata._native import StrataError
from strata.torch.config import ConfigError

SHARD = "shard"
Fill = Callable[[torch.Tensor], Any]  # copies a shard into the tensor given
T = TypeVar("T")


def fill_from(view: strata.View, role: str = "compute") -> Fill:
    """The Fill that copies `view`'s shard of `role`."""
    return lambda mine: mine.copy_(
        torch.from_dlpack(view.export(SHARD, role)))


@dataclass
class Pending:
    """A collective issued and not waited for yet (Ranks.start)."""
    what: str
    work: Any  # torch's Work
    issued: float  # time.monotonic() at the issue


@dataclass
class CollectiveStats:
    """The collectives this rank took part in since the engine started
    (engine.collective_stats()). `bytes` counts what crossed this rank's
    link under ring algorithms (NCCL's; strata-plan's Note
    [Collectives]): (N-1)/N of an all-gathered or reduce-scattered
    buffer, twice that for an all-reduce. `seconds` is the wall time the
    host spent issuing and waiting for them (on NCCL the GPU's stream,
    not the host, waits for the transfer); `in_flight_seconds` runs from
    each one's issue to the end of its wait, so what it exceeds
    `seconds` by ran under the rank's compute (Note [Gathering ahead])."""
    count: int = 0
    bytes: int = 0
    seconds: float = 0.0
    in_flight_seconds: float = 0.0
    ahead: int = 0  # all-gathers started ahead of their fetch


@dataclass
class Ranks:
    """This process's place among the ranks (world 1: no collectives)."""
    rank: int = 0
    world: int = 1
    stage: int = 3
    group: Any = None  # the torch process group; None: the default one
    timeout: float = 300.0  # s: Note [Waiting for the other ranks]
    # Host-blocking collectives: Note [Waiting for the other ranks]. And
    # gloo's reduce_scatter_tensor runs only inside Work.wait(), which a
    # poll cannot end (torch 2.11): on gloo gradients are all-reduced.
    gloo: bool = False
    cuda: int = 0  # this process's GPU, where the device is CUDA
    stats: CollectiveStats = field(default_factory=CollectiveStats)
    leaked: bool = False  # Note [Abandoned collectives]
    broken: str = ""  # why the ranks are out of step (give_up): no more

    def sharded(self) -> bool:
        return self.world > 1

    def device(self) -> torch.device:
        """Where the collectives' own small tensors go: NCCL reduces on
        this process's GPU, gloo on the CPU."""
        return torch.device("cpu") if self.gloo else \
            torch.device("cuda", self.cuda)

    def run(self, what: str, issue: Callable[[], Any], moved: int = 0
            ) -> None:
        """Issues a collective (async) and waits for it: Note [Waiting
        for the other ranks]. `moved`: the bytes it puts through this
        rank's link (CollectiveStats)."""
        try:
            pending = self.start(what, issue, moved)
            self.finish(pending)
        except BaseException:  # Ctrl-C between the two included
            self.give_up(f"stopped waiting in {what}")
            raise

    def start(self, what: str, issue: Callable[[], Any], moved: int = 0
              ) -> Pending:
        """Issues a collective (async); finish() waits for it."""
        if self.broken:
            raise StrataError(9, "failed precondition", (
                f"strata.torch: rank {self.rank} of {self.world} "
                f"{self.broken}, so the ranks' collectives are out of step "
                f"and {what} cannot run; stop the job on every rank and "
                f"load the last checkpoint"))
        begin = time.monotonic()
        try:
            return Pending(what, issue(), begin)
        except BaseException as e:  # issued or not: the others may be
            self.give_up(f"failed to issue {what}")
            if isinstance(e, (RuntimeError, dist.DistError)):
                raise self._failed(what, e) from e
            raise
        finally:
            self.stats.count += 1
            self.stats.bytes += moved
            self.stats.seconds += time.monotonic() - begin

    def finish(self, pending: Pending) -> None:
        """Waits for a collective start() issued: Note [Waiting for the
        other ranks]."""
        begin = time.monotonic()
        try:
            self._wait(pending, begin)
        except BaseException as e:
            self.give_up(f"stopped waiting in {pending.what}")
            if isinstance(e, (RuntimeError, dist.DistError)):
                raise self._failed(pending.what, e) from e
            raise
        finally:
            end = time.monotonic()
            self.stats.seconds += end - begin
            self.stats.in_flight_seconds += end - pending.issued

    def _ring(self, flat: torch.Tensor) -> int:
        """Bytes a ring all-gather or reduce-scatter of `flat` moves
        through each rank's link."""
        return flat.numel() * flat.element_size() * (self.world - 1) \
            // self.world

    def abandon(self, pending: Pending) -> None:
        """Stops waiting for `pending`, which every rank issued (the ranks
        stay in step): Note [Abandoned collectives]."""
        if not pending.work.is_completed():
            self._leak()

    def give_up(self, why: str) -> None:
        """This rank left the ranks' sequence of collectives (`why`: what
        it did, after "rank r of N"): every later one fails naming it,
        and nothing in flight holds up the exit (Note [Abandoned
        collectives])."""
        self.broken = self.broken or why
        self._leak()

    def _leak(self) -> None:
        if self.gloo and not self.leaked:
            group = dist.group.WORLD if self.group is None else self.group
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))
            self.leaked = True

    def _wait(self, pending: Pending, begin: float) -> None:
        pause = 5e-5
        while self.gloo and not pending.work.is_completed():
            if time.monotonic() - begin > self.timeout:
                raise StrataError(9, "failed precondition", (
                    f"strata.torch: rank {self.rank} of {self.world} "
                    f"waited {self.timeout:g} s for the other ranks in "
                    f"{pending.what}; one of them is stuck or gone. Stop "
                    f"the job and load the last checkpoint "
                    f"(strata.rank_timeout sets the wait)"))
            time.sleep(pause)
            pause = min(2 * pause, 0.005)
        pending.work.wait()

    def _failed(self, what: str, e: BaseException) -> StrataError:
        return StrataError(6, "I/O error", (
            f"strata.torch: {what} failed on rank {self.rank} of "
            f"{self.world}: another rank failed or exited ({e}); the job "
            f"cannot go on: stop it and load the last checkpoint"))

    def all_gather(self, flat: torch.Tensor, fill: Fill, what: str
                   ) -> Pending:
        """Starts gathering every rank's shard into `flat`, in place;
        `fill` copies this rank's into its slot now (Note [Partitions]:
        strata's memory stays out of the collective)."""
        mine = flat.view(self.world, -1)[self.rank]
        try:
            fill(mine)
        except BaseException:  # the others issue it: out of step
            self.give_up(f"failed before {what}")
            raise
        return self.start(what, lambda: dist.all_gather_into_tensor(
            flat, mine, group=self.group, async_op=True), self._ring(flat))

    def gather(self, flat: torch.Tensor, fill: Fill, what: str) -> None:
        """all_gather, waited for as run() waits."""
        try:
            self.finish(self.all_gather(flat, fill, what))
        except BaseException:  # Ctrl-C between the two included
            self.give_up(f"stopped waiting in {what}")
            raise

    def reduce_scatter(self, flat: torch.Tensor, what: str
                       ) -> tuple[torch.Tensor, Pending]:
        """Starts averaging `flat` over the ranks; this rank's part of it,
        valid once finish() waited for the collective."""
        mine = flat.view(self.world, -1)[self.rank]
        if self.stage == 1 or self.gloo:
            return mine, self.start(what, lambda: dist.all_reduce(
                flat, op=dist.ReduceOp.AVG, group=self.group, async_op=True),
                2 * self._ring(flat))
        return mine, self.start(what, lambda: dist.reduce_scatter_tensor(
            mine, flat, op=dist.ReduceOp.AVG, group=self.group,
            async_op=True), self._ring(flat))

    def broadcast_changed(self, changed: dict[int, torch.Tensor],
                          shapes: list[tuple[torch.Size, torch.dtype]],
                          root: int) -> dict[int, torch.Tensor]:
        """Rank `root`'s `changed` (parameter index -> whole value, of the
        shape and dtype `shapes` gives), on every rank, on the CPU; `root`
        is a rank of the group."""
        device = self.device()
        flags = torch.zeros(len(shapes), dtype=torch.uint8, device=device)
        flags[list(changed)] = 1
        self._broadcast(flags, root, "the changed parameters' list")
        out = {}
        for index in flags.nonzero().flatten().tolist():
            shape, dtype = shapes[index]
            value = changed[index].to(device) if self.rank == root else \
                torch.empty(shape, dtype=dtype, device=device)
            self._broadcast(value, root, "a changed parameter")
            out[index] = value.cpu()
        return out

    def _broadcast(self, tensor: torch.Tensor, root: int, what: str
                   ) -> None:
        self.run(what, lambda: dist.broadcast(
            tensor, group=self.group, group_src=root, async_op=True),
            tensor.numel() * tensor.element_size())

    def together(self, what: str, body: Callable[[], T], undone: str,
                 drain: Callable[[], bool] = lambda: True) -> T:
        """Runs `body` (this rank's part of `what`) and agree()s on its
        outcome (`drain` as there): every rank raises if it failed on
        any."""
        try:
            result = body()
        except BaseException as error:
            self.agree(what, error, undone, drain)
            raise
        self.agree(what, None, undone)
        return result

    def agree(self, what: str, error: Optional[BaseException], undone: str,
              drain: Callable[[], bool] = lambda: True) -> None:
        """Note [Failing together]: every rank learns whether `what` failed
        on any. `error` is this rank's (the caller raises it), after
        `drain` ran the rest of its collectives of `what` (False: they
        stopped midway, this rank gives up); where it did not fail, a
        StrataError names the ranks where it did and says what was left
        `undone`."""
        if not self.sharded():
            return
        if error is None:
            failed = self._failed_ranks(what, False)
            if failed:
                raise StrataError(6, "I/O error", (
                    f"strata.torch: {what} failed on rank "
                    f"{', '.join(map(str, failed))} of {self.world} (its "
                    f"error says why), so {undone}"))
            return
        if not isinstance(error, Exception) or self.broken:
            self.give_up(f"was interrupted in {what}")
            return
        try:
            if not drain():
                self.give_up(f"failed in {what}")
                return
            self._failed_ranks(what, True)
        except Exception as e:  # the first error is the news
            self.give_up(f"failed in {what}")
            error.add_note(f"strata.torch: telling the other ranks failed "
                           f"too: {e}")

    def _failed_ranks(self, what: str, failed: bool) -> list[int]:
        flags = torch.zeros(self.world, dtype=torch.int32,
                            device=self.device())
        flags[self.rank] = int(failed)
        self.run(f"the outcome of {what}", lambda: dist.all_reduce(
            flags, group=self.group, async_op=True))
        return [r for r, f in enumerate(flags.tolist()) if f]

    def global_checks(self, local: strata.StepChecks, order: int
                      ) -> strata.StepChecks:
        """Every rank's checks: sum_squares added (in rank order, the
        same on every rank), overflow or-ed; `order`, the hash of this
        rank's reductions, must be every rank's (Note [The order of the
        reductions] in handoff.py)."""
        mine = torch.tensor([local.sum_squares, float(local.overflow),
                             float(order)], dtype=torch.float64,
                            device=self.device())
        flat = torch.empty(self.world * 3, dtype=torch.float64,
                           device=self.device())
        self.run("the step's gradient checks", lambda:
                 dist.all_gather_into_tensor(flat, mine, group=self.group,
                                             async_op=True))
        every = flat.view(self.world, 3).cpu()
        if not torch.equal(every[:, 2], every[:1, 2].expand(self.world)):
            raise StrataError(9, "failed precondition", (
                "strata.torch: the ranks reduced their groups' gradients in "
                "different orders in this step, so some were averaged with "
                "another group's: a module ran on some ranks only, or a "
                "different number of times, or its inputs needed a "
                "gradient on some ranks only (Note [The order of the "
                "reductions] in strata/torch/handoff.py). Nothing of the "
                "step stands; stop the job on every rank, make every rank "
                "run the same modules alike, and load the last "
                "checkpoint"))
        return strata.StepChecks(float(every[:, 0].sum()),
                                 bool(every[:, 1].any()))


def discover(process_group: Any = None, stage: int = 3,
             backend: str = "gloo", timeout_s: float = 300.0) -> Ranks:
    """The ranks of this run: the process group given, the default one
    already made, or one made here from the launcher's environment
    (torchrun's or deepspeed's RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT); world size 1 when there is none. `backend` is "nccl"
    where the device is CUDA: the engine's GPU is then torch's current
    device at one rank, and across ranks this process's (this_gpu), made
    torch's current device as DeepSpeed makes it."""
    cuda = backend == "nccl"
    one = Ranks(stage=stage,
                cuda=torch.cuda.current_device() if cuda else 0)
    if process_group is None and not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return one
        if cuda:
            torch.cuda.set_device(this_gpu())
        dist.init_process_group(
            backend, timeout=datetime.timedelta(seconds=timeout_s))
    world = dist.get_world_size(process_group)
    if world <= 1:
        return one
    gpu = this_gpu() if cuda else 0
    if cuda:
        torch.cuda.set_device(gpu)
    return Ranks(dist.get_rank(process_group), world, stage, process_group,
                 timeout_s, dist.get_backend(process_group) == "gloo", gpu)


def this_gpu() -> int:
    """The GPU of this process (0 without CUDA): cuda_index of the
    launcher's LOCAL_RANK."""
    if not torch.cuda.is_available():
        return 0
    return cuda_index(os.environ.get("LOCAL_RANK"),
                      torch.cuda.device_count(), torch.cuda.current_device())


def cuda_index(local_rank: Optional[str], count: int, current: int) -> int:
    """The GPU a process uses among the `count` it sees: its LOCAL_RANK's,
    as torchrun and the deepspeed launcher number the processes of one
    machine; torch's `current` device when there is no LOCAL_RANK or the
    process sees one GPU (CUDA_VISIBLE_DEVICES per process)."""
    if local_rank is None or count == 1:
        return current
    if not 0 <= int(local_rank) < count:
        raise ConfigError(
            f"LOCAL_RANK {local_rank} has no GPU: this process sees "
            f"{count}; start at most {count} processes on this machine "
            f"(torchrun --nproc-per-node {count}), or give each its GPU "
            f"with CUDA_VISIBLE_DEVICES")
    return int(local_rank)
