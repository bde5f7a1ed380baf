"""The module hooks of strata.torch: fetch a unit's groups before it runs,
point its parameters at the fetched compute copies, release them after,
and in backward fetch again; the gradient side (buffers, hand-off) is
handoff.py's.

Note [Parameters between hooks]
A managed parameter's .data is strata memory only while one of its
group's views is held (Group.live > 0); otherwise it is a placeholder, and
any use of it fails naming it (Note [Managed parameters] in weights.py)
instead of reading memory strata may have reused. Autograd saves tensors
for backward; a view of a parameter
(weight.t() in F.linear) would keep pointing at the forward fetch's memory.
The saved-tensor hooks (pack/unpack) therefore store such a tensor as a
reference to its parameter and rebuild the view from the parameter's
current memory in backward, after the unit's backward fetch. Views fetched
inside backward (recomputation under activation checkpointing) stay held
until the unit's backward ends, because recomputed tensors reach backward
without passing the pack hook; they are held from the pre-hook on, since
a non-reentrant checkpoint stops its recomputation early, inside the
module, so that its post-hook never runs.

Note [Backward fetch and hand-off]
The forward post-hook wraps the unit's outputs in a BackwardFetch
(wrap.py): its backward runs once the gradient of every output is there,
before the unit's own backward, and fetches the unit's groups again. A
parameter's gradient hook (a pre-hook of its AccumulateGrad) gives its
group's gradients a buffer when the first of them is complete (Note
[When gradients get a buffer] in handoff.py). A parameter's
post-accumulate-grad hook copies its gradient into its slice of the
buffer (Note [Gradients copied in] there) and marks it final;
when every trainable parameter of a group is final the buffer is handed
off (across ranks, Note [The order of the reductions] in handoff.py),
fenced on the current stream, and the CPU steps the group under the
rest of backward. The pre-hook wraps the unit's inputs in a
BackwardFetch too, whose backward runs when the unit's backward is done
and releases its views (after the hand-off, for a group whose gradients
accumulate: AccumulateGrad needs the parameter's real shape). What
neither reaches (a unit whose inputs need no
gradient, a group whose parameters got no gradient) is released or handed
off (zeros) by Runtime.end_backward.

The updated weights need no prefetch here: the engine queues one when
the optimizer writes a compute copy below the device (Note [Updates below
the device] in src/store/residency_holds.cc)."""
from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

import strata
from strata._native import StrataError, lib
from strata.torch.flat import Flat
from strata.torch.groups import GroupPlan, UnitPlan
from strata.torch.handoff import HandOffs
from strata.torch.ranks import Ranks, fill_from
from strata.torch.wrap import wrap


class Phase(enum.Enum):
    """Note [Phases]: the engine's state between the user's calls.

    | from     | call                   | to       |
    |----------|------------------------|----------|
    | IDLE     | engine(...) training   | FORWARD  |
    | OPEN     | engine(...)            | FORWARD  |
    | FORWARD  | forward returns        | OPEN     |
    | OPEN     | engine.backward(loss)  | BACKWARD |
    | BACKWARD | backward returns       | OPEN     |
    | OPEN     | engine.step() at the accumulation boundary | IDLE |

    IDLE: no optimizer step open; OPEN: a step is open between passes.
    Inference (no_grad or eval) runs in IDLE or OPEN and changes nothing."""
    IDLE = 0
    FORWARD = 1
    OPEN = 2
    BACKWARD = 3


@dataclass
class Group:
    """A registered group and its state in the current micro-batch."""
    id: int
    plan: GroupPlan
    placeholders: list[torch.Tensor]
    dtypes: list[torch.dtype]           # the parameters' before initialize
    roles: list[str]                    # registered with strata
    has_master: bool                    # an fp32 master beside the compute
    live: int = 0                       # views held
    gathered: int = 0                   # GatheredParameters contexts
    deferred: list[strata.View] = field(default_factory=list)
    grads: Optional[strata.Gradients] = None   # on one rank
    # What each parameter's .grad accumulates into: the views of grads,
    # or across ranks of flat.grads (Note [When gradients get a buffer]).
    grad_targets: list[torch.Tensor] = field(default_factory=list)
    final: set[int] = field(default_factory=set)  # params accumulated
    handed: bool = False                # handed off this micro-batch
    flat: Optional[Flat] = None         # across ranks: Note [Partitions]

    @property
    def name(self) -> str:
        return self.plan.name


@dataclass
class Unit:
    plan: UnitPlan
    groups: list[Group]
    forward: list[list[strata.View]] = field(default_factory=list)
    held: list[strata.View] = field(default_factory=list)  # backward's


class _ParamRef:
    """A saved tensor that was (a view of) a managed parameter."""
    __slots__ = ("param", "view")

    def __init__(self, param: nn.Parameter, view: Optional[tuple]) -> None:
        self.param = param
        self.view = view


class Runtime:
    """The hooks' state over one model (owned by StrataEngine)."""

    def __init__(self, engine: strata.Engine, device: torch.device,
                 groups: list[Group], units: list[UnitPlan]) -> None:
        self.engine = engine
        self.optimizer: Optional[strata.Optimizer] = None
        self.device = device
        self.groups = groups
        self.units = [Unit(u, [groups[i] for i in u.groups]) for u in units]
        self.phase = Phase.IDLE
        self.busy = 0  # inside strata's own code: every use passes
        self.saving = 0  # model.state_dict() calls in progress
        # storage -> the parameters in it (one, or a gathered group's)
        self.live_storage: dict[int, list[nn.Parameter]] = {}
        self.group_of: dict[int, Group] = {}
        self.name_of: dict[int, str] = {}
        self.index_of: dict[int, int] = {}
        for group in groups:
            for index, (name, p) in enumerate(group.plan.params):
                self.group_of[id(p)] = group
                self.name_of[id(p)] = name
                self.index_of[id(p)] = index
        self.handles: list[Any] = []
        self.ranks = Ranks()  # Note [Partitions] in ranks.py
        # The forward order, for gathering ahead (Note [Gathering ahead]).
        self.order: dict[int, Unit] = {}  # this step's forward, in order
        self.after: dict[int, Unit] = {}  # id(unit) -> the next, last step
        self.before: dict[int, Unit] = {}  # id(unit) -> the one before
        self.handoffs = HandOffs(self)

    # ---- streams and fetches -------------------------------------------

    def stream(self) -> Any:
        """The stream the model's kernels are queued on (None: synchronous
        host work)."""
        if self.device.type == "cuda":
            return torch.cuda.current_stream(self.device)
        return None

    def _point(self, group: Group, view: strata.View) -> None:
        if group.flat is None:
            memory = [torch.from_dlpack(view.export(name))
                      for name, _ in group.plan.params]
        else:
            memory = group.flat.gather(fill_from(view),
                                       group.placeholders[0].dtype,
                                       self.device)
        for (_, p), data in zip(group.plan.params, memory):
            p.data = data
            self.live_storage.setdefault(
                p.untyped_storage().data_ptr(), []).append(p)

    def fetch(self, group: Group) -> strata.View:
        view = self.engine.fetch(group.id, "device", roles="compute",
                                 stream=self.stream())
        if group.live == 0 and group.gathered == 0:
            try:
                self._point(group, view)  # across ranks, a collective
            except BaseException:
                view.release(self.stream())
                raise
        group.live += 1
        return view

    def release(self, group_views: list[tuple[Group, strata.View]]) -> None:
        stream = self.stream()
        for group, view in group_views:
            if group.grad_targets:
                group.deferred.append(view)  # until its hand-off
                continue
            group.live -= 1
            if group.live == 0 and group.gathered == 0:
                for (_, p), empty in zip(group.plan.params,
                                         group.placeholders):
                    self.live_storage.pop(p.untyped_storage().data_ptr(),
                                          None)
                    p.data = empty
                if group.flat is not None:
                    group.flat.release()
            view.release(stream)

    def _views(self, unit: Unit) -> list[strata.View]:
        return [self.fetch(g) for g in unit.groups]

    def _release_unit(self, unit: Unit, views: list[strata.View]) -> None:
        n = len(unit.groups)
        pairs = [(unit.groups[i % n], v) for i, v in enumerate(views)]
        self.release(pairs)

    def _forward_started(self, unit: Unit) -> None:
        """Records `unit` in this step's forward order and, across ranks,
        gathers the unit that followed it in the last step's (Note
        [Gathering ahead])."""
        self.order.setdefault(id(unit), unit)
        following = self.after.get(id(unit))
        if following is not None and self.ranks.sharded():
            self._gather_ahead(following)

    def _gather_ahead(self, unit: Optional[Unit]) -> None:
        """Starts the all-gathers of `unit`'s groups: Note [Gathering
        ahead] in ranks.py."""
        for group in unit.groups if unit else []:
            if group.flat is not None and group.flat.idle():
                view = self.engine.fetch(group.id, "device", roles="compute",
                                         stream=self.stream())
                try:
                    group.flat.gather_ahead(fill_from(view),
                                            group.placeholders[0].dtype,
                                            self.device)
                finally:
                    view.release(self.stream())

    def end_step(self) -> None:
        """After the optimizer step: the forward order of this step is the
        next one's."""
        for group in self.groups:
            if group.flat is not None:
                group.flat.stepped()
        if not self.order:
            return
        units = list(self.order.values())
        self.after = {id(a): b for a, b in zip(units, units[1:])}
        self.before = {id(b): a for a, b in zip(units, units[1:])}
        self.order = {}

    def finish_step(self, held: contextlib.ExitStack) -> strata.StepReport:
        """The optimizer's FinishStep, deciding clipping and skipping from
        every rank's gradient checks. From its call on SIGINT is held until
        `held` ends (Note [Ctrl-C as a step finishes] in strata/_native.py);
        the ranks' collectives before it stay interruptible."""
        assert self.optimizer is not None
        checks = None
        if self.ranks.sharded():
            local = self.optimizer.local_checks()
            order, self.handoffs.order = self.handoffs.order, 0
            checks = self.ranks.global_checks(local, order)
        held.enter_context(lib().interrupts_held())
        return self.optimizer.finish_step(checks)

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """strata.torch's own code: managed parameters may be used."""
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1

    def usable(self, p: nn.Parameter, what: str = "") -> bool:
        """`what` (a torch function's name) may use `p` now: inside
        strata's code, its group fetched or gathered, or a detach by
        model.state_dict() (whose hooks then put the real value in)."""
        group = self.group_of[id(p)]
        return bool(self.busy or group.live or group.gathered
                    or (self.saving and what == "detach"))

    def grad_readable(self, p: nn.Parameter) -> bool:
        return self.usable(p) or self.phase is Phase.BACKWARD

    def check_gatherable(self, group: Group) -> None:
        """GatheredParameters reads and writes the master: between
        optimizer steps only."""
        if self.phase is not Phase.IDLE:
            raise StrataError(9, "failed precondition", (
                f"strata.torch: GatheredParameters of group {group.name!r} "
                f"in the middle of an optimizer step; use it between "
                f"steps (after engine.step())"))

    def check_usable(self, p: nn.Parameter, what: str) -> None:
        """Fails naming `p` when its group is not fetched (Note
        [Managed parameters] in weights.py)."""
        if self.usable(p, what):
            return
        name, group = self.name_of[id(p)], self.group_of[id(p)]
        if self.phase in (Phase.FORWARD, Phase.BACKWARD):
            raise StrataError(9, "failed precondition", (
                f"strata.torch: parameter {name} was used outside the "
                f"modules that fetch its group {group.name!r}; use it only "
                f"inside the module that holds it, or list the module that "
                f"uses it in strata.groups"))
        raise StrataError(9, "failed precondition", (
            f"strata.torch: parameter {name} ({what}) is held by strata "
            f"between the engine's passes, so its data here is a "
            f"placeholder; read its values with model.state_dict() or "
            f"engine.state_dict(), or inside strata.torch."
            f"GatheredParameters([...]) (deepspeed.zero.GatheredParameters),"
            f" which also writes changes back"))

    def reset(self) -> None:
        """After an error or an interrupt in a pass (Note [Recovery] in
        engine.py): every view the passes hold is released, gradient
        buffers not handed off are forgotten (the optimizer's abort_step
        ends them), and each group's state of the micro-batch is
        cleared."""
        self.saving = 0  # a state_dict() cut off by an error ends here
        with self.inside():
            pairs: list[tuple[Group, strata.View]] = []
            for unit in self.units:
                for views in unit.forward:
                    n = len(unit.groups)
                    pairs += [(unit.groups[i % n], v)
                              for i, v in enumerate(views)]
                n = len(unit.groups)
                pairs += [(unit.groups[i % n], v)
                          for i, v in enumerate(unit.held)]
                unit.forward, unit.held = [], []
            self.handoffs.reset()
            for group in self.groups:
                pairs += [(group, v) for v in group.deferred]
                group.deferred = []
                if group.flat is not None:
                    group.flat.forget()
            self.release(pairs)

    # ---- module hooks --------------------------------------------------

    def install(self) -> None:
        for unit in self.units:
            module = unit.plan.module
            self.handles.append(module.register_forward_pre_hook(
                self._pre_hook(unit), with_kwargs=True))
            self.handles.append(module.register_forward_hook(
                self._post_hook(unit)))
        for group in self.groups:
            if group.plan.trainable:
                self.handles += self.handoffs.hooks(group)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _pre_hook(self, unit: Unit) -> Callable[..., Any]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> Any:
            with self.inside():
                if (self.phase in (Phase.IDLE, Phase.OPEN)
                        and torch.is_grad_enabled() and module.training):
                    raise StrataError(9, "failed precondition", (
                        f"strata.torch: {unit.plan.name} ran a training "
                        f"forward outside the engine; call engine(...) "
                        f"instead of the model (or use torch.no_grad())"))
                views = self._views(unit)
                if self.phase is Phase.FORWARD:
                    self._forward_started(unit)
                    self.handoffs.ran(unit)  # whatever the grad mode
                if self.phase is Phase.BACKWARD:
                    unit.held += views  # recomputation: see the Note
                else:
                    unit.forward.append(views)
                if not torch.is_grad_enabled():
                    return None
                return wrap(args, kwargs, lambda: self._unit_done(unit))
        return hook

    def _post_hook(self, unit: Unit) -> Callable[..., Any]:
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            with self.inside():
                if self.phase is not Phase.BACKWARD:
                    self._release_unit(unit, unit.forward.pop())
                if not torch.is_grad_enabled():
                    return None
                wrapped = wrap((output,), {},
                                lambda: self._backward_fetch(unit))
                return None if wrapped is None else wrapped[0][0]
        return hook

    # ---- backward ------------------------------------------------------

    def _backward_fetch(self, unit: Unit) -> None:
        with self.inside():
            unit.held += self._views(unit)
            if self.ranks.sharded():
                self._gather_ahead(self.before.get(id(unit)))

    def _backward_done(self, unit: Unit) -> None:
        with self.inside():
            held, unit.held = unit.held, []
            self._release_unit(unit, held)

    def _unit_done(self, unit: Unit) -> None:
        """The backward of a forward of `unit` is done: its views go, and
        in engine.backward (not a torch.autograd.grad of the forward's)
        its groups due across ranks are handed off."""
        self._backward_done(unit)
        if self.phase is Phase.BACKWARD:
            with self.inside():
                self.handoffs.unit_done(unit)

    def end_backward(self) -> None:
        """After loss.backward(): releases what backward still holds and
        hands off every trainable group not handed off yet."""
        with self.inside():
            for unit in self.units:
                if unit.held:
                    self._backward_done(unit)
            self.handoffs.end_backward()
            self._settle()

    def _settle(self) -> None:
        """Note [Gathering ahead]: no gather started ahead outlives a
        pass."""
        for group in self.groups:
            if group.flat is not None:
                group.flat.settle()

    # ---- saved tensors -------------------------------------------------

    def pack(self, t: torch.Tensor) -> Any:
        try:
            params = self.live_storage.get(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):
            return t  # a tensor without storage (sparse, nested)
        p = _owner(params, t) if params else None
        if p is None or t.dtype != p.dtype:
            return t
        if t is p:
            return _ParamRef(p, None)
        return _ParamRef(p, (t.size(), t.stride(), t.storage_offset()))

    def unpack(self, saved: Any) -> Any:
        if not isinstance(saved, _ParamRef):
            return saved
        group = self.group_of[id(saved.param)]
        if group.live == 0:
            raise StrataError(9, "failed precondition", (
                f"strata.torch: backward needs parameter "
                f"{self.name_of[id(saved.param)]} while its group "
                f"{group.name!r} is not fetched; use each parameter only "
                f"inside the module that holds it (strata.groups)"))
        if saved.view is None:
            return saved.param
        return saved.param.data.as_strided(*saved.view)


def _owner(params: list[nn.Parameter], t: torch.Tensor
           ) -> Optional[nn.Parameter]:
    """The parameter whose memory `t` starts in (params share a storage
    when they are ranges of a gathered group)."""
    if len(params) == 1:
        return params[0]
    at = t.data_ptr()
    for p in params:
        if p.data_ptr() <= at < p.data_ptr() + max(1, p.nbytes):
            return p
    return None

