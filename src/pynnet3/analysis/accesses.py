"""What each command reads and writes, per variable and per matrix.

* :func:`command_accesses` lists ``(submatrix, AccessType)`` for one command,
  following each command type's semantics (a partial write — a row op whose
  table has -1 entries, a scatter into some rows, an ``*_ADDS`` component — is a
  read-write, because the untouched part must already be defined).
* :class:`AccessTable` is the same for every command at once, as flat numpy
  arrays (one entry per pair, in command order), with the sizing commands'
  effect on each matrix; every other structure here is derived from it with
  vectorized numpy, so building it (one Python loop over the commands) is the
  only per-command cost of an analysis.
* :class:`CommandAttributes` is the per-command summary (variables, submatrices and
  matrices read / written, side effects such as model updates or stored stats).
* :class:`VariableAccesses` holds, for every variable, the commands touching it in
  order, as flat numpy arrays (CSR layout) so passes can query slices cheaply.
* :class:`MatrixAccesses` holds, for every matrix, the allocating and
  deallocating command, the commands accessing it, and whether it is a user input
  or output; :class:`MatrixAccessArrays` is the same for all matrices as CSR arrays.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from ..components.base import Flags
from ..computation import Command, NnetComputation
from ..computation import CommandType as CT
from ..index import unique_keys
from .session import current_session
from .variables import ComputationVariables, submatrix_array


class AccessType(enum.IntEnum):
    READ = 1
    WRITE = 2
    READ_WRITE = 3  # bitwise or of the two


_R, _W, _RW = 1, 2, 3
#: AccessType by int value (avoids the enum constructor in hot loops)
ACCESS_TYPES = (None, AccessType.READ, AccessType.WRITE, AccessType.READ_WRITE)
_BACKPROPS = (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)


class PropertyCache:
    """Component properties by node name, as plain ints (``int(Flags)``: bit tests
    on an IntFlag run Python code), looked up once per analysis (properties may
    change with the network's mode, so the cache lives as long as one build, or one
    optimizer session: the network does not change while it is optimized)."""

    __slots__ = ("nnet", "props", "by_component", "node_map")

    def __init__(self, nnet):
        self.nnet = nnet
        self.props: dict[str, int] = {}
        self.by_component: dict[str, int] = {}
        self.node_map = None

    def __call__(self, node: str) -> int:
        p = self.props.get(node)
        if p is None:
            if self.node_map is None:
                self.node_map = self.nnet.node_map
            name = self.node_map[node].component
            p = self.by_component.get(name)
            if p is None:
                p = self.by_component[name] = int(self.nnet.components[name].properties())
            self.props[node] = p
        return p


_TYPE = attrgetter("type")


def command_types(c: NnetComputation) -> list[CT]:
    """The type of every command (one C-level pass; ``t in command_types(c)`` then
    tests presence without a Python loop)."""
    return list(map(_TYPE, c.commands))


def has_command_type(c: NnetComputation, *types: CT) -> bool:
    """Whether any command of ``c`` has one of ``types``."""
    present = command_types(c)
    return any(t in present for t in types)


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
        elif cmd.table >= 0:  # input read as column blocks
            out += [(s, R) for s in block_submatrices(c, cmd.table)]
        out.append((cmd.out_value, RW if props & Flags.PROPAGATE_ADDS else W))
    elif t in _BACKPROPS:
        props = _component(nnet, cmd).properties()
        for s in (cmd.in_value, cmd.out_value, cmd.out_deriv):
            if s:
                out.append((s, R))
        if not cmd.in_value and cmd.table >= 0:  # input value read as column blocks
            out += [(s, R) for s in block_submatrices(c, cmd.table)]
        if cmd.in_deriv:
            out.append((cmd.in_deriv, RW if props & Flags.BACKPROP_ADDS else W))
        elif cmd.deriv_table >= 0:  # input derivative added to column blocks
            out += [(s, RW) for s in block_submatrices(c, cmd.deriv_table)]
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
        reads, partial = _gather_multi(c.indexes_multi[cmd.table], t is CT.ADD_ROWS_MULTI)
        out += [(s, R) for s in reads]
        out.append((cmd.dst, RW if partial else W))
    elif t in (CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI):
        out.append((cmd.src, R))
        out += [(s, ACCESS_TYPES[a]) for s, a in
                _scatter_multi(c, c.indexes_multi[cmd.table], t is CT.COPY_TO_ROWS_MULTI)]
    elif t is CT.ADD_ROW_RANGES:
        out += [(cmd.src, R), (cmd.dst, RW)]
    elif t is CT.ACCEPT_INPUT:
        out.append((cmd.dst, W))
    elif t is CT.PROVIDE_OUTPUT:
        out.append((cmd.src, R))
    elif t in (CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX):
        out.append((cmd.dst if cmd.dst else c.whole(cmd.matrix), RW))
    return out


def block_submatrices(c: NnetComputation, table: int) -> list[int]:
    """The distinct submatrices of block table ``table`` (of a propagate or
    backprop whose input value is read as column blocks, or of a backprop adding
    its input derivative to column blocks), in first-use order."""
    return list(dict.fromkeys(c.indexes_blocks[table].tolist()))


def _gather_multi(tab: np.ndarray, adds: bool) -> tuple[list[int], bool]:
    """Submatrices a ``*_ROWS_MULTI`` gather reads (ascending) and whether its
    destination write is partial."""
    subs = unique_keys(tab[:, 0])
    return subs[subs > 0].tolist(), adds or bool(len(subs) and subs[0] < 0)


def _scatter_multi(c: NnetComputation, tab: np.ndarray, copy: bool) -> list[tuple[int, int]]:
    """(submatrix, access int) written by a ``*_TO_ROWS_MULTI`` scatter: a full
    write only for a copy that sets every row of the submatrix."""
    out = []
    subs = unique_keys(tab[:, 0])
    for s in subs[subs > 0].tolist():
        full = False
        if copy:
            rows = tab[tab[:, 0] == s, 1]
            full = len(unique_keys(rows)) == c.submatrices[s].num_rows
        out.append((s, _W if full else _RW))
    return out


@dataclass
class AccessTable:
    """Every command's ``(submatrix, access)`` pairs as flat arrays: entry ``k`` is
    command ``cmd[k]`` accessing submatrix ``sub[k]`` with ``acc[k]`` (AccessType
    value), in command order and, within a command, in :func:`command_accesses`
    order. Per matrix (index 0 unused): ``alloc`` / ``dealloc`` (the last
    ALLOC_MATRIX / SWAP_MATRIX naming it as destination, the last DEALLOC_MATRIX /
    SWAP_MATRIX source / releasing PROVIDE_OUTPUT; -1: none), ``is_input`` /
    ``is_output`` (named by ACCEPT_INPUT / PROVIDE_OUTPUT). ``zeroing[i]``: command
    ``i`` is SET_CONST 0. ``sub_matrix[s]``: the matrix of submatrix ``s``.
    ``alloc_only`` / ``dealloc_only``: the same from ALLOC_MATRIX / DEALLOC_MATRIX
    alone; ``accept``: the first ACCEPT_INPUT of each input matrix (-1 otherwise);
    ``component_commands``: the propagate / backprop commands. The arrays are
    read-only (analyses hand them out to passes without copying)."""

    num_commands: int
    cmd: np.ndarray
    sub: np.ndarray
    acc: np.ndarray
    alloc: np.ndarray
    dealloc: np.ndarray
    is_input: np.ndarray
    is_output: np.ndarray
    zeroing: np.ndarray
    side_effects: np.ndarray
    sub_array: np.ndarray
    sub_matrix: np.ndarray
    alloc_only: np.ndarray
    dealloc_only: np.ndarray
    accept: np.ndarray
    component_commands: list[int]

    @property
    def matrix(self) -> np.ndarray:
        """Matrix of each entry."""
        return self.sub_matrix[self.sub]


def build_access_table(c: NnetComputation, nnet, props: PropertyCache | None = None
                       ) -> AccessTable:
    """The :class:`AccessTable` of ``c`` (one pass over the commands; inside an
    optimizer session the component properties come from the session's cache, see
    :mod:`.session`). Its arrays are read-only."""
    return _build_access_table(c, nnet, property_cache(c, nnet) if props is None else props)


def property_cache(c: NnetComputation, nnet) -> PropertyCache:
    """A :class:`PropertyCache` for analyses of ``c``: the open optimizer session's,
    shared by its analyses (the network does not change while a session is open),
    else a new one."""
    s = current_session(c, nnet)
    if s is None:
        return PropertyCache(nnet)
    if s.props is None:
        s.props = PropertyCache(nnet)
    return s.props


def _build_access_table(c: NnetComputation, nnet, props: PropertyCache) -> AccessTable:
    node_props = props.props.get  # props() for a node seen before, without the call
    nm = len(c.matrices)
    # the (command, submatrix, access) triples, flattened: one extend() per command
    # costs less than three appends per pair
    flat: list[int] = []
    put = flat.extend
    arr = _array
    alloc_only = [-1] * nm
    dealloc_only = [-1] * nm
    # (command, matrix) of the rarer events that also allocate / free a matrix (a
    # swap, a releasing output): alloc / dealloc are alloc_only / dealloc_only
    # updated with them after the loop, so a sizing command costs one store
    alloc_more: list[tuple[int, int]] = []
    dealloc_more: list[tuple[int, int]] = []
    accept = [-1] * nm
    comp_cmds: list[int] = []
    is_output = [False] * nm
    n = len(c.commands)
    zeroing_l: list[int] = []
    side_l: list[int] = []
    R, W, RW = _R, _W, _RW
    submatrices = c.submatrices
    rows_partial: dict[int, bool] = {}
    multi_cache: dict[tuple, list] = {}
    PA, BA = int(Flags.PROPAGATE_ADDS), int(Flags.BACKPROP_ADDS)
    # command types as locals: an Enum class attribute lookup costs more than a test
    _ALLOC_MATRIX, _DEALLOC_MATRIX, _SWAP_MATRIX = CT.ALLOC_MATRIX, CT.DEALLOC_MATRIX, \
        CT.SWAP_MATRIX
    _SET_CONST, _MATRIX_COPY, _MATRIX_ADD = CT.SET_CONST, CT.MATRIX_COPY, CT.MATRIX_ADD
    _PROPAGATE, _BACKPROP, _BACKPROP_NO_MODEL_UPDATE = CT.PROPAGATE, CT.BACKPROP, \
        CT.BACKPROP_NO_MODEL_UPDATE
    _COPY_ROWS, _ADD_ROWS, _ADD_ROW_RANGES = CT.COPY_ROWS, CT.ADD_ROWS, CT.ADD_ROW_RANGES
    _COPY_ROWS_MULTI, _ADD_ROWS_MULTI = CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI
    _COPY_TO_ROWS_MULTI, _ADD_TO_ROWS_MULTI = CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI
    _ACCEPT_INPUT, _PROVIDE_OUTPUT = CT.ACCEPT_INPUT, CT.PROVIDE_OUTPUT
    _COMPRESS_MATRIX, _DECOMPRESS_MATRIX = CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX
    for i, cmd in enumerate(c.commands):
        t = cmd.type
        if t is _ALLOC_MATRIX:
            alloc_only[cmd.matrix] = i
        elif t is _DEALLOC_MATRIX:
            dealloc_only[cmd.matrix] = i
        elif t is _SET_CONST:
            put((i, cmd.dst, W))
            if cmd.alpha == 0.0:
                zeroing_l.append(i)
        elif t is _MATRIX_COPY:
            put((i, cmd.src, R, i, cmd.dst, W))
        elif t is _PROPAGATE:
            if cmd.in_value:
                put((i, cmd.in_value, R))
            elif cmd.table >= 0:  # input read as column blocks
                for s in block_submatrices(c, cmd.table):
                    put((i, s, R))
            p = node_props(cmd.node)
            if p is None:
                p = props(cmd.node)
            put((i, cmd.out_value, RW if p & PA else W))
            if cmd.alpha == 2.0:
                side_l.append(i)  # stored stats
            comp_cmds.append(i)
        elif t is _MATRIX_ADD or t is _ADD_ROWS or t is _ADD_ROW_RANGES:
            put((i, cmd.src, R, i, cmd.dst, RW))
        elif t is _BACKPROP or t is _BACKPROP_NO_MODEL_UPDATE:
            for s in (cmd.in_value, cmd.out_value, cmd.out_deriv):
                if s:
                    put((i, s, R))
            if not cmd.in_value and cmd.table >= 0:  # input value read as column blocks
                for s in block_submatrices(c, cmd.table):
                    put((i, s, R))
            if cmd.in_deriv:
                p = node_props(cmd.node)
                if p is None:
                    p = props(cmd.node)
                put((i, cmd.in_deriv, RW if p & BA else W))
            elif cmd.deriv_table >= 0:  # input derivative added to column blocks
                for s in block_submatrices(c, cmd.deriv_table):
                    put((i, s, RW))
            if t is _BACKPROP:
                side_l.append(i)  # model update
            comp_cmds.append(i)
        elif t is _SWAP_MATRIX:
            alloc_more.append((i, cmd.matrix))
            dealloc_more.append((i, cmd.src_matrix))
        elif t is _COPY_ROWS:
            p = rows_partial.get(cmd.table)
            if p is None:
                p = rows_partial[cmd.table] = bool((c.indexes[cmd.table] < 0).any())
            put((i, cmd.src, R, i, cmd.dst, RW if p else W))
        elif t is _COPY_ROWS_MULTI or t is _ADD_ROWS_MULTI:
            key = ("g", cmd.table, t is _ADD_ROWS_MULTI)
            got = multi_cache.get(key)
            if got is None:
                got = multi_cache[key] = _gather_multi(c.indexes_multi[cmd.table], key[2])
            reads, partial = got
            for s in reads:
                put((i, s, R))
            put((i, cmd.dst, RW if partial else W))
        elif t is _COPY_TO_ROWS_MULTI or t is _ADD_TO_ROWS_MULTI:
            put((i, cmd.src, R))
            key = ("s", cmd.table, t is _COPY_TO_ROWS_MULTI)
            got = multi_cache.get(key)
            if got is None:
                got = multi_cache[key] = _scatter_multi(c, c.indexes_multi[cmd.table], key[2])
            for s, a in got:
                put((i, s, a))
        elif t is _ACCEPT_INPUT:
            put((i, cmd.dst, W))
            m = submatrices[cmd.dst].matrix
            if accept[m] == -1:
                accept[m] = i
        elif t is _PROVIDE_OUTPUT:
            put((i, cmd.src, R))
            m = submatrices[cmd.src].matrix
            is_output[m] = True
            if cmd.release:  # handed over: the matrix ends here
                dealloc_more.append((i, m))
        elif t is _COMPRESS_MATRIX or t is _DECOMPRESS_MATRIX:
            put((i, cmd.dst if cmd.dst else c.whole(cmd.matrix), RW))
    alloc_only_arr, dealloc_only_arr = arr(alloc_only, np.int64), arr(dealloc_only, np.int64)
    accept_arr = arr(accept, np.int64)
    zeroing = np.zeros(n, dtype=bool)
    zeroing[zeroing_l] = True
    side = np.zeros(n, dtype=bool)
    side[side_l] = True
    sub_arr = submatrix_array(c)
    # rows of the transposed copy are contiguous: command, submatrix, access
    cmds, subs, accs = arr(flat, np.int64).reshape(-1, 3).T.copy()
    arrays = (cmds, subs, accs.astype(np.int8),
              _latest(alloc_only, alloc_only_arr, alloc_more),
              _latest(dealloc_only, dealloc_only_arr, dealloc_more), accept_arr != -1,
              arr(is_output, bool), zeroing, side, sub_arr, sub_arr[:, 0],
              alloc_only_arr, dealloc_only_arr, accept_arr)
    for a in arrays:  # handed to passes without copying
        a.setflags(write=False)
    return AccessTable(n, *arrays, comp_cmds)


def _latest(last: list[int], last_arr: np.ndarray, events: list[tuple[int, int]]
            ) -> np.ndarray:
    """Per matrix, the last command naming it: ``last`` (as ``last_arr``) updated with
    the ``(command, matrix)`` ``events`` (the last is the largest command index)."""
    if not events:
        return last_arr
    out = last.copy()
    for i, m in events:
        if i > out[m]:
            out[m] = i
    return _array(out, np.int64)


def _array(values: list, dtype) -> np.ndarray:
    """``values`` as an array (``fromiter`` skips ``np.array``'s nesting checks)."""
    return np.fromiter(values, dtype=dtype, count=len(values))


def _or_groups(key: np.ndarray, acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort by ``key`` and OR together the ``acc`` of equal keys: (keys, ors)."""
    if not len(key):
        return key, acc
    order = np.argsort(key, kind="stable")
    k, a = key[order], acc[order]
    start = np.ones(len(k), dtype=bool)
    start[1:] = k[1:] != k[:-1]
    idx = np.flatnonzero(start)
    return k[idx], np.bitwise_or.reduceat(a, idx).astype(np.int8)


@dataclass
class MatrixAccessArrays:
    """For matrix ``m``: ``command[ptr[m]:ptr[m+1]]`` are the commands (other than
    sizing commands) that access it, ascending, one entry per command, and
    ``access[...]`` their OR-ed AccessType values."""

    ptr: np.ndarray
    command: np.ndarray
    access: np.ndarray

    def first(self, none: int) -> np.ndarray:
        """First accessing command of each matrix (``none`` where there is none)."""
        has = self.ptr[1:] > self.ptr[:-1]
        out = np.full(len(self.ptr) - 1, none, dtype=np.int64)
        out[has] = self.command[self.ptr[:-1][has]]
        return out

    def last(self, none: int = -1) -> np.ndarray:
        """Last accessing command of each matrix (``none`` where there is none)."""
        has = self.ptr[1:] > self.ptr[:-1]
        out = np.full(len(self.ptr) - 1, none, dtype=np.int64)
        out[has] = self.command[self.ptr[1:][has] - 1]
        return out


def matrix_access_arrays(table: AccessTable, num_matrices: int) -> MatrixAccessArrays:
    n = max(table.num_commands, 1)
    key, acc = _or_groups(table.matrix * n + table.cmd, table.acc)
    m, cmd = np.divmod(key, n)
    ptr = np.zeros(num_matrices + 1, dtype=np.int64)
    np.cumsum(np.bincount(m, minlength=num_matrices), out=ptr[1:])
    return MatrixAccessArrays(ptr, cmd, acc)


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


def expand_to_variables(table: AccessTable, variables: ComputationVariables
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(variable, command, access) for every variable of every accessed submatrix
    (submatrix 0 skipped), in table order."""
    keep = table.sub > 0
    sub, cmd, acc = table.sub[keep], table.cmd[keep], table.acc[keep]
    vptr, vflat = variables.sub_ptr, variables.sub_vars
    lens = vptr[sub + 1] - vptr[sub]
    total = int(lens.sum())
    starts = np.repeat(vptr[sub] - (np.cumsum(lens) - lens), lens)
    var = vflat[starts + np.arange(total, dtype=np.int64)]
    return var, np.repeat(cmd, lens), np.repeat(acc, lens)


def compute_variable_accesses(table: AccessTable, variables: ComputationVariables
                              ) -> VariableAccesses:
    nv = variables.num_variables
    n = max(table.num_commands, 1)
    var, cmd, acc = expand_to_variables(table, variables)
    key, merged = _or_groups(var * n + cmd, acc)
    v, cmds = np.divmod(key, n)
    ptr = np.zeros(nv + 1, dtype=np.int64)
    np.cumsum(np.bincount(v, minlength=nv), out=ptr[1:])
    return VariableAccesses(ptr, cmds, merged.astype(np.int8))


def compute_command_attributes(c: NnetComputation, table: AccessTable,
                               variables: ComputationVariables) -> list[CommandAttributes]:
    """Attributes of every command."""
    n = table.num_commands
    var, cmd, acc = expand_to_variables(table, variables)
    empty = np.zeros(0, dtype=np.int64)

    def per_command(mask: np.ndarray) -> list[np.ndarray]:
        key = unique_keys(cmd[mask] * max(variables.num_variables, 1) + var[mask])
        cc, vv = np.divmod(key, max(variables.num_variables, 1))
        bounds = np.searchsorted(cc, np.arange(n + 1))
        return [vv[bounds[i]:bounds[i + 1]] if bounds[i + 1] > bounds[i] else empty
                for i in range(n)]

    rd = per_command((acc & _R) != 0)
    wr = per_command((acc & _W) != 0)
    sr: list[set] = [set() for _ in range(n)]
    sw: list[set] = [set() for _ in range(n)]
    for i, s, a in zip(table.cmd.tolist(), table.sub.tolist(), table.acc.tolist(),
                       strict=True):
        if s:
            if a & _R:
                sr[i].add(s)
            if a & _W:
                sw[i].add(s)
    subs = c.submatrices
    side = table.side_effects
    return [CommandAttributes(rd[i], wr[i], sorted(sr[i]), sorted(sw[i]),
                              sorted({subs[s].matrix for s in sr[i]}),
                              sorted({subs[s].matrix for s in sw[i]}), bool(side[i]))
            for i in range(n)]


def raw_accesses(table: AccessTable) -> list[list[tuple[int, AccessType]]]:
    """Per command, its (submatrix, AccessType) pairs (as :func:`command_accesses`)."""
    out: list[list] = [[] for _ in range(table.num_commands)]
    for i, s, a in zip(table.cmd.tolist(), table.sub.tolist(), table.acc.tolist(),
                       strict=True):
        out[i].append((s, ACCESS_TYPES[a]))
    return out


def compute_matrix_accesses(table: AccessTable, arrays: MatrixAccessArrays
                            ) -> MatrixAccessList:
    """One :class:`MatrixAccesses` per matrix, from the table and its CSR arrays."""
    return MatrixAccessList(table, arrays)


class MatrixAccessList(Sequence):
    """The :class:`MatrixAccesses` of every matrix (a read-only sequence indexed by
    matrix), each built on first use (callers that ask about a few matrices skip
    building the rest)."""

    def __init__(self, table: AccessTable, arrays: MatrixAccessArrays):
        self._ptr = arrays.ptr.tolist()
        self._command = arrays.command.tolist()
        self._access = arrays.access.tolist()
        self._alloc, self._dealloc = table.alloc.tolist(), table.dealloc.tolist()
        self._is_input, self._is_output = table.is_input.tolist(), table.is_output.tolist()
        self._items: list[MatrixAccesses | None] = [None] * (len(self._ptr) - 1)

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, m: int | slice):
        if isinstance(m, slice):
            return [self[i] for i in range(len(self))[m]]
        x = self._items[m]
        if x is None:
            m = range(len(self))[m]  # a negative index, as a list takes it
            a, b = self._ptr[m], self._ptr[m + 1]
            accesses = list(zip(self._command[a:b],
                                map(ACCESS_TYPES.__getitem__, self._access[a:b]), strict=True))
            x = self._items[m] = MatrixAccesses(self._alloc[m], self._dealloc[m], accesses,
                                                self._is_input[m], self._is_output[m])
        return x
