"""Translate a compiled forward computation into an fx graph of batched torch ops.

The computation was compiled for ONE sequence (n = 0); every command is applied to
N sequences at once on ``[N, rows, cols]`` tensors: row operations act on dim 1
with constant index tables, component propagates act per sequence through the
per-type functions of :mod:`pynnet3.export.ops`. Nothing here runs numerics; it
only records the graph. Commands are followed exactly as the runtime does
(``pynnet3.runtime.computer``); only the forward part (up to the first
``NO_OPERATION_MARKER``) is translated.
"""

from __future__ import annotations

import operator

import numpy as np
from torch import fx

from ..components.base import Flags
from ..computation import CommandType as CT
from ..computation import NnetComputation
from ..errors import ExportError
from .graph import GraphBuilder, MatrixValue
from .ops import propagate_op

_NOOPS = (CT.NO_OPERATION, CT.NO_OPERATION_PERMANENT, CT.NO_OPERATION_LABEL)


class Translator:
    """Holds the matrices' symbolic values while commands are translated."""

    def __init__(self, nnet, computation: NnetComputation, g: GraphBuilder):
        self.nnet = nnet
        self.c = computation
        self.g = g
        self.values: dict[int, MatrixValue] = {}

    # -- submatrix access -------------------------------------------------------------
    def _rect(self, s: int):
        sm = self.c.submatrices[s]
        m = self.values.get(sm.matrix)
        if m is None:
            raise ExportError(f"internal: submatrix {s} uses matrix m{sm.matrix}, which is "
                              "not allocated there")
        return m, sm.row_offset, sm.row_offset + sm.num_rows, sm.col_offset, \
            sm.col_offset + sm.num_cols

    def read(self, s: int) -> fx.Node:
        m, r0, r1, c0, c1 = self._rect(s)
        return m.read(self.g, r0, r1, c0, c1)

    def is_zero(self, s: int) -> bool:
        m, r0, r1, c0, c1 = self._rect(s)
        return m.is_zero(r0, r1, c0, c1)

    def write(self, s: int, node) -> None:
        m, r0, r1, c0, c1 = self._rect(s)
        m.write(r0, r1, c0, c1, node)

    def add_into(self, s: int, node) -> None:
        """dst += node (dst's zero parts cost nothing)."""
        if self.is_zero(s):
            self.write(s, node)
        else:
            self.write(s, self.g.call(operator.add, self.read(s), node))

    def rows_of(self, s: int) -> int:
        return self.c.submatrices[s].num_rows

    # -- commands -------------------------------------------------------------------------
    def run(self, inputs: dict[str, fx.Node]) -> dict[str, fx.Node]:
        """Translate the forward commands; ``inputs[node]`` is the ``[N, rows, dim]``
        value of each input node. Returns the provided outputs by node name."""
        outputs: dict[str, fx.Node] = {}
        g = self.g
        for cmd in self.c.commands:
            t = cmd.type
            if t is CT.NO_OPERATION_MARKER:
                break
            if t is CT.ACCEPT_INPUT:
                if cmd.is_deriv:
                    raise ExportError("export is forward only: the computation accepts an "
                                      f"output derivative for {cmd.node!r}")
                m = self.c.submatrices[cmd.dst].matrix
                if m not in self.values:  # accepting an input allocates its matrix
                    info = self.c.matrices[m]
                    self.values[m] = MatrixValue(info.rows, info.cols)
                self.write(cmd.dst, inputs[cmd.node])
            elif t is CT.PROVIDE_OUTPUT:
                if not cmd.is_deriv:
                    outputs[cmd.node] = self.read(cmd.src)
            elif t is CT.ALLOC_MATRIX:
                info = self.c.matrices[cmd.matrix]
                self.values[cmd.matrix] = MatrixValue(info.rows, info.cols)
            elif t is CT.DEALLOC_MATRIX:
                self.values.pop(cmd.matrix, None)
            elif t is CT.SWAP_MATRIX:
                a = self.values.pop(cmd.matrix, None)
                b = self.values.pop(cmd.src_matrix, None)
                if b is not None:
                    self.values[cmd.matrix] = b
                if a is not None:
                    self.values[cmd.src_matrix] = a
            elif t is CT.SET_CONST:
                m, r0, r1, c0, c1 = self._rect(cmd.dst)
                node = None if cmd.alpha == 0.0 else g.full(r1 - r0, c1 - c0, cmd.alpha)
                m.write(r0, r1, c0, c1, node)
            elif t is CT.PROPAGATE:
                self._propagate(cmd)
            elif t is CT.MATRIX_COPY:
                self.write(cmd.dst, g.scale(self.read(cmd.src), cmd.alpha))
            elif t is CT.MATRIX_ADD:
                if not self.is_zero(cmd.src):
                    self.add_into(cmd.dst, g.scale(self.read(cmd.src), cmd.alpha))
            elif t in (CT.COPY_ROWS, CT.ADD_ROWS):
                table = self.c.indexes[cmd.table]
                y = g.scale(g.gather_rows(self.read(cmd.src), table, self.rows_of(cmd.src)),
                            cmd.alpha)
                if t is CT.COPY_ROWS:
                    self.write(cmd.dst, y)
                else:
                    self.add_into(cmd.dst, y)
            elif t in (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI):
                y = g.scale(self._gather_multi(self.c.indexes_multi[cmd.table]), cmd.alpha)
                if t is CT.COPY_ROWS_MULTI:
                    self.write(cmd.dst, y)
                else:
                    self.add_into(cmd.dst, y)
            elif t in (CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI):
                self._scatter_multi(cmd, add=t is CT.ADD_TO_ROWS_MULTI)
            elif t is CT.ADD_ROW_RANGES:
                ranges = self.c.indexes_ranges[cmd.table]
                w = np.zeros((len(ranges), self.rows_of(cmd.src)), np.float32)
                for i, (b, e) in enumerate(ranges.tolist()):
                    w[i, b:e] = cmd.alpha
                self.add_into(cmd.dst, g.row_matrix(self.read(cmd.src), w))
            elif t in _NOOPS:
                continue
            else:
                raise ExportError(f"command {t.value} has no place in an exported forward "
                                  "graph")
        return outputs

    def _propagate(self, cmd) -> None:
        node = self.nnet.node_map[cmd.node]
        comp = self.nnet.components[node.component]
        pre = self.c.precomputed[cmd.precomputed]
        if cmd.in_value == 0 and cmd.table >= 0:  # input read as column blocks
            blocks = [self.read(s) for s in self.c.indexes_blocks[cmd.table].tolist()]
            x = self.g.cat(blocks, 2)
        elif cmd.in_value:
            x = self.read(cmd.in_value)
        else:  # a component with no input (ConstantComponent)
            x = None
        y = propagate_op(self.g, cmd.node, node.component, comp, pre, x,
                         self.rows_of(cmd.out_value))
        if comp.properties() & Flags.PROPAGATE_ADDS:
            self.add_into(cmd.out_value, y)
        else:
            self.write(cmd.out_value, y)

    def _gather_multi(self, table: np.ndarray):
        """Rows (submatrix, row) of several submatrices: the sources side by side
        along the rows, then one gather; (-1, -1) rows are zeros."""
        subs = [s for s in dict.fromkeys(table[:, 0].tolist()) if s > 0]
        offset, parts, total = {}, [], 0
        for s in subs:
            offset[s] = total
            parts.append(self.read(s))
            total += self.rows_of(s)
        flat = np.array([offset[s] + r if s > 0 else -1 for s, r in table.tolist()],
                        dtype=np.int64)
        return self.g.gather_rows(self.g.cat(parts, 1), flat, total)

    def _scatter_multi(self, cmd, add: bool) -> None:
        """sub[table[i]].row (+)= alpha * src[i], one target submatrix at a time, as a
        constant 0/1 matrix product (rows of one target may repeat when adding)."""
        table = self.c.indexes_multi[cmd.table]
        src = self.read(cmd.src)
        for s in dict.fromkeys(table[:, 0].tolist()):
            if s <= 0:
                continue
            rows_i = np.flatnonzero(table[:, 0] == s)
            w = np.zeros((self.rows_of(s), len(table)), np.float32)
            np.add.at(w, (table[rows_i, 1], rows_i), cmd.alpha)
            y = self.g.row_matrix(src, w)
            if add:
                self.add_into(s, y)
            else:
                hit = np.zeros(self.rows_of(s), bool)
                hit[table[rows_i, 1]] = True
                if hit.all():
                    self.write(s, y)
                else:
                    keep = self.g.const((~hit).astype(np.float32)[:, None], hint="mask")
                    old = self.g.call(operator.mul, self.read(s), keep)
                    self.write(s, self.g.call(operator.add, old, y))
