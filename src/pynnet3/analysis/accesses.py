"""What each command reads and writes, per variable and per matrix.

* :func:`command_accesses` lists ``(submatrix, AccessType)`` for one command,
  following each command type's semantics (a partial write — a row op whose
  table has -1 entries, a scatter into some rows, an ``*_ADDS`` component — is a
  read-write, because the untouched part must already be defined).
* :class:`CommandAttributes` is the per-command summary (variables, submatrices and
  matrices read / written, side effects such as model updates or stored stats).
* :class:`VariableAccesses` holds, for every variable, the commands touching it in
  order, as flat numpy arrays (CSR layout) so passes can query slices cheaply.
* :class:`MatrixAccesses` holds, for every matrix, the allocating and
  deallocating command, the commands accessing it, and whether it is a user input
  or output.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from ..components.base import Flags
from ..computation import Command, NnetComputation
from ..computation import CommandType as CT
from .variables import ComputationVariables


class AccessType(enum.IntEnum):
    READ = 1
    WRITE = 2
    READ_WRITE = 3  # bitwise or of the two


def _component(nnet, cmd: Command):
    return nnet.components[nnet.node_map[cmd.node].component]


def command_accesses(c: NnetComputation, nnet, cmd: Command) -> list[tuple[int, AccessType]]:
    """``(submatrix, access)`` pairs of one command (sizing commands: none)."""
    R, W, RW = AccessType.READ, AccessType.WRITE, AccessType.READ_WRITE
    t = cmd.type
    out: list[tuple[int, AccessType]] = []
    if t is CT.SET_CONST:
        out.append((cmd.dst, W))
    elif t is CT.PROPAGATE:
        props = _component(nnet, cmd).properties()
        if cmd.in_value:
            out.append((cmd.in_value, R))
        out.append((cmd.out_value, RW if props & Flags.PROPAGATE_ADDS else W))
    elif t in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE):
        props = _component(nnet, cmd).properties()
        for s in (cmd.in_value, cmd.out_value, cmd.out_deriv):
            if s:
                out.append((s, R))
        if cmd.in_deriv:
            out.append((cmd.in_deriv, RW if props & Flags.BACKPROP_ADDS else W))
    elif t is CT.MATRIX_COPY:
        out += [(cmd.src, R), (cmd.dst, W)]
    elif t is CT.MATRIX_ADD:
        out += [(cmd.src, R), (cmd.dst, RW)]
    elif t is CT.COPY_ROWS:
        partial = bool((c.indexes[cmd.table] < 0).any())
        out += [(cmd.src, R), (cmd.dst, RW if partial else W)]
    elif t is CT.ADD_ROWS:
        out += [(cmd.src, R), (cmd.dst, RW)]
    elif t in (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI):
        tab = c.indexes_multi[cmd.table]
        for s in np.unique(tab[:, 0]):
            if s > 0:
                out.append((int(s), R))
        partial = t is CT.ADD_ROWS_MULTI or bool((tab[:, 0] < 0).any())
        out.append((cmd.dst, RW if partial else W))
    elif t in (CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI):
        out.append((cmd.src, R))
        tab = c.indexes_multi[cmd.table]
        for s in np.unique(tab[:, 0]):
            if s <= 0:
                continue
            rows = tab[tab[:, 0] == s, 1]
            full = (t is CT.COPY_TO_ROWS_MULTI
                    and len(np.unique(rows)) == c.submatrices[s].num_rows)
            out.append((int(s), W if full else RW))
    elif t is CT.ADD_ROW_RANGES:
        out += [(cmd.src, R), (cmd.dst, RW)]
    elif t is CT.ACCEPT_INPUT:
        out.append((cmd.dst, W))
    elif t is CT.PROVIDE_OUTPUT:
        out.append((cmd.src, R))
    elif t in (CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX):
        out.append((cmd.dst if cmd.dst else c.whole(cmd.matrix), RW))
    return out


@dataclass
class CommandAttributes:
    """Per-command summary. Arrays are sorted unique ids."""

    variables_read: np.ndarray
    variables_written: np.ndarray
    submatrices_read: list[int] = field(default_factory=list)
    submatrices_written: list[int] = field(default_factory=list)
    matrices_read: list[int] = field(default_factory=list)
    matrices_written: list[int] = field(default_factory=list)
    has_side_effects: bool = False


@dataclass
class VariableAccesses:
    """For variable ``v``: ``command[ptr[v]:ptr[v+1]]`` are the commands that access
    it, ascending, and ``access[...]`` their AccessType values (one entry per
    command: a command that reads and writes ``v`` has READ_WRITE)."""

    ptr: np.ndarray
    command: np.ndarray
    access: np.ndarray

    def of(self, v: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.ptr[v], self.ptr[v + 1]
        return self.command[a:b], self.access[a:b]


@dataclass
class MatrixAccesses:
    """Lifetime of one matrix: ``allocate_command`` (-1: never, e.g. a user input
    accepted by ACCEPT_INPUT — then ``is_input``), ``deallocate_command`` (-1: never,
    e.g. outputs kept for the user; a releasing PROVIDE_OUTPUT is both an access and
    the deallocation), and the other ``accesses`` as (command, AccessType) in order."""

    allocate_command: int = -1
    deallocate_command: int = -1
    accesses: list[tuple[int, AccessType]] = field(default_factory=list)
    is_input: bool = False
    is_output: bool = False


def compute_command_attributes(c: NnetComputation, nnet, variables: ComputationVariables
                               ) -> tuple[list[CommandAttributes], list[list]]:
    """Attributes of every command, and its raw (submatrix, access) pairs."""
    attrs = []
    raw = []
    empty = np.zeros(0, dtype=np.int64)
    for cmd in c.commands:
        pairs = command_accesses(c, nnet, cmd)
        raw.append(pairs)
        rd = [variables.submatrix_variables(s) for s, a in pairs if a & AccessType.READ and s]
        wr = [variables.submatrix_variables(s) for s, a in pairs if a & AccessType.WRITE and s]
        sr = sorted({s for s, a in pairs if a & AccessType.READ and s})
        sw = sorted({s for s, a in pairs if a & AccessType.WRITE and s})
        side = False
        if cmd.type is CT.BACKPROP:
            side = True  # model update
        elif cmd.type is CT.PROPAGATE and cmd.alpha == 2.0:
            side = True  # stored stats
        attrs.append(CommandAttributes(
            np.unique(np.concatenate(rd)) if rd else empty,
            np.unique(np.concatenate(wr)) if wr else empty,
            sr, sw,
            sorted({c.submatrices[s].matrix for s in sr}),
            sorted({c.submatrices[s].matrix for s in sw}),
            side))
    return attrs, raw


def compute_variable_accesses(attrs: list[CommandAttributes], num_variables: int
                              ) -> VariableAccesses:
    vs, cs, acc = [], [], []
    for i, a in enumerate(attrs):
        if len(a.variables_read):
            vs.append(a.variables_read)
            cs.append(np.full(len(a.variables_read), i, dtype=np.int64))
            acc.append(np.full(len(a.variables_read), int(AccessType.READ), dtype=np.int8))
        if len(a.variables_written):
            vs.append(a.variables_written)
            cs.append(np.full(len(a.variables_written), i, dtype=np.int64))
            acc.append(np.full(len(a.variables_written), int(AccessType.WRITE), dtype=np.int8))
    if not vs:
        return VariableAccesses(np.zeros(num_variables + 1, dtype=np.int64),
                                np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int8))
    v = np.concatenate(vs)
    cmd = np.concatenate(cs)
    a = np.concatenate(acc)
    order = np.lexsort((cmd, v))
    v, cmd, a = v[order], cmd[order], a[order]
    # merge the read and write entries of one command on one variable
    key_change = np.ones(len(v), dtype=bool)
    key_change[1:] = (v[1:] != v[:-1]) | (cmd[1:] != cmd[:-1])
    group = np.cumsum(key_change) - 1
    merged = np.zeros(int(group[-1]) + 1, dtype=np.int8)
    np.bitwise_or.at(merged, group, a)
    v, cmd = v[key_change], cmd[key_change]
    ptr = np.zeros(num_variables + 1, dtype=np.int64)
    np.add.at(ptr, v + 1, 1)
    return VariableAccesses(np.cumsum(ptr), cmd, merged)


def compute_matrix_accesses(c: NnetComputation, raw: list[list]) -> list[MatrixAccesses]:
    mats = [MatrixAccesses() for _ in c.matrices]
    for i, cmd in enumerate(c.commands):
        t = cmd.type
        if t is CT.ALLOC_MATRIX:
            mats[cmd.matrix].allocate_command = i
            continue
        if t is CT.DEALLOC_MATRIX:
            mats[cmd.matrix].deallocate_command = i
            continue
        if t is CT.SWAP_MATRIX:
            # matrix takes over src_matrix's data: an allocation of one, a
            # deallocation of the other
            mats[cmd.matrix].allocate_command = i
            mats[cmd.src_matrix].deallocate_command = i
            continue
        per_matrix: dict[int, int] = {}
        for s, a in raw[i]:
            m = c.submatrices[s].matrix
            per_matrix[m] = per_matrix.get(m, 0) | int(a)
        for m, a in per_matrix.items():
            mats[m].accesses.append((i, AccessType(a)))
        if t is CT.ACCEPT_INPUT:
            mats[c.submatrices[cmd.dst].matrix].is_input = True
        elif t is CT.PROVIDE_OUTPUT:
            m = c.submatrices[cmd.src].matrix
            mats[m].is_output = True
            if cmd.release:  # handed over: the matrix ends here
                mats[m].deallocate_command = i
    return mats
