"""Building a ``torch.fx`` graph of batched matrix values.

Every value in the exported graph is a tensor ``[N, rows, cols]``: N sequences
(dynamic) of the rows one sequence has in the compiled computation. Two pieces:

* :class:`GraphBuilder` wraps a :class:`torch.fx.Graph` and the root module that
  holds its parameters (trainable, one per component parameter) and constant
  buffers (index tables, BatchNorm transforms); it emits standard torch calls.
* :class:`MatrixValue` is one computation matrix as a tiling of rectangles, each a
  view into an fx node (or zeros). Commands write sub-rectangles (a column block
  of a spliced input, a row range of a recurrence step) without rebuilding the
  whole tensor; a read assembles only the rectangle it needs (slices, ``cat``).
  Invariant: the pieces are disjoint and cover the matrix exactly.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

import numpy as np
import torch
from torch import fx

_FULL = slice(None)


def attr_name(*parts: str) -> str:
    """A Python identifier made from ``parts`` (fx attributes and placeholders must be)."""
    s = "__".join(re.sub(r"\W", "_", p) for p in parts)
    return s if s and not s[0].isdigit() else "_" + s


class GraphBuilder:
    """An fx graph under construction, with the module that owns its tensors.

    ``param(component, name, array)`` makes one trainable parameter per
    (component, name) (shared by every node that uses the component);
    ``const(array)`` a buffer; ``call(fn, *args)`` a call_function node."""

    def __init__(self, dtype: torch.dtype = torch.float32):
        self.graph = fx.Graph()
        self.root = torch.nn.Module()
        self.dtype = dtype
        self.param_names: dict[tuple[str, str], str] = {}
        self._params: dict[tuple[str, str], fx.Node] = {}
        self._consts: dict[str, fx.Node] = {}
        self.ref: fx.Node | None = None  # the first input: N, dtype and device
        self.batch: fx.Node | None = None  # N (ref.size(0))

    # -- tensors owned by the module -------------------------------------------------
    def param(self, component: str, name: str, value) -> fx.Node:
        key = (component, name)
        node = self._params.get(key)
        if node is None:
            attr = base = attr_name("p", component, name)
            k = 1
            while hasattr(self.root, attr):  # ("a.b" and "a_b" make the same identifier)
                attr, k = f"{base}_{k}", k + 1
            t = torch.as_tensor(np.array(value, dtype=np.float32, copy=True), dtype=self.dtype)
            self.root.register_parameter(attr, torch.nn.Parameter(t))
            self.param_names[key] = attr
            node = self._params[key] = self.graph.get_attr(attr)
        return node

    def const(self, value, dtype: torch.dtype | None = None, hint: str = "c") -> fx.Node:
        """A constant buffer (index tables as int64, values in the graph's dtype)."""
        arr = np.asarray(value)
        if dtype is None:
            dtype = torch.int64 if arr.dtype.kind in "iub" else self.dtype
        t = torch.as_tensor(np.array(arr, copy=True)).to(dtype)
        attr = attr_name(f"{hint}{len(self._consts)}")
        self.root.register_buffer(attr, t)
        node = self._consts[attr] = self.graph.get_attr(attr)
        return node

    # -- calls ---------------------------------------------------------------------------
    def call(self, fn, *args, **kwargs) -> fx.Node:
        return self.graph.call_function(fn, args, kwargs)

    def method(self, name: str, *args, **kwargs) -> fx.Node:
        return self.graph.call_method(name, args, kwargs)

    # (new tensors follow the first input's dtype and device: module.double() and
    # module.to("cuda") then work as for any module)
    def zeros(self, rows: int, cols: int) -> fx.Node:
        return self.method("new_zeros", self.ref, (self.batch, rows, cols))

    def full(self, rows: int, cols: int, value: float) -> fx.Node:
        return self.method("new_full", self.ref, (self.batch, rows, cols), float(value))

    def slice(self, x: fx.Node, r0: int, r1: int, c0: int, c1: int, rows: int,
              cols: int) -> fx.Node:
        """``x[:, r0:r1, c0:c1]`` of a ``[N, rows, cols]`` node (no op when whole)."""
        rs = _FULL if (r0, r1) == (0, rows) else slice(r0, r1)
        cs = _FULL if (c0, c1) == (0, cols) else slice(c0, c1)
        if rs is _FULL and cs is _FULL:
            return x
        return self.call(operator.getitem, x, (_FULL, rs, cs))

    def cols(self, x: fx.Node, c0: int, c1: int, cols: int) -> fx.Node:
        """``x[..., c0:c1]`` (no op when whole)."""
        if (c0, c1) == (0, cols):
            return x
        return self.call(operator.getitem, x, (Ellipsis, slice(c0, c1)))

    def cat(self, parts: list[fx.Node], dim: int) -> fx.Node:
        return parts[0] if len(parts) == 1 else self.call(torch.cat, list(parts), dim)

    def rows(self, x: fx.Node, table, num_rows: int) -> fx.Node:
        """Rows ``table`` (all >= 0) of ``x`` ``[N, num_rows, c]``: a slice when they
        are a contiguous run, else ``index_select`` with a constant index buffer."""
        table = np.asarray(table, dtype=np.int64)
        if len(table) > 1 and (table == table[0]).all():  # one row repeated (an iVector)
            r0 = int(table[0])
            one = self.call(operator.getitem, x, (_FULL, slice(r0, r0 + 1)))
            return self.method("expand", one, -1, len(table), -1)
        if len(table) and np.array_equal(table, np.arange(table[0], table[0] + len(table))):
            r0 = int(table[0])
            if (r0, r0 + len(table)) == (0, num_rows):
                return x
            return self.call(operator.getitem, x, (_FULL, slice(r0, r0 + len(table))))
        return self.call(torch.index_select, x, 1, self.const(table, hint="rows"))

    def gather_rows(self, x: fx.Node, table, num_rows: int) -> fx.Node:
        """Rows ``table`` of ``x`` where -1 gives a zero row."""
        table = np.asarray(table, dtype=np.int64)
        missing = table < 0
        if not missing.any():
            return self.rows(x, table, num_rows)
        y = self.rows(x, np.where(missing, 0, table), num_rows)
        mask = self.const((~missing).astype(np.float32)[:, None], hint="mask")
        return self.call(operator.mul, y, mask)

    def row_matrix(self, x: fx.Node, weights: np.ndarray, dtype=None) -> fx.Node:
        """``W @ x`` per sequence for a constant ``W [rows_out, rows_in]`` (row sums
        and scatters with repeats), optionally computed in ``dtype``."""
        if dtype is None:
            w = self.method("type_as", self.const(weights, hint="rowsum"), x)
            return self.call(torch.matmul, w, x)
        w = self.const(weights, dtype=dtype, hint="rowsum")
        return self.call(torch.matmul, w, self.method("to", x, dtype))

    def scale(self, x: fx.Node, alpha: float) -> fx.Node:
        return x if alpha == 1.0 else self.call(operator.mul, x, float(alpha))


@dataclass
class Piece:
    """Rows ``[r0, r1)`` x columns ``[c0, c1)`` of a matrix hold ``node[:, vr:vr+(r1-r0),
    vc:vc+(c1-c0)]`` (``node`` of shape ``[N, vrows, vcols]``), or zeros when ``node``
    is None."""

    r0: int
    r1: int
    c0: int
    c1: int
    node: fx.Node | None
    vr: int = 0
    vc: int = 0
    vrows: int = 0
    vcols: int = 0

    def clip(self, r0: int, r1: int, c0: int, c1: int) -> Piece:
        a, b, c, d = max(self.r0, r0), min(self.r1, r1), max(self.c0, c0), min(self.c1, c1)
        return Piece(a, b, c, d, self.node, self.vr + a - self.r0, self.vc + c - self.c0,
                     self.vrows, self.vcols)

    def overlaps(self, r0: int, r1: int, c0: int, c1: int) -> bool:
        return self.r0 < r1 and r0 < self.r1 and self.c0 < c1 and c0 < self.c1


class MatrixValue:
    """One matrix of the computation as a tiling of :class:`Piece` (module doc)."""

    def __init__(self, rows: int, cols: int):
        self.rows, self.cols = rows, cols
        self.pieces = [Piece(0, rows, 0, cols, None)]

    def is_zero(self, r0: int, r1: int, c0: int, c1: int) -> bool:
        return all(p.node is None for p in self.pieces if p.overlaps(r0, r1, c0, c1))

    def write(self, r0: int, r1: int, c0: int, c1: int, node: fx.Node | None) -> None:
        """The rectangle now holds ``node`` (``[N, r1-r0, c1-c0]``; None = zeros)."""
        if r0 >= r1 or c0 >= c1:
            return
        kept = []
        for p in self.pieces:
            if not p.overlaps(r0, r1, c0, c1):
                kept.append(p)
                continue
            # the parts of p outside the rectangle: above, below, left, right
            for a, b, c, d in ((p.r0, r0, p.c0, p.c1), (r1, p.r1, p.c0, p.c1),
                               (max(p.r0, r0), min(p.r1, r1), p.c0, c0),
                               (max(p.r0, r0), min(p.r1, r1), c1, p.c1)):
                a, b = max(a, p.r0), min(b, p.r1)
                c, d = max(c, p.c0), min(d, p.c1)
                if a < b and c < d:
                    kept.append(p.clip(a, b, c, d))
        kept.append(Piece(r0, r1, c0, c1, node, 0, 0, r1 - r0, c1 - c0))
        self.pieces = kept

    def read(self, g: GraphBuilder, r0: int, r1: int, c0: int, c1: int) -> fx.Node:
        """The rectangle as one node ``[N, r1-r0, c1-c0]``; an assembled rectangle
        replaces its pieces (same values), so reading it again costs nothing."""
        parts = [p.clip(r0, r1, c0, c1) for p in self.pieces if p.overlaps(r0, r1, c0, c1)]
        if len(parts) == 1:
            return _materialize(g, parts[0])
        cuts = sorted({p.r0 for p in parts} | {p.r1 for p in parts})
        bands = []
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            row = sorted((p.clip(a, b, c0, c1) for p in parts if p.r0 < b and a < p.r1),
                         key=lambda p: p.c0)
            bands.append(_join_columns(g, row))
        node = g.cat(bands, 1)
        self.write(r0, r1, c0, c1, node)
        return node


def _materialize(g: GraphBuilder, p: Piece) -> fx.Node:
    if p.node is None:
        return g.zeros(p.r1 - p.r0, p.c1 - p.c0)
    return g.slice(p.node, p.vr, p.vr + p.r1 - p.r0, p.vc, p.vc + p.c1 - p.c0,
                   p.vrows, p.vcols)


def _join_columns(g: GraphBuilder, row: list[Piece]) -> fx.Node:
    """Pieces of one row band, left to right, as one node; neighbouring views of the
    same node's consecutive columns merge into one slice."""
    merged: list[Piece] = []
    for p in row:
        q = merged[-1] if merged else None
        if q is not None and p.node is q.node and q.c1 == p.c0 and \
                (p.node is None or (p.vr == q.vr and p.vc == q.vc + q.c1 - q.c0)):
            merged[-1] = Piece(q.r0, q.r1, q.c0, p.c1, q.node, q.vr, q.vc, q.vrows, q.vcols)
        else:
            merged.append(p)
    return g.cat([_materialize(g, p) for p in merged], 2)
