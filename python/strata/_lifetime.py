"""What the binding has open in libstrata, so that it can all be freed: by
Engine.close(force=True), by a with block that an exception ends, and at
the interpreter's exit. Internal.
"""
from __future__ import annotations

import atexit
import os
import warnings
import weakref
from typing import Any, Callable, Optional

from strata._dlpack import sweep
from strata._native import Owned, lib

# Note [Clean exits]
# An engine's swap files go only when strata_engine_close runs, and that
# refuses while views, optimizers or gradient buffers of the engine are out.
# An exit without close() left the whole nvme_budget of swap files until
# the next open of the directory, and a with block that an exception ended
# while a view was held raised the close's error instead of the user's.
# So every handle the binding gets is a Loan, in a tree under its engine's:
# views and optimizers under the engine, gradient buffers under their
# optimizer. Loan.free() frees a loan's children, then the loan itself
# (a view is released, an optimizer's open step aborted, which ends its
# gradient buffers without handing them off, then it is closed; then the
# engine), and tells each Python object still alive that its handle ended.
# The tree holds handles and weak references: an Engine or View that no
# Python name refers to any more is still freed at exit, and none is kept
# alive by it. An atexit handler frees every engine still open (after
# strata.torch's, which atexit runs first since it was registered later);
# a failure there is a RuntimeWarning, as it is when the close after a
# user's exception fails: the user's exception is never replaced. A with
# block that ends normally closes without force: a view left unreleased
# there is a bug to see. A forked child forgets its parent's engines: its
# exit must not remove the swap files the parent still uses.

Free = Callable[[int], None]


class Loan:
    """One handle of the binding's, open in libstrata: its Python object
    (weakly), how to free it (None: its parent's free ends it) and the
    handles lent out under it."""

    def __init__(self, handle: int, owner: Any, free: Optional[Free],
                 home: dict["Loan", None]) -> None:
        self.handle = handle
        self._owner = weakref.ref(owner)
        self._free = free
        self._home = home
        # Keyed by the loan: view, optimizer and gradient handles are
        # numbered apart, so one engine may lend out two handles equal.
        self.children: dict[Loan, None] = {}
        home[self] = None

    def lend(self, handle: int, owner: Any,
             free: Optional[Free] = None) -> "Loan":
        """Records `handle`, got through this one, for `owner`."""
        return Loan(handle, owner, free, self.children)

    def forget(self) -> None:
        """The handle ended: drops the record and tells its object."""
        self._home.pop(self, None)
        owner = self._owner()
        if owner is not None:
            owner._ended()

    def forget_children(self) -> None:
        """The children's handles ended with a call on this one."""
        for child in list(self.children):
            child.forget()

    def free(self, last: Optional[Free] = None) -> None:
        """Frees the children, then this handle (with `last`, if given,
        instead of its own way)."""
        for child in list(self.children):
            child.free()
        free = last or self._free
        if free is not None:
            free(self.handle)
        self.forget()


_open: dict[Loan, None] = {}  # the engines not closed
os.register_at_fork(after_in_child=_open.clear)


def open_engine(handle: int, engine: Any) -> Loan:
    """Records a new engine (Note [Clean exits])."""
    return Loan(handle, engine,
                lambda h: lib().call("strata_engine_close", h), _open)


def untracked(handle: int, owner: Any) -> Loan:
    """A loan no engine knows of (a View or Gradients made by hand)."""
    return Loan(handle, owner, None, {})


def warn_failed(what: str, error: BaseException,
                after: Optional[BaseException] = None) -> None:
    """Reports a failure to free without raising it (at exit, or while the
    user's exception propagates)."""
    cause = f" after {type(after).__name__}" if after is not None else ""
    warnings.warn(f"strata: {what} failed{cause}: {error}", RuntimeWarning,
                  stacklevel=3)


class Tracked(Owned):
    """An Owned whose handle is a Loan (Note [Clean exits]): close(force=
    True), and the end of a with block by an exception, free what it lent
    out first."""

    _loan: Loan

    def close(self, force: bool = False) -> None:
        """Frees it; a second close does nothing. Without `force`, strata
        refuses while something still borrows it, naming what to close
        first; with `force`, what borrows it is freed first (views
        released, an open step aborted, optimizers closed)."""
        if self._handle is None:
            return
        sweep()  # exports dropped unconsumed hold what they point into
        if force:
            self._loan.free()
        else:
            lib().call(self._close_fn, self._handle)
            self._loan.forget()

    def __exit__(self, kind: Any, error: Optional[BaseException],
                 traceback: Any) -> None:
        """close(); when an exception ended the block, close(force=True),
        and a failure to close is a RuntimeWarning, never raised over the
        exception."""
        if error is None:
            self.close()
            return
        try:
            self.close(force=True)
        except Exception as failure:  # the user's exception goes on
            warn_failed(f"closing the {self._what}", failure, error)

    def _ended(self) -> None:
        self._handle = None


@atexit.register
def _free_at_exit() -> None:
    """Frees every engine still open, so their swap files go."""
    sweep()  # exports dropped unconsumed hold their views' fetches
    for loan in list(_open):
        try:
            # Arrays still alive (module globals) hold views: the engine
            # goes when the interpreter's finalization frees the last.
            loan.free(lambda h: lib().call(
                "strata_engine_close_after_exports", h))
        except Exception as error:  # the other engines still go
            warn_failed("freeing an engine at exit", error)
