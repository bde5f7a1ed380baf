"""The gradient side of strata.torch's hooks (Note [Backward fetch and
hand-off] in hooks.py): where each group's gradients accumulate, when the
group is final, and its hand-off to the CPU optimizer, across ranks
through a reduction.

Note [When gradients get a buffer]
A group's gradients get their buffer when the first of them is complete,
not when the unit's backward starts: a parameter used by several
forwards before one backward (R-drop, contrastive losses: engine(x1),
engine(x2), backward of the sum) gets its gradient only after the
backward of its last use, and autograd runs the second forward's
backward first, so buffers taken at each unit's backward fetch were all
held at once, waiting for gradients that could not come before a buffer
was free (issue #30: it hung). Held from the first complete gradient to
the hand-off, a group needs its buffer only while its own parameters
accumulate.

On one rank the buffer is strata's (Optimizer.acquire_gradients), handed
off as it is. Across ranks it is a flat torch buffer (Note [Partitions]
in ranks.py), reduced at the hand-off; strata's buffer is taken only
when the reduction lands, for the copy of this rank's part, and handed
off at once, so a rank holds one strata buffer at a time however many
groups accumulate. At the end of backward what was not handed off goes
in the groups' order across ranks; on one rank the groups holding a
buffer go first, so that a group that got no gradient can take one.

Note [Gradients copied in]
On one rank a parameter's gradient reaches strata's buffer as a copy:
its .grad is None when autograd's AccumulateGrad runs, so autograd keeps
the tensor it computed, and the post-accumulate-grad hook copies that
into the parameter's slice and points .grad at the slice, so that a
later accumulation in the same micro-batch (a second backward through
the parameter) adds there. So the buffer is taken unzeroed
(acquire_gradients(zeroed=False)): pointing .grad at a zeroed slice
before AccumulateGrad, as strata did before, costs a pass over the
buffer to zero it (on the caller's thread, inside backward) and an add
where a copy does, the same bytes again. A parameter that got no
gradient gets zeros at the hand-off. Across ranks the gradients
accumulate into the zeroed flat torch buffer of Note [Partitions] (it is
reduced whole), and this rank's part of the reduction is copied into an
unzeroed strata buffer.

Note [The order of the reductions]
The ranks must issue their reductions in the same order, and at the
same places among their other collectives (stage 3's gathers in
backward), or a group's gradients are averaged with another group's, or
a gather pairs with a reduction: silently wrong where the sizes agree,
a wait until strata.rank_timeout where they do not. The moment a group's
gradients are final depends on which of its parameters got one, which
may differ between ranks (a branch some ranks take), so across ranks it
decides nothing. A group is handed off when a unit using it finishes the
backward of one of its forwards (the backward of the BackwardFetch
around its inputs, in engine.backward) and every unit using it has
finished the backward of each of its forwards in this micro-batch
(counted in the training pass whatever the grad mode, so a reentrant
checkpoint's recomputation is the backward that counts); a parameter
without a gradient adds zeros. What is never due so (a unit whose
inputs need no gradient, or that ran under no_grad) is handed off at the
end of backward, in the groups' order. Every rank reaches these points
alike as long as every rank runs the same units the same number of
times with the same inputs needing gradients, which stage 3's gathers
require anyway. The cost: a group whose unit's backward never says it is
done keeps its flat gradients (and at stage 3 its gathered weights)
until the end of backward. On one rank a group is handed off the moment
it is final. As a last guard a hash of the order of the reductions (not
their place among the gathers) goes with the step's gradient checks
(Ranks.global_checks): where the ranks' differ the step fails on every
rank before anything of it stands. Activation checkpointing across ranks
is untested."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch import nn

from strata._native import StrataError
from strata.torch.ranks import SHARD, Pending

if TYPE_CHECKING:
    from strata.torch.hooks import Group, Runtime, Unit


class HandOffs:
    """Gradients from autograd to the CPU optimizer (owned by Runtime)."""

    def __init__(self, rt: "Runtime") -> None:
        self.rt = rt
        # Note [Reducing behind] in ranks.py: the group whose gradients
        # are being reduced, this rank's part and the collective.
        self.reducing: Optional[tuple["Group", torch.Tensor,
                                      Pending]] = None
        # Note [The order of the reductions]: its hash; the units fetching
        # each group (by id(group)); each unit's training forwards in this
        # micro-batch, and their backwards done.
        self.order = 0
        self.users: dict[int, list["Unit"]] = {}
        for unit in rt.units:
            for group in unit.groups:
                self.users.setdefault(id(group), []).append(unit)
        self.runs: dict[int, int] = {}
        self.dones: dict[int, int] = {}

    def hooks(self, group: "Group") -> list[Any]:
        """Registers the gradient hooks of a trainable group's
        parameters; their handles."""
        handles = []
        for _, p in group.plan.params:
            handles.append(p.register_hook(self._complete(group)))
            handles.append(p.register_post_accumulate_grad_hook(
                self._accumulated))
        return handles

    def _complete(self, group: "Group") -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if not group.grad_targets and not group.handed:
                with self.rt.inside():
                    self._start(group, coming=True)
        return hook

    def _start(self, group: "Group", coming: bool) -> None:
        """Gives the group's gradients their buffer (Note [When gradients
        get a buffer]); `coming`: autograd is about to accumulate them
        (Note [Gradients copied in])."""
        if group.flat is None:
            assert self.rt.optimizer is not None
            group.grads = self.rt.optimizer.acquire_gradients(
                group.id, zeroed=not coming)
            group.grad_targets = [torch.from_dlpack(group.grads.export(name))
                                  for name, _ in group.plan.params]
        else:
            group.grad_targets = group.flat.gradients(group.placeholders[0])
            if coming:
                for (_, p), target in zip(group.plan.params,
                                          group.grad_targets):
                    p.grad = target

    def _accumulated(self, p: nn.Parameter) -> None:
        with self.rt.inside():
            self._final(p)

    def _final(self, p: nn.Parameter) -> None:
        group = self.rt.group_of[id(p)]
        if not group.grad_targets:
            raise StrataError(9, "failed precondition", (
                f"strata.torch: parameter {self.rt.name_of[id(p)]} got a "
                f"gradient after its group {group.name!r} was handed off, "
                f"or outside engine.backward; call engine.backward(loss), "
                f"and do not use a parameter outside the modules that hold "
                f"it"))
        target = group.grad_targets[self.rt.index_of[id(p)]]
        grad = p.grad
        if grad is not None and (grad.is_sparse or
                                 grad.data_ptr() != target.data_ptr()):
            if grad.is_sparse:  # nn.Embedding(sparse=True)
                target.zero_().add_(grad)
            else:
                target.copy_(grad)
            p.grad = target  # what autograd adds to it from now on
        group.final.add(id(p))
        if group.flat is None and len(group.final) == len(group.plan.params):
            self.hand_off(group)

    def ran(self, unit: "Unit") -> None:
        """A forward of `unit` in a training pass, whatever the grad mode
        (reentrant checkpointing runs it without, and its recomputation's
        backward is the one done); its backward may never say it is done
        (inputs that need no gradient): then end_backward hands off."""
        self.runs[id(unit)] = self.runs.get(id(unit), 0) + 1

    def unit_done(self, unit: "Unit") -> None:
        """A backward of `unit` is done: across ranks, hands off its
        groups that are due (Note [The order of the reductions])."""
        if not self.rt.ranks.sharded():
            return
        self.dones[id(unit)] = self.dones.get(id(unit), 0) + 1
        for group in unit.groups:
            if group.plan.trainable and not group.handed and \
                    self._due(group):
                if not group.grad_targets:
                    self._start(group, coming=False)
                self.hand_off(group)

    def _due(self, group: "Group") -> bool:
        """Every unit using `group` has done the backward of each of its
        forwards (not "final": that differs between ranks)."""
        return all(self.dones.get(id(u), 0) >= self.runs.get(id(u), 0)
                   for u in self.users[id(group)])

    def hand_off(self, group: "Group") -> None:
        """The group's gradients are final: to the optimizer (across
        ranks, reduced first: Note [Reducing behind]); then the views
        its parameters kept for accumulating go."""
        assert self.rt.optimizer is not None and group.grad_targets
        for (_, p), target in zip(group.plan.params, group.grad_targets):
            p.grad = None
            if group.flat is None and id(p) not in group.final:
                target.zero_()  # no gradient: zeros, not what was there
        group.grad_targets = []
        group.handed = True
        if group.flat is None:
            assert group.grads is not None
            grads, group.grads = group.grads, None
            self.rt.optimizer.hand_off(grads, self.rt.stream())
        else:
            self.order = (self.order * 1_000_003 + group.id + 1) % 2**40
            previous, self.reducing = self.reducing, (
                group, *group.flat.reduce())
            self._land(previous)
        deferred, group.deferred = group.deferred, []
        self.rt.release([(group, view) for view in deferred])

    def land(self) -> None:
        """Lands the reduction in flight (_land)."""
        previous, self.reducing = self.reducing, None
        self._land(previous)

    def _land(self, reducing: Optional[tuple["Group", torch.Tensor,
                                             Pending]]) -> None:
        """Waits for a reduction, copies this rank's part into a strata
        gradient buffer and hands that off (Note [Reducing behind] in
        ranks.py)."""
        if reducing is not None:
            assert self.rt.optimizer is not None
            group, mine, pending = reducing
            self.rt.ranks.finish(pending)
            grads = self.rt.optimizer.acquire_gradients(group.id,
                                                        zeroed=False)
            torch.from_dlpack(grads.export(SHARD)).copy_(mine)
            self.rt.optimizer.hand_off(grads, self.rt.stream())

    def end_backward(self) -> None:
        """After loss.backward(): hands off every trainable group not
        handed off yet (zeros for what got no gradient), in the order of
        Note [When gradients get a buffer]."""
        trained = [g for g in self.rt.groups if g.plan.trainable]
        order = trained if self.rt.ranks.sharded() else \
            sorted(trained, key=lambda g: not g.grad_targets)
        for group in order:
            if not group.handed:
                if not group.grad_targets:
                    self._start(group, coming=False)
                self.hand_off(group)
        self.land()
        for group in trained:
            group.handed = False
            group.final.clear()
        self.runs.clear()
        self.dones.clear()

    def reset(self) -> None:
        """After an error in a pass: a reduction in flight is abandoned,
        every group's gradients of the micro-batch are forgotten (the
        optimizer's abort_step ends strata's buffers)."""
        if self.reducing is not None:
            self.rt.ranks.abandon(self.reducing[2])
            self.reducing = None
        self.order = 0
        self.runs.clear()
        self.dones.clear()
        for group in self.rt.groups:
            group.grads = None
            group.grad_targets = []
            if group.flat is not None:
                group.flat.grads = None
            group.handed = False
            group.final.clear()
            for _, p in group.plan.params:
                p.grad = None
