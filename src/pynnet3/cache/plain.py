"""Compiled computations as plain data: a JSON-able structure plus numpy arrays.

What the compile-cache file (:mod:`pynnet3.cache.persist`) stores instead of a
pickle. :class:`ArrayWriter` collects the arrays (each stored once, however often
it is referenced) and a structure refers to them by number; :class:`ArrayReader`
gives them back from raw bytes, with only int64 and float arrays allowed.

``*_to_data`` functions turn a computation (matrices, submatrices, index tables,
precomputed-index objects through :mod:`pynnet3.components.precomputed`,
commands, request), a shortcut snapshot or a cache key into that form;
``*_from_data`` rebuild them, checking every field's type, shape and range as
they go, and :func:`check_for_network` checks a rebuilt computation against the
network it is for (the computation checker, plus which precomputed objects its
components may read and for how many rows). Bad data raises ValueError (the
caller turns it into a FormatError); nothing in the data is ever executed.
"""

from __future__ import annotations

import math
from dataclasses import fields
from operator import attrgetter

import numpy as np

from ..compiler.request import ComputationRequest, IoSpecification
from ..components.base import Component
from ..components.fused import linear_part
from ..components.precomputed import (
    check_indexes_use,
    indexes_from_data,
    indexes_made_by,
    indexes_to_data,
)
from ..computation import Command, CommandType, MatrixInfo, NnetComputation, make_submatrix
from ..errors import PynnetError
from .expand import PrecomputedInfo

CT = CommandType
_DTYPES = ("<i8", "<f8", "<f4")  # what an array in the file may be
_ALIGN = 8
# Command fields stored as ints (bools as 0/1): every field but type, alpha and node.
_ALL_FIELDS = tuple(f.name for f in fields(Command))
_INT_FIELDS = tuple(f for f in _ALL_FIELDS if f not in ("type", "alpha", "node"))
_BOOL_FIELDS = frozenset(f.name for f in fields(Command) if isinstance(f.default, bool))
_get_ints = attrgetter(*_INT_FIELDS)
_TYPES = tuple(CommandType)
_TYPE_CODE = {t: k for k, t in enumerate(_TYPES)}
_COMPONENT_TYPES = (CT.PROPAGATE, CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)
_COMPRESS_KINDS = (1, 2, 3, 4)  # Kaldi's CuCompressedMatrixType (pynnet3.runtime.compression)


class ArrayWriter:
    """Collects arrays for one file: :meth:`add` returns an array's number."""

    def __init__(self):
        self.arrays: list[np.ndarray] = []
        self._ids: dict[int, int] = {}

    def add(self, a: np.ndarray) -> int:
        k = self._ids.get(id(a))
        if k is None:
            if not isinstance(a, np.ndarray) or a.dtype.str not in _DTYPES:
                raise TypeError(f"cannot store {type(a).__name__} "
                                f"{getattr(a, 'dtype', '')} in a compile cache")
            k = self._ids[id(a)] = len(self.arrays)
            self.arrays.append(a)  # (kept alive, so its id stays its own)
        return k

    def pack(self) -> tuple[list, bytes]:
        """``(table, blob)``: per array ``[dtype, shape, byte offset]``, and the bytes."""
        table, parts, pos = [], [], 0
        for a in self.arrays:
            data = np.ascontiguousarray(a).tobytes()
            table.append([a.dtype.str, list(a.shape), pos])
            pad = -len(data) % _ALIGN
            parts += [data, b"\0" * pad]
            pos += len(data) + pad
        return table, b"".join(parts)


class ArrayReader:
    """The arrays of a file, checked against its table (dtype allowed, shape sane,
    inside the blob, not overlapping). Arrays are writable views of one buffer."""

    def __init__(self, table, blob: bytes | bytearray | memoryview):
        if not isinstance(table, list):
            raise ValueError("array table is not a list")
        buf = blob if isinstance(blob, (bytearray, memoryview)) else bytearray(blob)
        if isinstance(buf, memoryview) and buf.readonly:
            buf = bytearray(buf)
        self.arrays: list[np.ndarray] = []
        spans = []
        for k, spec in enumerate(table):
            if not (isinstance(spec, list) and len(spec) == 3 and spec[0] in _DTYPES
                    and isinstance(spec[1], list) and len(spec[1]) <= 3
                    and all(_is_int(d) and 0 <= d < 2**40 for d in spec[1])
                    and _is_int(spec[2]) and spec[2] >= 0 and spec[2] % _ALIGN == 0):
                raise ValueError(f"array {k}: bad table entry {str(spec)[:60]}")
            dtype = np.dtype(spec[0])
            size = math.prod(spec[1]) * dtype.itemsize
            if spec[2] + size > len(buf):
                raise ValueError(f"array {k} runs past the end of the data")
            a = np.frombuffer(buf, dtype=dtype, count=size // dtype.itemsize,
                              offset=spec[2]).reshape(spec[1])
            if not a.dtype.isnative:
                a = a.astype(a.dtype.newbyteorder("="))
            self.arrays.append(a)
            if size:
                spans.append((spec[2], spec[2] + size))
        spans.sort()
        if any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False)):
            raise ValueError("arrays overlap")

    def get(self, ref, what: str, dtype: str = "<i8", ndim: int | None = None,
            cols: int | None = None) -> np.ndarray:
        """Array number ``ref``, which must have that dtype, ``ndim`` and ``cols``."""
        if not _is_int(ref) or not 0 <= ref < len(self.arrays):
            raise ValueError(f"{what}: no array {str(ref)[:20]}")
        a = self.arrays[ref]
        if a.dtype != np.dtype(dtype) or (ndim is not None and a.ndim != ndim) \
                or (cols is not None and a.shape[-1] != cols):
            raise ValueError(f"{what}: {a.dtype} array of shape {a.shape}")
        return a

    def get_optional(self, ref, what: str, **kw) -> np.ndarray | None:
        return None if ref is None else self.get(ref, what, **kw)


# -- checks of plain values -------------------------------------------------------------
def _is_int(v) -> bool:
    return type(v) is int


def _need(cond, what: str) -> None:
    if not cond:
        raise ValueError(what)


def _dict(obj, keys: tuple, what: str) -> dict:
    _need(isinstance(obj, dict) and set(obj) == set(keys), f"{what}: fields "
          f"{sorted(obj) if isinstance(obj, dict) else type(obj).__name__}, expected "
          f"{sorted(keys)}")
    return obj


def _list(obj, what: str, length: int | None = None) -> list:
    _need(isinstance(obj, list) and (length is None or len(obj) == length),
          f"{what}: not a list{'' if length is None else f' of {length}'}")
    return obj


def _strs(obj, what: str) -> list[str]:
    _need(isinstance(obj, list) and all(isinstance(s, str) for s in obj),
          f"{what}: not a list of strings")
    return obj


def _bool(obj, what: str) -> bool:
    _need(type(obj) is bool, f"{what}: not true/false")
    return obj


# -- cache keys -------------------------------------------------------------------------
def key_to_data(key):
    """A cache key (nested tuples of str / int / bool) as nested lists."""
    return [key_to_data(v) for v in key] if isinstance(key, tuple) else key


def key_from_data(obj, depth: int = 0):
    if isinstance(obj, list):
        _need(depth < 8, "cache key nested too deep")
        return tuple(key_from_data(v, depth + 1) for v in obj)
    _need(isinstance(obj, (str, int)), f"cache key holds a {type(obj).__name__}")
    return obj


# -- requests ---------------------------------------------------------------------------
def request_to_data(req: ComputationRequest | None, w: ArrayWriter) -> dict | None:
    if req is None:
        return None
    spec = [[[s.name, s.has_deriv, w.add(s.indexes)] for s in specs]
            for specs in (req.inputs, req.outputs)]
    return {"inputs": spec[0], "outputs": spec[1],
            "need_model_derivative": req.need_model_derivative,
            "store_component_stats": req.store_component_stats}


def request_from_data(obj, r: ArrayReader) -> ComputationRequest | None:
    if obj is None:
        return None
    d = _dict(obj, ("inputs", "outputs", "need_model_derivative", "store_component_stats"),
              "request")
    specs = []
    for kind in ("inputs", "outputs"):
        made = []
        for s in _list(d[kind], f"request {kind}"):
            name, has_deriv, ref = _list(s, f"request {kind} entry", 3)
            _need(isinstance(name, str), "request: a name is not a string")
            try:
                made.append(IoSpecification(name, r.get(ref, "request indexes", ndim=2, cols=3),
                                            _bool(has_deriv, "request has_deriv")))
            except PynnetError as e:
                raise ValueError(str(e)) from None
        specs.append(made)
    return ComputationRequest(specs[0], specs[1],
                              _bool(d["need_model_derivative"], "need_model_derivative"),
                              _bool(d["store_component_stats"], "store_component_stats"))


# -- computations -----------------------------------------------------------------------
_COMPUTATION_FIELDS = ("matrices", "submatrices", "whole", "indexes", "indexes_multi",
                       "indexes_ranges", "indexes_blocks", "precomputed", "commands",
                       "need_model_derivative", "request")


def computation_to_data(c: NnetComputation, w: ArrayWriter) -> dict:
    """``c`` as plain data (TypeError for a precomputed object of a class not
    registered in :mod:`pynnet3.components.precomputed`)."""
    mats = c.matrices
    precomputed = []
    for obj in c.precomputed:
        if obj is None:
            precomputed.append(None)
            continue
        named = indexes_to_data(obj)
        if named is None:
            raise TypeError(f"precomputed indexes of class {type(obj).__name__} cannot "
                            f"be stored")
        name, data = named
        precomputed.append([name, {k: _field_to_data(v, w) for k, v in data.items()}])
    nodes: dict[str, int] = {}
    ints = np.array([_get_ints(cmd) for cmd in c.commands], dtype=np.int64)
    extra = np.array([(_TYPE_CODE[cmd.type], nodes.setdefault(cmd.node, len(nodes)))
                      for cmd in c.commands], dtype=np.int64)
    return {
        "matrices": {"rows": w.add(np.array([m.rows for m in mats], dtype=np.int64)),
                     "cols": w.add(np.array([m.cols for m in mats], dtype=np.int64)),
                     "is_deriv": [m.is_deriv for m in mats],
                     "node": [m.node for m in mats],
                     "indexes": [None if m.indexes is None else w.add(m.indexes)
                                 for m in mats]},
        "submatrices": w.add(np.array(c.submatrices, dtype=np.int64).reshape(-1, 5)),
        "whole": w.add(np.array(sorted(c._whole.items()), dtype=np.int64).reshape(-1, 2)),
        "indexes": [w.add(a) for a in c.indexes],
        "indexes_multi": [w.add(a) for a in c.indexes_multi],
        "indexes_ranges": [w.add(a) for a in c.indexes_ranges],
        "indexes_blocks": [w.add(a) for a in c.indexes_blocks],
        "precomputed": precomputed,
        "commands": {"fields": list(_INT_FIELDS), "types": [t.value for t in _TYPES],
                     "nodes": list(nodes),
                     "ints": w.add(ints.reshape(-1, len(_INT_FIELDS))),
                     "type_node": w.add(extra.reshape(-1, 2)),
                     "alpha": w.add(np.array([cmd.alpha for cmd in c.commands],
                                             dtype=np.float64))},
        "need_model_derivative": c.need_model_derivative,
        "request": request_to_data(c.request, w),
    }


def _field_to_data(v, w: ArrayWriter):
    if isinstance(v, np.ndarray):
        return {"array": w.add(v)}
    if v is None or type(v) in (bool, int, float):
        return v
    raise TypeError(f"a precomputed-indexes field of type {type(v).__name__}")


def _field_from_data(v, r: ArrayReader, what: str):
    if isinstance(v, dict):
        ref = _dict(v, ("array",), what)["array"]
        if not _is_int(ref) or not 0 <= ref < len(r.arrays):
            raise ValueError(f"{what}: no array {str(ref)[:20]}")
        return r.arrays[ref]
    _need(v is None or type(v) in (bool, int, float), f"{what}: a {type(v).__name__}")
    return v


def computation_from_data(obj, r: ArrayReader) -> NnetComputation:
    """The computation of :func:`computation_to_data`, with its structure checked
    (ranges that need the network are left to :func:`check_for_network`)."""
    d = _dict(obj, _COMPUTATION_FIELDS, "computation")
    c = NnetComputation()
    c.matrices = _matrices(d["matrices"], r)
    num_m = len(c.matrices)
    sub = r.get(d["submatrices"], "submatrices", ndim=2, cols=5)
    _need(len(sub) >= 1 and not sub[0].any(), "submatrix 0 is not the empty one")
    rows = np.array([m.rows for m in c.matrices], dtype=np.int64)
    cols = np.array([m.cols for m in c.matrices], dtype=np.int64)
    m, ro, nr, co, nc = sub[1:].T
    _need(bool(((m >= 1) & (m < num_m)).all()), "a submatrix names no matrix")
    _need(bool(((ro >= 0) & (nr > 0) & (ro + nr <= rows[m]) & (co >= 0) & (nc > 0)
                & (co + nc <= cols[m])).all()), "a submatrix does not fit its matrix")
    c.submatrices = [make_submatrix(*s) for s in sub.tolist()]
    whole = r.get(d["whole"], "whole-matrix submatrices", ndim=2, cols=2)
    wm, ws = whole.T
    _need(bool(((wm >= 1) & (wm < num_m) & (ws >= 1) & (ws < len(sub))).all())
          and len(np.unique(wm)) == len(wm), "whole-matrix submatrices out of range")
    _need(np.array_equal(sub[ws], np.stack([wm, 0 * wm, rows[wm], 0 * wm, cols[wm]], axis=1)
                         .reshape(-1, 5)), "a whole-matrix submatrix is not whole")
    c._whole = dict(whole.tolist())
    c.indexes = [r.get(a, "index table", ndim=1) for a in _list(d["indexes"], "indexes")]
    c.indexes_multi = [r.get(a, "multi index table", ndim=2, cols=2)
                       for a in _list(d["indexes_multi"], "indexes_multi")]
    c.indexes_ranges = [r.get(a, "range table", ndim=2, cols=2)
                        for a in _list(d["indexes_ranges"], "indexes_ranges")]
    c.indexes_blocks = [r.get(a, "block table", ndim=1)
                        for a in _list(d["indexes_blocks"], "indexes_blocks")]
    c.precomputed = _precomputed(d["precomputed"], r)
    c.commands = _commands(d["commands"], r, len(c.precomputed))
    c.need_model_derivative = _bool(d["need_model_derivative"], "need_model_derivative")
    c.request = request_from_data(d["request"], r)
    return c


def _matrices(obj, r: ArrayReader) -> list[MatrixInfo]:
    d = _dict(obj, ("rows", "cols", "is_deriv", "node", "indexes"), "matrices")
    rows = r.get(d["rows"], "matrix rows", ndim=1)
    cols = r.get(d["cols"], "matrix cols", ndim=1)
    n = len(rows)
    _need(n >= 1 and len(cols) == n and rows[0] == 0 and cols[0] == 0
          and bool((rows[1:] > 0).all() and (cols[1:] > 0).all()), "matrix sizes")
    is_deriv = _list(d["is_deriv"], "matrix is_deriv", n)
    nodes = _strs(d["node"], "matrix nodes")
    idx = _list(d["indexes"], "matrix indexes", n)
    _need(len(nodes) == n and all(type(b) is bool for b in is_deriv), "matrix fields")
    out = []
    for k, (nr, nc, node, deriv, ref) in enumerate(zip(rows.tolist(), cols.tolist(), nodes,
                                                       is_deriv, idx, strict=True)):
        ix = r.get_optional(ref, f"matrix {k} indexes", ndim=2, cols=3)
        _need(ix is None or len(ix) == nr, f"matrix {k}: indexes for another row count")
        out.append(MatrixInfo(nr, nc, node, deriv, ix))
    return out


def _precomputed(obj, r: ArrayReader) -> list:
    items = _list(obj, "precomputed")
    _need(len(items) >= 1 and items[0] is None, "precomputed entry 0 is not empty")
    out = []
    for p, item in enumerate(items):
        if item is None:
            out.append(None)
            continue
        name, data = _list(item, f"precomputed {p}", 2)
        _need(isinstance(name, str) and isinstance(data, dict), f"precomputed {p}")
        out.append(indexes_from_data(name, {k: _field_from_data(v, r, f"precomputed {p}")
                                            for k, v in data.items()}))
    return out


def _commands(obj, r: ArrayReader, num_precomputed: int) -> list[Command]:
    d = _dict(obj, ("fields", "types", "nodes", "ints", "type_node", "alpha"), "commands")
    _need(d["fields"] == list(_INT_FIELDS), "command fields of another pynnet3")
    types = [_command_type(v) for v in _strs(d["types"], "command types")]
    nodes = _strs(d["nodes"], "command nodes")
    ints = r.get(d["ints"], "commands", ndim=2, cols=len(_INT_FIELDS))
    type_node = r.get(d["type_node"], "command types", ndim=2, cols=2)
    alpha = r.get(d["alpha"], "command alphas", dtype="<f8", ndim=1)
    n = len(ints)
    _need(len(type_node) == n and len(alpha) == n, "command arrays differ in length")
    _need(bool(np.isfinite(alpha).all()), "a command's alpha is not finite")
    code, node = type_node.T
    _need(bool(((code >= 0) & (code < len(types)) & (node >= 0) & (node < len(nodes))).all()),
          "a command type or node out of range")
    pre = ints[:, _INT_FIELDS.index("precomputed")]
    _need(bool(((pre >= 0) & (pre < num_precomputed)).all()), "a command's precomputed index")
    compress = np.isin(code, [types.index(t) for t in (CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX)
                              if t in types])
    kinds = ints[compress, _INT_FIELDS.index("compress_kind")]
    _need(bool(np.isin(kinds, _COMPRESS_KINDS).all()), "a compression kind")
    columns = {"type": [types[k] for k in code.tolist()], "alpha": alpha.tolist(),
               "node": [nodes[k] for k in node.tolist()]}
    for name, col in zip(_INT_FIELDS, ints.T.tolist(), strict=True):
        if name in _BOOL_FIELDS:
            _need(all(v in (0, 1) for v in col), f"command field {name} is not 0 or 1")
            col = [v == 1 for v in col]
        columns[name] = col
    # (Commands made without __init__: each gets its fields, in declaration order, as
    # Command(**fields) would give them; thousands per computation)
    new, make = Command.__new__, dict
    out = []
    for values in zip(*(columns[f] for f in _ALL_FIELDS), strict=True):
        cmd = new(Command)
        cmd.__dict__ = make(zip(_ALL_FIELDS, values, strict=True))
        out.append(cmd)
    return out


def _command_type(value: str) -> CommandType:
    try:
        return CommandType(value)
    except ValueError:
        raise ValueError(f"unknown command type {value[:40]!r}") from None


# -- shortcut snapshots -----------------------------------------------------------------
def snapshot_to_data(snapshot: dict[int, PrecomputedInfo], w: ArrayWriter) -> list:
    return [[p, info.node, w.add(info.input_indexes), w.add(info.output_indexes),
             info.need_backprop] for p, info in sorted(snapshot.items())]


def snapshot_from_data(obj, r: ArrayReader, c: NnetComputation) -> dict[int, PrecomputedInfo]:
    """The snapshot, each position one of ``c``'s precomputed objects, whose first
    Propagate names the snapshot's node."""
    first = {}
    for cmd in c.commands:
        if cmd.type is CT.PROPAGATE and cmd.precomputed:
            first.setdefault(cmd.precomputed, cmd.node)
    out = {}
    for item in _list(obj, "snapshot"):
        p, node, ref_in, ref_out, bp = _list(item, "snapshot entry", 5)
        _need(_is_int(p) and p not in out and first.get(p) == node
              and c.precomputed[p] is not None, "a snapshot entry for no propagate")
        out[p] = PrecomputedInfo(node, r.get(ref_in, "snapshot input", ndim=2, cols=3),
                                 r.get(ref_out, "snapshot output", ndim=2, cols=3),
                                 _bool(bp, "snapshot need_backprop"))
    return out


# -- against the network -----------------------------------------------------------------
def check_for_network(c: NnetComputation, nnet) -> None:
    """ValueError unless ``c`` passes the computation checker on ``nnet`` and every
    component command reads a precomputed object its component makes, made for the
    command's row counts (none where the component makes none)."""
    from ..analysis.checker import check_computation

    try:
        check_computation(c, nnet, context="compile cache")
    except PynnetError as e:
        raise ValueError(str(e)) from None
    subs, nodes = c.submatrices, nnet.node_map
    makes: dict[str, bool] = {}
    for cmd in c.commands:
        if cmd.type not in _COMPONENT_TYPES:
            continue
        comp = nnet.components[nodes[cmd.node].component]
        comp = linear_part(comp)  # (a fused kernel: its linear layer's indexes)
        obj = c.precomputed[cmd.precomputed]
        made = makes.get(comp.type_name)
        if made is None:
            made = makes[comp.type_name] = indexes_made_by(comp.type_name)
        if not made:
            _need(obj is None, f"{cmd.node}: precomputed indexes for a component that "
                               f"makes none")
            _need(type(comp).precompute_indexes is Component.precompute_indexes,
                  f"{cmd.node}: {comp.type_name}'s precomputed indexes cannot be stored")
            continue
        _need(obj is not None, f"{cmd.node}: precomputed indexes missing")
        out = cmd.out_value if cmd.type is CT.PROPAGATE else cmd.out_deriv
        inp = cmd.in_value or cmd.in_deriv
        if inp:
            num_in = subs[inp].num_rows
        elif cmd.table >= 0:
            num_in = subs[int(c.indexes_blocks[cmd.table][0])].num_rows
        else:
            num_in = None
        check_indexes_use(obj, comp, num_in, subs[out].num_rows)
