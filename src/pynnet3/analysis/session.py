"""Analyses reused from one optimizer pass to the next.

The optimizer's passes each ask for an analysis of the computation, and each
such request reads every command (:func:`~.accesses.build_access_table`) and
every submatrix (:func:`~.variables.submatrix_array`). Much of that is asked
again of an unchanged computation. While the driver runs the passes it opens an
:class:`AnalysisSession` for the computation, and those two functions consult it:

* **The submatrix array** is remembered with the SubMatrix objects it was read
  from. SubMatrix is immutable, so a row stays right as long as its position
  holds the same object: only replaced or appended submatrices are read again.
  That check needs nothing from the passes.
* **The access table** depends on the commands, which passes edit in place, so
  only the driver can say it is still right: after a pass that reported no
  change (which means it left the computation as it found it), the last table
  built is right for the next pass too. It is handed out only to a pass's
  *first* request and only for passes the driver trusts (the built-in ones, which
  all take their analysis before they edit anything), and only when the numbers
  of commands and matrices and the submatrices themselves are still those it was
  built of; any other request builds a fresh table. Tables are read-only (their
  arrays are not writeable), so sharing one is safe.

Sessions are per thread (a context variable), and a request about any other
computation or network than the session's is answered without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from itertools import chain
from operator import attrgetter, is_not

import numpy as np

from ..computation import NnetComputation

_SUB_FIELDS = attrgetter("matrix", "row_offset", "num_rows", "col_offset", "num_cols")


def read_submatrices(subs: list) -> np.ndarray:
    """``(len(subs), 5)`` int64 array of (matrix, row offset, rows, column offset,
    columns) of the given SubMatrix objects."""
    return np.fromiter(chain.from_iterable(map(_SUB_FIELDS, subs)), dtype=np.int64,
                       count=5 * len(subs)).reshape(-1, 5)


class AnalysisSession:
    """What the optimizer's driver knows about one computation between passes."""

    __slots__ = ("computation", "nnet", "table", "built", "serve", "in_pass",
                 "sub_objs", "sub_array", "props")

    def __init__(self, computation: NnetComputation, nnet):
        self.computation = computation
        self.nnet = nnet
        self.table = None  # an access table right for the computation as it is now
        self.built = None  # the first table built during the current pass
        self.serve = False  # the current pass's next request may be given ``table``
        self.in_pass = False
        self.sub_objs: list = []  # the SubMatrix objects sub_array was read from
        self.sub_array = np.zeros((0, 5), dtype=np.int64)
        #: component properties by node (an accesses.PropertyCache), shared by the
        #: session's builds: the network does not change while optimizing
        self.props = None

    # -- the driver ------------------------------------------------------------------
    def begin_pass(self, trusted: bool) -> None:
        """A pass starts; ``trusted``: it takes its analyses before editing."""
        self.in_pass = True
        self.serve = trusted
        self.built = None
        if not trusted:
            self.table = None

    def end_pass(self, changed: bool) -> None:
        """The pass ended; ``changed``: it reported a change (or may have made one)."""
        if changed:
            self.table = None
        elif self.built is not None:
            self.table = self.built
        self.in_pass = self.serve = False
        self.built = None

    # -- the analyses ----------------------------------------------------------------
    def access_table(self, build: Callable[[], object]):
        """The access table for a request made now (``build()`` makes a fresh one)."""
        if not self.in_pass:
            return build()
        if self.serve and self.table is not None and self._still_fits(self.table):
            self.serve = False
            return self.table
        self.serve = False
        table = build()
        if self.built is None:
            self.built = table
        return table

    def _still_fits(self, table) -> bool:
        """Cheap evidence that ``table`` was built of the computation as it is: as
        many commands and matrices, and the very submatrices (a pass that reported no
        change may still have appended unused ones)."""
        c = self.computation
        return len(c.commands) == table.num_commands and len(c.matrices) == len(table.alloc) \
            and self.submatrix_array(c.submatrices) is table.sub_array

    def submatrix_array(self, subs: list) -> np.ndarray:
        """:func:`read_submatrices` of ``subs`` (the computation's submatrices),
        reading only the positions whose object changed since the last call. The
        array is read-only."""
        old, arr = self.sub_objs, self.sub_array
        k = min(len(old), len(subs))
        head = subs if k == len(subs) else subs[:k]
        # list equality tests identity first, element by element, in C: the common
        # case (nothing replaced) costs next to nothing
        if (old if k == len(old) else old[:k]) == head:
            if k == len(subs) == len(old):
                return arr
            out = arr[:k]
        else:
            changed = np.fromiter(map(is_not, old, head), dtype=bool, count=k)
            out = arr[:k].copy()
            out[changed] = read_submatrices([subs[i] for i in np.flatnonzero(changed).tolist()])
        if len(subs) > k:
            out = np.concatenate([out, read_submatrices(subs[k:])])
        self.remember_submatrix_array(subs, out)
        return out

    def remember_submatrix_array(self, subs: list, arr: np.ndarray) -> None:
        """Record that ``arr`` is :func:`read_submatrices` of ``subs``."""
        arr.setflags(write=False)
        self.sub_objs, self.sub_array = list(subs), arr


_SESSION: ContextVar[AnalysisSession | None] = ContextVar("pynnet3_analysis_session",
                                                          default=None)


def current_session(computation: NnetComputation, nnet=None) -> AnalysisSession | None:
    """The open session for ``computation`` (and ``nnet``, when given), if any."""
    s = _SESSION.get()
    if s is None or s.computation is not computation or \
            (nnet is not None and s.nnet is not nnet):
        return None
    return s


@contextmanager
def analysis_session(computation: NnetComputation, nnet) -> Iterator[AnalysisSession]:
    """Open a session for ``computation`` for the duration of the block."""
    s = AnalysisSession(computation, nnet)
    token = _SESSION.set(s)
    try:
        yield s
    finally:
        _SESSION.reset(token)
