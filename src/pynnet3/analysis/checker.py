"""The computation checker: proves a computation is well formed and runnable.

:func:`check_computation` raises :class:`pynnet3.errors.CheckError` naming the
command (index and listing) and, where relevant, the variable at fault. It checks

* indexes: dims positive, submatrices inside their matrix, every command's
  fields valid for its type (dims agree, index tables in range, components'
  input/output dims, I/O commands on the right kind of node);
* command order: backprops only after the forward/backward marker, a propagate
  after a backprop only as a recomputation (no memo, no stored stats), each memo
  produced once before it is consumed;
* undefined data: the first access of every variable after allocation is a
  plain write (a read, or a partial write, of undefined data is an error);
* matrix lifetimes: allocated once before any use (inputs by their accept
  command), deallocated at most once after the last use, and deallocated
  unless handed to the user;
* compression: a compressed matrix is not accessed before it is decompressed.
"""

from __future__ import annotations

import numpy as np

from ..components.base import Flags
from ..computation import CommandType as CT
from ..computation import NnetComputation, rects_overlap
from ..errors import CheckError
from ..index import unique_keys
from .accesses import AccessType, has_command_type
from .analyzer import Analyzer


class _Checker:
    def __init__(self, c: NnetComputation, nnet, context: str):
        self.c = c
        self.nnet = nnet
        self.context = context

    def fail(self, msg: str, i: int | None = None):
        from ..compiler.printing import command_text

        where = f" ({self.context})" if self.context else ""
        if i is not None:
            msg = f"command {i} `{command_text(self.c, self.c.commands[i]).strip()}`: {msg}"
        raise CheckError(f"computation check failed{where}: {msg}")

    # -- indexes ------------------------------------------------------------------------
    def sub_ok(self, s: int, i: int, what: str, allow_empty: bool = False):
        if s == 0 and allow_empty:
            return None
        if not (0 < s < len(self.c.submatrices)):
            self.fail(f"{what}: submatrix {s} out of range", i)
        return self.c.submatrices[s]

    def check_indexes(self):
        c = self.c
        for m, info in enumerate(c.matrices[1:], 1):
            if info.rows <= 0 or info.cols <= 0:
                self.fail(f"matrix m{m} has size {info.rows}x{info.cols}")
            if info.indexes is not None and len(info.indexes) != info.rows:
                self.fail(f"matrix m{m}: debug indexes have {len(info.indexes)} rows, "
                          f"matrix has {info.rows}")
        for s, sm in enumerate(c.submatrices[1:], 1):
            if not (0 < sm.matrix < len(c.matrices)):
                self.fail(f"submatrix {s} names matrix {sm.matrix}, out of range")
            info = c.matrices[sm.matrix]
            if sm.row_offset < 0 or sm.num_rows <= 0 or sm.row_offset + sm.num_rows > info.rows \
                    or sm.col_offset < 0 or sm.num_cols <= 0 \
                    or sm.col_offset + sm.num_cols > info.cols:
                self.fail(f"submatrix {s} {sm} does not fit matrix m{sm.matrix} "
                          f"({info.rows}x{info.cols})")
        nodes = self.nnet.node_map
        labels = set()
        for i, cmd in enumerate(c.commands):
            t = cmd.type
            if t in (CT.ALLOC_MATRIX, CT.DEALLOC_MATRIX):
                if not (0 < cmd.matrix < len(c.matrices)):
                    self.fail(f"matrix {cmd.matrix} out of range", i)
            elif t is CT.SWAP_MATRIX:
                for m in (cmd.matrix, cmd.src_matrix):
                    if not (0 < m < len(c.matrices)):
                        self.fail(f"matrix {m} out of range", i)
                a, b = c.matrices[cmd.matrix], c.matrices[cmd.src_matrix]
                if cmd.matrix == cmd.src_matrix or (a.rows, a.cols) != (b.rows, b.cols):
                    self.fail("swapped matrices must be distinct and of equal size", i)
            elif t is CT.SET_CONST:
                self.sub_ok(cmd.dst, i, "dst")
            elif t in (CT.PROPAGATE, CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE):
                self.check_component_command(i, cmd)
            elif t in (CT.MATRIX_COPY, CT.MATRIX_ADD):
                d, s = self.sub_ok(cmd.dst, i, "dst"), self.sub_ok(cmd.src, i, "src")
                if (d.num_rows, d.num_cols) != (s.num_rows, s.num_cols):
                    self.fail("dst and src dims differ", i)
                if d.matrix == s.matrix and rects_overlap(d, s) and cmd.dst != cmd.src:
                    self.fail("dst and src overlap", i)
            elif t in (CT.COPY_ROWS, CT.ADD_ROWS):
                d, s = self.sub_ok(cmd.dst, i, "dst"), self.sub_ok(cmd.src, i, "src")
                if not (0 <= cmd.table < len(c.indexes)):
                    self.fail(f"index table {cmd.table} out of range", i)
                tab = c.indexes[cmd.table]
                if len(tab) != d.num_rows or d.num_cols != s.num_cols:
                    self.fail(f"table has {len(tab)} rows for dst {d.num_rows}x{d.num_cols}, "
                              f"src {s.num_rows}x{s.num_cols}", i)
                if len(tab) and (tab.min() < -1 or tab.max() >= s.num_rows):
                    self.fail(f"table value out of range [-1, {s.num_rows})", i)
                if d.matrix == s.matrix and rects_overlap(d, s):
                    self.fail("dst and src overlap", i)
            elif t in (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI,
                       CT.ADD_TO_ROWS_MULTI):
                main = self.sub_ok(cmd.dst if t in (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI)
                                   else cmd.src, i, "dst/src")
                if not (0 <= cmd.table < len(c.indexes_multi)):
                    self.fail(f"multi index table {cmd.table} out of range", i)
                tab = c.indexes_multi[cmd.table]
                if tab.ndim != 2 or len(tab) != main.num_rows:
                    self.fail(f"multi table has {len(tab)} rows, expected {main.num_rows}", i)
                none = tab[:, 0] == -1
                if np.any(tab[none, 1] != -1):
                    self.fail("multi table entry (-1, r) with r != -1", i)
                for s in unique_keys(tab[~none, 0]).tolist():
                    sm = self.sub_ok(int(s), i, "multi table submatrix")
                    rows = tab[tab[:, 0] == s, 1]
                    if rows.min() < 0 or rows.max() >= sm.num_rows or sm.num_cols != main.num_cols:
                        self.fail(f"multi table rows out of range for submatrix {s}", i)
                    if sm.matrix == main.matrix and rects_overlap(sm, main):
                        self.fail("multi table submatrix overlaps the other operand", i)
            elif t is CT.ADD_ROW_RANGES:
                d, s = self.sub_ok(cmd.dst, i, "dst"), self.sub_ok(cmd.src, i, "src")
                if not (0 <= cmd.table < len(c.indexes_ranges)):
                    self.fail(f"range table {cmd.table} out of range", i)
                tab = c.indexes_ranges[cmd.table]
                if len(tab) != d.num_rows or d.num_cols != s.num_cols:
                    self.fail("range table / dims mismatch", i)
                if len(tab) and (tab.min() < 0 or tab.max() > s.num_rows
                                 or np.any(tab[:, 0] > tab[:, 1])):
                    self.fail("row range out of range", i)
            elif t in (CT.ACCEPT_INPUT, CT.PROVIDE_OUTPUT):
                s = cmd.dst if t is CT.ACCEPT_INPUT else cmd.src
                sm = self.sub_ok(s, i, "matrix")
                node = nodes.get(cmd.node)
                want = "output-node" if (t is CT.ACCEPT_INPUT) == cmd.is_deriv else "input-node"
                if node is None or node.kind != want:
                    self.fail(f"node {cmd.node!r} is not an {want}", i)
                if sm.num_cols != self.nnet.node_dim(cmd.node):
                    self.fail(f"{sm.num_cols} columns for node {cmd.node!r} of dim "
                              f"{self.nnet.node_dim(cmd.node)}", i)
                info = c.matrices[sm.matrix]
                if t is CT.PROVIDE_OUTPUT and cmd.release and \
                        (sm.num_rows, sm.num_cols) != (info.rows, info.cols):
                    self.fail("only a whole matrix can be released to the user", i)
            elif t in (CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX):
                s = cmd.dst if cmd.dst else (c.whole(cmd.matrix) if cmd.matrix else 0)
                self.sub_ok(s, i, "matrix")
            elif t is CT.NO_OPERATION_LABEL:
                labels.add(i)
            elif t is CT.GOTO_LABEL:
                if cmd.label not in labels or \
                        c.commands[cmd.label].type is not CT.NO_OPERATION_LABEL:
                    self.fail(f"goto target {cmd.label} is not an earlier label", i)

    def check_component_command(self, i: int, cmd):
        node = self.nnet.node_map.get(cmd.node)
        if node is None or node.kind != "component-node":
            self.fail(f"{cmd.node!r} is not a component node", i)
        comp = self.nnet.components[node.component]
        props = comp.properties()
        if not (0 <= cmd.precomputed < len(self.c.precomputed)):
            self.fail(f"precomputed index {cmd.precomputed} out of range", i)
        if cmd.memo and not props & Flags.USES_MEMO:
            self.fail("memo given to a component that uses none", i)
        if cmd.type is CT.PROPAGATE:
            if cmd.deriv_table != -1:
                self.fail("a propagate with an input-derivative block table", i)
            ov = self.sub_ok(cmd.out_value, i, "out_value")
            if cmd.table != -1:  # input read as column blocks
                if ov.num_cols != comp.output_dim:
                    self.fail(f"out_value has {ov.num_cols} columns, the component's "
                              f"output dim is {comp.output_dim}", i)
                self.check_blocks(i, cmd, comp, ov)
                return
            if cmd.in_value == 0 and not props & Flags.SIMPLE:
                iv = None  # a non-simple component whose outputs need no input rows
            else:
                iv = self.sub_ok(cmd.in_value, i, "in_value")
            if (iv is not None and iv.num_cols != comp.input_dim) \
                    or ov.num_cols != comp.output_dim:
                self.fail(f"dims {iv.num_cols if iv else '-'}->{ov.num_cols}, component "
                          f"{comp.input_dim}->{comp.output_dim}", i)
            if props & Flags.SIMPLE and iv is not None and iv.num_rows != ov.num_rows:
                self.fail("simple component with different input and output rows", i)
            return
        c = self.c
        od = self.sub_ok(cmd.out_deriv, i, "out_deriv")
        if od.num_cols != comp.output_dim:
            self.fail("out_deriv dim differs from the component's output dim", i)
        if cmd.table != -1:  # input value read as column blocks
            self.check_blocks(i, cmd, comp, od)
        elif props & Flags.BACKPROP_NEEDS_INPUT:
            iv = self.sub_ok(cmd.in_value, i, "in_value (component needs its input)")
            if iv.num_cols != comp.input_dim:
                self.fail("in_value dim differs from the component's input dim", i)
        if props & Flags.BACKPROP_NEEDS_OUTPUT:
            ov = self.sub_ok(cmd.out_value, i, "out_value (component needs its output)")
            if ov.num_cols != comp.output_dim or ov.num_rows != od.num_rows:
                self.fail("out_value and out_deriv dims differ", i)
        if cmd.in_deriv:
            idr = self.sub_ok(cmd.in_deriv, i, "in_deriv")
            if idr.num_cols != comp.input_dim:
                self.fail("in_deriv dim differs from the component's input dim", i)
            if props & Flags.SIMPLE and idr.num_rows != od.num_rows:
                self.fail("simple component with different in_deriv and out_deriv rows", i)
            for s in c.indexes_blocks[cmd.table].tolist() if cmd.table != -1 else ():
                sm = c.submatrices[s]
                if sm.matrix == idr.matrix and rects_overlap(sm, idr):
                    self.fail(f"input block {s} overlaps in_deriv", i)
        if cmd.deriv_table != -1:
            self.check_deriv_blocks(i, cmd, comp, od)

    def check_deriv_blocks(self, i: int, cmd, comp, od):
        """A backprop adding its input derivative's column blocks to the submatrices
        ``indexes_blocks[deriv_table]``: each has out_deriv's rows, their widths sum
        to the input dim, and none overlaps what the backprop reads."""
        if cmd.in_deriv:
            self.fail("a backprop with both in_deriv and an input-derivative block table", i)
        if not getattr(comp, "deriv_blocks", False):
            self.fail("the component cannot add its input derivative to blocks", i)
        reads = [x for x in (cmd.in_value, cmd.out_value, cmd.out_deriv) if x]
        if cmd.table != -1:
            reads += self.c.indexes_blocks[cmd.table].tolist()
        self.check_block_table(i, cmd.deriv_table, "input-derivative block", comp, od,
                               reads, "a matrix the backprop reads")

    def check_block_table(self, i: int, table: int, label: str, comp, rows_of,
                          avoid: list[int], avoid_what: str) -> None:
        """Block table ``table`` of command ``i``: in range, a non-empty list of valid
        submatrices, each with ``rows_of``'s rows and overlapping none of ``avoid``,
        whose widths sum to the component's input dim."""
        c = self.c
        if not (0 <= table < len(c.indexes_blocks)):
            self.fail(f"block table {table} out of range", i)
        tab = c.indexes_blocks[table]
        if tab.ndim != 1 or not len(tab):
            self.fail(f"block table {table} is empty or not a list", i)
        avoided = [c.submatrices[x] for x in avoid]
        width = 0
        for s in tab.tolist():
            sm = self.sub_ok(s, i, label)
            if sm.num_rows != rows_of.num_rows:
                self.fail(f"{label} {s} has {sm.num_rows} rows, the output "
                          f"{rows_of.num_rows}", i)
            if any(r.matrix == sm.matrix and rects_overlap(r, sm) for r in avoided):
                self.fail(f"{label} {s} overlaps {avoid_what}", i)
            width += sm.num_cols
        if width != comp.input_dim:
            self.fail(f"{label}s have {width} columns, the component's input dim is "
                      f"{comp.input_dim}", i)

    def check_blocks(self, i: int, cmd, comp, ov):
        """A propagate or backprop reading its input value as column blocks
        (``indexes_blocks``); ``ov`` is its out_value (out_deriv for a backprop),
        whose rows the blocks must have and which they must not overlap."""
        if cmd.in_value:
            self.fail("a command with an input block table must have no in_value", i)
        method = "propagate_blocks" if cmd.type is CT.PROPAGATE else "backprop_blocks"
        if not hasattr(comp, method):
            self.fail(f"the component has no {method}: it cannot read its input as blocks", i)
        if cmd.type is CT.PROPAGATE and cmd.alpha == 2.0:
            self.fail("stored stats need the input as one matrix, not blocks", i)
        out = cmd.out_value if cmd.type is CT.PROPAGATE else cmd.out_deriv
        self.check_block_table(i, cmd.table, "input block", comp, ov, [out],
                               "the output (value or derivative)")

    # -- order ---------------------------------------------------------------------------
    def check_order(self):
        seen_marker = seen_backprop = False
        memo_made: dict[int, int] = {}
        memo_used: set[int] = set()
        for i, cmd in enumerate(self.c.commands):
            t = cmd.type
            if t is CT.NO_OPERATION_MARKER:
                seen_marker = True
            elif t is CT.PROPAGATE:
                # a propagate after a backprop must be a recomputation of a forward
                # value (optimize/recompute.py): no memo, no stored stats
                if seen_backprop and (cmd.memo or cmd.alpha == 2.0):
                    self.fail("propagate after a backprop (only a recomputation without "
                              "memo or stored stats may come there)", i)
                if cmd.memo:
                    if cmd.memo in memo_made:
                        self.fail(f"memo {cmd.memo} produced twice", i)
                    memo_made[cmd.memo] = i
            elif t in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE):
                if not seen_marker:
                    self.fail("backprop before the forward/backward marker", i)
                seen_backprop = True
                if cmd.memo:
                    if cmd.memo not in memo_made or cmd.memo in memo_used:
                        self.fail(f"memo {cmd.memo} not produced by an earlier propagate, "
                                  f"or consumed twice", i)
                    memo_used.add(cmd.memo)

    # -- data ----------------------------------------------------------------------------
    def check_undefined(self, a: Analyzer):
        va = a.variable_accesses
        has = va.ptr[1:] > va.ptr[:-1]
        first = va.ptr[:-1][has]
        bad = va.access[first] != int(AccessType.WRITE)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            v = int(np.flatnonzero(has)[k])
            i = int(va.command[first[k]])
            self.fail(f"reads undefined data of variable {a.variables.describe(v, self.c)} "
                      f"(its first access after allocation must be a full write)", i)

    def check_matrix_accesses(self, a: Analyzer):
        c = self.c
        allocs: dict[int, int] = {}
        deallocs: dict[int, int] = {}
        for i, cmd in enumerate(c.commands):
            if cmd.type is CT.ALLOC_MATRIX or cmd.type is CT.SWAP_MATRIX:
                if cmd.matrix in allocs:
                    self.fail(f"matrix m{cmd.matrix} allocated twice", i)
                allocs[cmd.matrix] = i
            released = cmd.type is CT.PROVIDE_OUTPUT and cmd.release
            if cmd.type is CT.DEALLOC_MATRIX or cmd.type is CT.SWAP_MATRIX or released:
                m = cmd.matrix if cmd.type is CT.DEALLOC_MATRIX else (
                    cmd.src_matrix if cmd.type is CT.SWAP_MATRIX
                    else c.submatrices[cmd.src].matrix)
                if m in deallocs:
                    self.fail(f"matrix m{m} deallocated twice", i)
                if cmd.type is CT.SWAP_MATRIX and m not in allocs and \
                        not a.matrix_accesses[m].is_input:
                    self.fail(f"matrix m{m} swapped from before it exists", i)
                deallocs[m] = i
        for m in range(1, len(c.matrices)):
            ma = a.matrix_accesses[m]
            if ma.is_input:
                accept = [i for i, _ in ma.accesses
                          if c.commands[i].type is CT.ACCEPT_INPUT]
                if ma.allocate_command != -1 and ma.allocate_command > accept[0]:
                    self.fail(f"input matrix m{m} allocated after its input is accepted",
                              ma.allocate_command)
                begin = accept[0] if ma.allocate_command == -1 else ma.allocate_command
                if ma.accesses and ma.accesses[0][0] < begin:
                    self.fail(f"matrix m{m} used before its input is accepted",
                              ma.accesses[0][0])
            elif ma.accesses:
                if ma.allocate_command == -1:
                    self.fail(f"matrix m{m} is used but never allocated", ma.accesses[0][0])
                if ma.accesses[0][0] < ma.allocate_command:
                    self.fail(f"matrix m{m} used before it is allocated (at command "
                              f"{ma.allocate_command})", ma.accesses[0][0])
            if ma.deallocate_command != -1:
                if ma.accesses and ma.accesses[-1][0] > ma.deallocate_command:
                    self.fail(f"matrix m{m} used after it is deallocated (at command "
                              f"{ma.deallocate_command})", ma.accesses[-1][0])
            elif not ma.is_output and (ma.accesses or ma.allocate_command != -1):
                self.fail(f"matrix m{m} ({c.matrices[m].node}) is never deallocated and "
                          f"not an output")

    def check_compression(self, a: Analyzer):
        compressed: dict[int, int] = {}
        for i, cmd in enumerate(self.c.commands):
            if cmd.type is CT.COMPRESS_MATRIX:
                m = self.c.submatrices[cmd.dst].matrix if cmd.dst else cmd.matrix
                compressed[m] = i
            elif cmd.type is CT.DECOMPRESS_MATRIX:
                m = self.c.submatrices[cmd.dst].matrix if cmd.dst else cmd.matrix
                if compressed.pop(m, None) is None:
                    self.fail(f"matrix m{m} decompressed but not compressed", i)
            elif compressed:
                # every submatrix the command touches, through index tables too
                for s, _ in a.raw_accesses[i]:
                    if s and self.c.submatrices[s].matrix in compressed:
                        self.fail(f"matrix m{self.c.submatrices[s].matrix} accessed while "
                                  f"compressed", i)
                if cmd.type is CT.DEALLOC_MATRIX and cmd.matrix in compressed:
                    self.fail(f"matrix m{cmd.matrix} deallocated while compressed", i)


def check_computation(computation: NnetComputation, nnet, context: str = "",
                      analyzer: Analyzer | None = None) -> Analyzer:
    """Check every invariant; raise CheckError naming the command and variable at
    fault (``context``, e.g. the pass that just ran, is part of the message).
    Returns the Analyzer it built, for reuse."""
    ch = _Checker(computation, nnet, context)
    ch.check_indexes()
    ch.check_order()
    looped = has_command_type(computation, CT.GOTO_LABEL)
    a = analyzer or Analyzer(computation, nnet)
    if not looped:  # straight-line reasoning does not hold across a goto
        ch.check_undefined(a)
        ch.check_matrix_accesses(a)
    ch.check_compression(a)
    return a
