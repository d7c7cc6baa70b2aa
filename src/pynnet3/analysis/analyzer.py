"""The Analyzer: every analysis of one computation, and the queries passes ask.

``Analyzer(computation, nnet)`` reads every command's accesses once (an
:class:`~pynnet3.analysis.accesses.AccessTable`); variables, per-command
attributes, per-variable and per-matrix accesses are derived from it with numpy
on first use, so a pass pays only for what it asks. It describes the computation
as it was when built: a pass that edits the computation must build a new Analyzer
before asking again.
"""

from __future__ import annotations

import numpy as np

from ..computation import NnetComputation
from ..index import unique_keys
from .accesses import (
    AccessTable,
    AccessType,
    CommandAttributes,
    MatrixAccessArrays,
    MatrixAccessList,
    VariableAccesses,
    build_access_table,
    compute_command_attributes,
    compute_matrix_accesses,
    compute_variable_accesses,
    matrix_access_arrays,
    raw_accesses,
)
from .variables import ComputationVariables


class Analyzer:
    """Variables, command attributes, variable accesses and matrix accesses."""

    def __init__(self, computation: NnetComputation, nnet):
        self.computation = computation
        self.nnet = nnet
        self.table: AccessTable = build_access_table(computation, nnet)
        self._variables: ComputationVariables | None = None
        self._variable_accesses: VariableAccesses | None = None
        self._matrix_arrays: MatrixAccessArrays | None = None
        self._matrix_accesses: MatrixAccessList | None = None
        self._command_attributes: list[CommandAttributes] | None = None
        self._raw = None

    @property
    def num_commands(self) -> int:
        return self.table.num_commands

    # -- lazily derived structures ---------------------------------------------------
    @property
    def variables(self) -> ComputationVariables:
        if self._variables is None:
            self._variables = ComputationVariables(self.computation, self.table.sub_array)
        return self._variables

    @property
    def variable_accesses(self) -> VariableAccesses:
        if self._variable_accesses is None:
            self._variable_accesses = compute_variable_accesses(self.table, self.variables)
        return self._variable_accesses

    @property
    def matrix_arrays(self) -> MatrixAccessArrays:
        """Per-matrix accesses as CSR arrays (the vectorized form of
        :attr:`matrix_accesses`)."""
        if self._matrix_arrays is None:
            self._matrix_arrays = matrix_access_arrays(self.table, len(self.computation.matrices))
        return self._matrix_arrays

    @property
    def matrix_accesses(self) -> MatrixAccessList:
        """Per matrix, its :class:`MatrixAccesses` (a sequence indexed by matrix)."""
        if self._matrix_accesses is None:
            self._matrix_accesses = compute_matrix_accesses(self.table, self.matrix_arrays)
        return self._matrix_accesses

    @property
    def command_attributes(self) -> list[CommandAttributes]:
        if self._command_attributes is None:
            self._command_attributes = compute_command_attributes(
                self.computation, self.table, self.variables)
        return self._command_attributes

    @property
    def raw_accesses(self) -> list[list]:
        """Per command, its (submatrix, AccessType) pairs."""
        if self._raw is None:
            self._raw = raw_accesses(self.table)
        return self._raw

    # -- queries over the variables of a submatrix ---------------------------------
    def _accesses_of_submatrix(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """All (command, access) entries of the variables of ``s``, unsorted."""
        va = self.variable_accesses
        vs = self.variables.submatrix_variables(s)
        if len(vs) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int8)
        starts, ends = va.ptr[vs], va.ptr[vs + 1]
        lens = ends - starts
        if lens.sum() == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int8)
        idx = np.repeat(starts - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens) + \
            np.arange(int(lens.sum()))
        return va.command[idx], va.access[idx]

    def _is_zeroing(self, i: int) -> bool:
        return bool(self.table.zeroing[i])

    def first_access(self, s: int) -> int:
        """First command touching any variable of ``s`` (num_commands if none)."""
        cmds, _ = self._accesses_of_submatrix(s)
        return int(cmds.min()) if len(cmds) else self.num_commands

    def first_nontrivial_access(self, s: int) -> int:
        """Like :meth:`first_access` but not counting zeroing (SET_CONST 0)."""
        cmds, _ = self._accesses_of_submatrix(s)
        cmds = unique_keys(cmds)
        cmds = cmds[~self.table.zeroing[cmds]]
        return int(cmds[0]) if len(cmds) else self.num_commands

    def last_access(self, s: int) -> int:
        """Last command touching any variable of ``s`` (-1 if none)."""
        cmds, _ = self._accesses_of_submatrix(s)
        return int(cmds.max()) if len(cmds) else -1

    def last_write_access(self, s: int) -> int:
        cmds, acc = self._accesses_of_submatrix(s)
        w = cmds[(acc & AccessType.WRITE) != 0]
        return int(w.max()) if len(w) else -1

    def data_invalidated_command(self, after: int, s: int) -> int:
        """First command after ``after`` that writes any variable of ``s`` or
        deallocates (or swaps away) its matrix; num_commands if none."""
        cmds, acc = self._accesses_of_submatrix(s)
        w = cmds[((acc & AccessType.WRITE) != 0) & (cmds > after)]
        best = int(w.min()) if len(w) else self.num_commands
        de = int(self.table.dealloc[self.computation.submatrices[s].matrix])
        if de > after:
            best = min(best, de)
        return best

    # -- queries over matrices -------------------------------------------------------
    def first_nontrivial_matrix_accesses(self) -> np.ndarray:
        """Per matrix, its first access that is not a zeroing (num_commands if none)."""
        ma = self.matrix_arrays
        n = self.num_commands
        keep = ~self.table.zeroing[ma.command] if len(ma.command) else \
            np.zeros(0, dtype=bool)
        nm = len(ma.ptr) - 1
        m_of = np.repeat(np.arange(nm), np.diff(ma.ptr))[keep]
        cmds = ma.command[keep]
        out = np.full(nm, n, dtype=np.int64)
        first = np.ones(len(m_of), dtype=bool)
        first[1:] = m_of[1:] != m_of[:-1]
        out[m_of[first]] = cmds[first]
        return out

    def first_nontrivial_matrix_access(self, m: int) -> int:
        """First access to matrix ``m`` that is not a zeroing (num_commands if none)."""
        ma = self.matrix_arrays
        cmds = ma.command[ma.ptr[m]:ma.ptr[m + 1]]
        cmds = cmds[~self.table.zeroing[cmds]]
        return int(cmds[0]) if len(cmds) else self.num_commands

    def last_matrix_access(self, m: int) -> int:
        """Last command (not the deallocation) accessing matrix ``m``; -1 if none."""
        ma = self.matrix_arrays
        a, b = ma.ptr[m], ma.ptr[m + 1]
        return int(ma.command[b - 1]) if b > a else -1
