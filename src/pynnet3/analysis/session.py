"""What the optimizer's analyses share from one pass to the next.

Each pass's analysis reads every submatrix (:func:`~.variables.submatrix_array`)
and looks up component properties. While the driver runs the passes it opens an
:class:`AnalysisSession` for the computation, and those lookups consult it:

* **The submatrix array** is remembered with the SubMatrix objects it was read
  from. SubMatrix is immutable, so a row stays right as long as its position
  holds the same object: only replaced or appended submatrices are read again.
  That needs nothing from the passes. The array is read-only.
* **Component properties** by node are looked up once: the network does not
  change while it is optimized.

Access tables are built fresh for every request (passes edit commands in place;
reusing a table after a pass that changed nothing saved about 1% and needed the
driver to trust the passes). Sessions are per thread (a context variable), and a
request about any other computation or network than the session's is answered
without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from itertools import chain
from operator import is_not

import numpy as np

from ..computation import NnetComputation


def read_submatrices(subs: list) -> np.ndarray:
    """``(len(subs), 5)`` int64 array of (matrix, row offset, rows, column offset,
    columns) of the given SubMatrix objects."""
    return np.fromiter(chain.from_iterable(subs), dtype=np.int64,
                       count=5 * len(subs)).reshape(-1, 5)


class AnalysisSession:
    """What the optimizer's driver keeps about one computation between passes."""

    __slots__ = ("computation", "nnet", "sub_objs", "sub_array", "props")

    def __init__(self, computation: NnetComputation, nnet):
        self.computation = computation
        self.nnet = nnet
        self.sub_objs: list = []  # the SubMatrix objects sub_array was read from
        self.sub_array = np.zeros((0, 5), dtype=np.int64)
        #: component properties by node (an accesses.PropertyCache), shared by the
        #: session's builds: the network does not change while optimizing
        self.props = None

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
