"""The Analyzer: every analysis of one computation, and the queries passes ask.

``Analyzer(computation, nnet)`` computes variables, per-command attributes,
per-variable accesses and per-matrix accesses in one go. It describes the
computation as it was when built: a pass that edits the computation must build
a new Analyzer before asking again.
"""

from __future__ import annotations

import numpy as np

from ..computation import CommandType as CT
from ..computation import NnetComputation
from .accesses import (
    AccessType,
    CommandAttributes,
    MatrixAccesses,
    VariableAccesses,
    compute_command_attributes,
    compute_matrix_accesses,
    compute_variable_accesses,
)
from .variables import ComputationVariables


class Analyzer:
    """Variables, command attributes, variable accesses and matrix accesses."""

    def __init__(self, computation: NnetComputation, nnet):
        self.computation = computation
        self.nnet = nnet
        self.variables = ComputationVariables(computation)
        self.command_attributes: list[CommandAttributes]
        self.command_attributes, self.raw_accesses = compute_command_attributes(
            computation, nnet, self.variables)
        self.variable_accesses: VariableAccesses = compute_variable_accesses(
            self.command_attributes, self.variables.num_variables)
        self.matrix_accesses: list[MatrixAccesses] = compute_matrix_accesses(
            computation, self.raw_accesses)

    @property
    def num_commands(self) -> int:
        return len(self.computation.commands)

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
        cmd = self.computation.commands[i]
        return cmd.type is CT.SET_CONST and cmd.alpha == 0.0

    def first_access(self, s: int) -> int:
        """First command touching any variable of ``s`` (num_commands if none)."""
        cmds, _ = self._accesses_of_submatrix(s)
        return int(cmds.min()) if len(cmds) else self.num_commands

    def first_nontrivial_access(self, s: int) -> int:
        """Like :meth:`first_access` but not counting zeroing (SET_CONST 0)."""
        cmds, _ = self._accesses_of_submatrix(s)
        cmds = np.unique(cmds)
        for i in cmds:
            if not self._is_zeroing(int(i)):
                return int(i)
        return self.num_commands

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
        ma = self.matrix_accesses[self.computation.submatrices[s].matrix]
        if ma.deallocate_command > after:
            best = min(best, ma.deallocate_command)
        return best

    # -- queries over matrices -------------------------------------------------------
    def first_nontrivial_matrix_access(self, m: int) -> int:
        """First access to matrix ``m`` that is not a zeroing (num_commands if none)."""
        for i, _ in self.matrix_accesses[m].accesses:
            if not self._is_zeroing(i):
                return i
        return self.num_commands

    def last_matrix_access(self, m: int) -> int:
        """Last command (not the deallocation) accessing matrix ``m``; -1 if none."""
        acc = self.matrix_accesses[m].accesses
        return acc[-1][0] if acc else -1
