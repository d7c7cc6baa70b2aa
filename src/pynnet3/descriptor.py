"""Descriptors: the expressions that say which cindexes feed a node.

Parsing accepts Kaldi's general syntax (``Append``, ``Sum``, ``Failover``,
``IfDefined``, ``Offset``, ``Round``, ``ReplaceIndex``, ``Switch``, ``Const``,
``Scale`` and node names). It is normalized to Kaldi's canonical form, which is
also what ``str()`` prints (exactly the node lines of a Kaldi ``model.txt``):

* ``Append`` only at the top: a :class:`Descriptor` is a list of *parts*, each
  giving a column block of the node's input;
* a part is a sum expression: :class:`SumOf` (binary ``Sum``), :class:`FailoverOf`,
  :class:`IfDefinedOf`, :class:`ConstOf`, or a forwarding chain;
* a forwarding chain maps one index to one source cindex: :class:`NodeRef`
  (with its ``Scale``, always innermost), :class:`OffsetOf`, :class:`RoundOf`,
  :class:`ReplaceIndexOf`, :class:`SwitchOf`.

Evaluation is vectorized over ``(k, 3)`` index arrays: :meth:`Descriptor.dependencies`
lists what a batch of indexes may read, and :func:`resolve_part` decides, given an
availability oracle, which rows are computable and which source terms each row
uses (IfDefined / Failover choose by availability, as in Kaldi). Internally it
works on packed index keys (:func:`pynnet3.index.pack`); the compiler calls the
``*_keys`` variants, which take and give keys.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from . import limits
from .errors import DescriptorError
from .index import INDEX_LIMITS, X_COL, key_offset, key_t, key_with_t, key_with_x, pack, unpack
from .io.kaldi_stream import format_float

# ----------------------------------------------------------------------------------
# Normal-form expression classes
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeRef:
    """A node's output, scaled (``Scale(s, node)`` when ``scale != 1``)."""

    node: str
    scale: float = 1.0

    def __str__(self) -> str:
        if self.scale == 1.0:
            return self.node
        return f"Scale({format_float(np.float32(self.scale))}, {self.node})"


@dataclass(frozen=True)
class OffsetOf:
    src: object
    t_offset: int
    x_offset: int = 0

    def __str__(self) -> str:
        if self.x_offset:
            return f"Offset({self.src}, {self.t_offset}, {self.x_offset})"
        return f"Offset({self.src}, {self.t_offset})"


@dataclass(frozen=True)
class RoundOf:
    src: object
    t_modulus: int

    def __str__(self) -> str:
        return f"Round({self.src}, {self.t_modulus})"


@dataclass(frozen=True)
class ReplaceIndexOf:
    src: object
    variable: str  # "t" or "x"
    value: int

    def __str__(self) -> str:
        return f"ReplaceIndex({self.src}, {self.variable}, {self.value})"


@dataclass(frozen=True)
class SwitchOf:
    """Row with time t reads ``srcs[t mod len(srcs)]``."""

    srcs: tuple

    def __str__(self) -> str:
        return "Switch(" + ", ".join(str(s) for s in self.srcs) + ")"


@dataclass(frozen=True)
class _TwoTerms:
    """A descriptor function of two sum expressions ``a`` and ``b``, printed as
    ``function(a, b)``; each subclass is its own type (instances of two of them
    never compare equal)."""

    a: object
    b: object
    function: ClassVar[str]

    def __str__(self) -> str:
        return f"{self.function}({self.a}, {self.b})"


class SumOf(_TwoTerms):
    """``Sum(a, b)``: computable where both sides are."""

    function = "Sum"


class FailoverOf(_TwoTerms):
    """``Failover(a, b)``: ``a`` where it is computable, else ``b``."""

    function = "Failover"


@dataclass(frozen=True)
class IfDefinedOf:
    a: object

    def __str__(self) -> str:
        return f"IfDefined({self.a})"


@dataclass(frozen=True)
class ConstOf:
    value: float
    dim: int

    def __str__(self) -> str:
        return f"Const({format_float(np.float32(self.value))}, {self.dim})"


_FORWARDING = (NodeRef, OffsetOf, RoundOf, ReplaceIndexOf, SwitchOf)


@dataclass(frozen=True)
class Descriptor:
    """A node's input: the column-wise ``Append`` of ``parts``."""

    parts: tuple

    def __str__(self) -> str:
        return self._text

    def __deepcopy__(self, memo) -> Descriptor:
        return self  # (immutable, as a tuple of strings: a network's copy shares it)

    @cached_property
    def _text(self) -> str:
        # (immutable: the network optimizer's match reasons and the config lines
        # ask for it many times)
        if len(self.parts) == 1:
            return str(self.parts[0])
        return "Append(" + ", ".join(str(p) for p in self.parts) + ")"

    def node_names(self) -> list[str]:
        """Every node this descriptor reads, in first-appearance order."""
        return list(self._node_names)

    @cached_property
    def _node_names(self) -> tuple[str, ...]:
        # (a descriptor is immutable; the node graph asks for these several
        # times per compile)
        seen: list[str] = []
        for name, _, _ in self.time_terms():
            if name not in seen:
                seen.append(name)
        return tuple(seen)

    def dim(self, node_dim: Callable[[str], int]) -> int:
        return sum(part_dim(p, node_dim) for p in self.parts)

    def part_dims(self, node_dim: Callable[[str], int]) -> list[int]:
        return [part_dim(p, node_dim) for p in self.parts]

    def time_terms(self) -> list[tuple[str, int | None, bool]]:
        """``(node, time offset, optional)`` of every node term: the offset at which
        it is read relative to the row's time (None under ``ReplaceIndex(., t, k)``:
        an absolute time; ``Round`` counts as its source's offset, reading no later),
        and whether it sits inside an ``IfDefined`` or a ``Failover`` (what is read
        may depend on what is defined)."""
        out: list = []
        for p in self.parts:
            _time_terms(p, 0, False, out)
        return out

    def map_nodes(self, fn: Callable[[str], str]) -> Descriptor:
        return Descriptor(tuple(map_refs(p, lambda r: NodeRef(fn(r.node), r.scale))
                                for p in self.parts))

    def dependencies(self, indexes: np.ndarray) -> list[Dep]:
        """Everything a batch of indexes may read: one :class:`Dep` per source term."""
        keys = pack(np.asarray(indexes, dtype=np.int64).reshape(-1, 3))
        out: list = []
        rows = np.arange(len(keys), dtype=np.int64)
        for p in self.parts:
            _deps(p, keys, True, out, rows)
        return [Dep(node, r, unpack(src), required) for node, r, src, required in out]


@dataclass
class Dep:
    """Rows ``rows`` of a batch read ``node`` at ``indexes`` (aligned with ``rows``).
    ``required`` False means the read is optional (inside IfDefined / Failover)."""

    node: str
    rows: np.ndarray
    indexes: np.ndarray
    required: bool


def _time_terms(e, off: int | None, optional: bool, out: list) -> None:
    """Append ``(node, time offset or None, optional)`` for every term of part ``e``."""
    if isinstance(e, NodeRef):
        out.append((e.node, off, optional))
    elif isinstance(e, OffsetOf):
        _time_terms(e.src, None if off is None else off + e.t_offset, optional, out)
    elif isinstance(e, RoundOf):  # (reads at t - t mod m: no later than t)
        _time_terms(e.src, off, optional, out)
    elif isinstance(e, ReplaceIndexOf):
        _time_terms(e.src, None if e.variable == "t" else off, optional, out)
    elif isinstance(e, SwitchOf):
        for s in e.srcs:
            _time_terms(s, off, optional, out)
    elif isinstance(e, SumOf):
        _time_terms(e.a, off, optional, out)
        _time_terms(e.b, off, optional, out)
    elif isinstance(e, FailoverOf):  # (which one is used depends on a's definedness)
        _time_terms(e.a, off, True, out)
        _time_terms(e.b, off, True, out)
    elif isinstance(e, IfDefinedOf):
        _time_terms(e.a, off, True, out)


def map_refs(e, fn: Callable[[NodeRef], object]):
    """Part ``e`` rebuilt with every node reference ``r`` replaced by ``fn(r)``; the
    functions around the references (and any Const) stay as they are. Not
    normalized: ``fn`` may return any expression."""
    if isinstance(e, NodeRef):
        return fn(e)
    if isinstance(e, OffsetOf):
        return OffsetOf(map_refs(e.src, fn), e.t_offset, e.x_offset)
    if isinstance(e, RoundOf):
        return RoundOf(map_refs(e.src, fn), e.t_modulus)
    if isinstance(e, ReplaceIndexOf):
        return ReplaceIndexOf(map_refs(e.src, fn), e.variable, e.value)
    if isinstance(e, SwitchOf):
        return SwitchOf(tuple(map_refs(s, fn) for s in e.srcs))
    if isinstance(e, _TwoTerms):
        return type(e)(map_refs(e.a, fn), map_refs(e.b, fn))
    if isinstance(e, IfDefinedOf):
        return IfDefinedOf(map_refs(e.a, fn))
    return e


def part_dim(e, node_dim: Callable[[str], int]) -> int:
    if isinstance(e, NodeRef):
        return node_dim(e.node)
    if isinstance(e, (OffsetOf, RoundOf, ReplaceIndexOf)):
        return part_dim(e.src, node_dim)
    if isinstance(e, SwitchOf):
        dims = {part_dim(s, node_dim) for s in e.srcs}
        if len(dims) != 1:
            raise _error(f"Switch() over inputs of different dims {sorted(dims)}: {e}")
        return dims.pop()
    if isinstance(e, (SumOf, FailoverOf)):
        da, db = part_dim(e.a, node_dim), part_dim(e.b, node_dim)
        if da != db:
            raise _error(f"{e.function}() of inputs with different dims {da} and {db}: {e}")
        return da
    if isinstance(e, IfDefinedOf):
        return part_dim(e.a, node_dim)
    if isinstance(e, ConstOf):
        return e.dim
    raise TypeError(e)


# ----------------------------------------------------------------------------------
# Index mapping through forwarding chains (vectorized, on packed keys)
# ----------------------------------------------------------------------------------
#
# Evaluation works on packed index keys (pynnet3.index.pack): an Offset is one
# addition, a ReplaceIndex one mask, and availability oracles look keys up as they
# are. The functions taking ``(k, 3)`` indexes are thin wrappers over these.


def _forward(e, keys: np.ndarray, rows: np.ndarray, out: list) -> None:
    """Map rows of ``keys`` through forwarding chain ``e``; append
    ``(NodeRef, rows, src_keys)`` candidates (Switch yields several)."""
    if isinstance(e, NodeRef):
        out.append((e, rows, keys))
    elif isinstance(e, OffsetOf):
        _forward(e.src, keys + key_offset(e.t_offset, e.x_offset), rows, out)
    elif isinstance(e, RoundOf):  # t -> floor(t / m) * m = t - (t mod m)
        _forward(e.src, keys - key_offset(np.mod(key_t(keys), e.t_modulus)), rows, out)
    elif isinstance(e, ReplaceIndexOf):
        _forward(e.src, key_with_t(keys, e.value) if e.variable == "t"
                 else key_with_x(keys, e.value), rows, out)
    elif isinstance(e, SwitchOf):
        which = np.mod(key_t(keys), len(e.srcs))
        for i, s in enumerate(e.srcs):
            sel = which == i
            if sel.any():
                _forward(s, keys[sel], rows[sel], out)
    else:
        raise TypeError(e)


def _deps(e, keys: np.ndarray, required: bool, out: list, rows: np.ndarray) -> None:
    """Append ``(node, rows, src_keys, required)`` for every source term of ``e``."""
    if isinstance(e, _FORWARDING):
        cands: list = []
        _forward(e, keys, rows, cands)
        for ref, r, src in cands:
            out.append((ref.node, r, src, required))
    elif isinstance(e, SumOf):
        _deps(e.a, keys, required, out, rows)
        _deps(e.b, keys, required, out, rows)
    elif isinstance(e, FailoverOf):
        _deps(e.a, keys, False, out, rows)
        _deps(e.b, keys, False, out, rows)
    elif isinstance(e, IfDefinedOf):
        _deps(e.a, keys, False, out, rows)


def dependency_keys(d: Descriptor, keys: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """:meth:`Descriptor.dependencies` on packed keys: ``(node, source keys)`` of
    every source term (rows and requiredness left out)."""
    out: list = []
    rows = np.arange(len(keys), dtype=np.int64)
    for p in d.parts:
        _deps(p, keys, True, out, rows)
    return [(node, src) for node, _, src, _ in out]


@dataclass
class Term:
    """One source of a part: rows ``rows`` (of the batch) add ``scale`` times
    ``node`` at ``indexes``. For a constant, ``node`` is None and ``value`` is set.
    The key-based evaluation (:func:`resolve_part_keys`) gives the packed ``keys``
    of the source cindexes instead of ``indexes``."""

    node: str | None
    scale: float
    rows: np.ndarray
    indexes: np.ndarray | None = None
    value: float = 0.0
    keys: np.ndarray | None = None


Availability = Callable[[str, np.ndarray], np.ndarray]


def resolve_part(e, idx: np.ndarray, available: Availability) -> tuple[np.ndarray, list[Term]]:
    """Which rows of ``idx`` the part ``e`` can compute, and the terms they use.

    ``available(node, indexes)`` returns a bool mask. Sum needs both sides,
    Failover uses the first side where it is computable and else the second,
    IfDefined is always computable and uses its input only where available,
    Const is always computable. Terms only cover computable rows.
    """
    idx = np.asarray(idx, dtype=np.int64).reshape(-1, 3)
    comp, terms = _resolve(e, pack(idx), lambda node, keys: available(node, unpack(keys)))
    for t in terms:
        if t.keys is not None:
            t.indexes = unpack(t.keys)
    return comp, terms


def resolve_part_keys(e, keys: np.ndarray,
                      available: Availability) -> tuple[np.ndarray, list[Term]]:
    """:func:`resolve_part` on packed keys: ``available(node, keys)``, and the
    terms carry ``keys`` (their ``indexes`` are None)."""
    return _resolve(e, keys, available)


def _resolve(e, keys, available):
    """(computable mask, terms) of part ``e`` at ``keys``; term rows are positions
    in ``keys``, increasing."""
    k = len(keys)
    if isinstance(e, _FORWARDING):
        cands: list = []
        _forward(e, keys, np.arange(k, dtype=np.int64), cands)
        comp = np.zeros(k, dtype=bool)
        terms = []
        for ref, local, src in cands:
            ok = available(ref.node, src) if len(src) else np.zeros(0, dtype=bool)
            if ok.all():
                comp[local] = True
                if len(src):
                    terms.append(Term(ref.node, ref.scale, local, keys=src))
            elif ok.any():
                comp[local[ok]] = True
                terms.append(Term(ref.node, ref.scale, local[ok], keys=src[ok]))
        return comp, terms
    if isinstance(e, SumOf):
        ca, ta = _resolve(e.a, keys, available)
        cb, tb = _resolve(e.b, keys, available)
        both = ca & cb
        if both.all():
            return both, ta + tb
        return both, _restrict(ta + tb, both)
    if isinstance(e, FailoverOf):
        ca, ta = _resolve(e.a, keys, available)
        cb, tb = _resolve(e.b, keys, available)
        keep_b = _restrict(tb, ~ca)
        return ca | cb, _restrict(ta, ca) + keep_b
    if isinstance(e, IfDefinedOf):
        ca, ta = _resolve(e.a, keys, available)
        return np.ones(k, dtype=bool), _restrict(ta, ca)
    if isinstance(e, ConstOf):
        return np.ones(k, dtype=bool), [Term(None, 1.0, np.arange(k, dtype=np.int64), None,
                                             e.value)]
    raise TypeError(e)


def _restrict(terms: list[Term], allowed: np.ndarray) -> list[Term]:
    """Keep only the rows of each term where the mask ``allowed`` (over the
    batch's rows) is True."""
    out = []
    for t in terms:
        keep = allowed[t.rows]
        if keep.all():
            out.append(t)
        elif keep.any():
            out.append(Term(t.node, t.scale, t.rows[keep],
                            None if t.indexes is None else t.indexes[keep], t.value,
                            None if t.keys is None else t.keys[keep]))
    return out


# ----------------------------------------------------------------------------------
# Parsing and normalization
# ----------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_.\-]*)|(-?[0-9.][0-9.eE+\-]*)|(\S))")
_FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_DEPTH = 64  # descriptor functions nested deeper are an error (Kaldi's are a few deep)
_X_LIMIT = int(INDEX_LIMITS[X_COL]) // 2  # x offsets and values: within the index x range
_FUNCTIONS = {"Append", "Sum", "Failover", "IfDefined", "Offset", "Round", "ReplaceIndex",
              "Switch", "Const", "Scale"}


def _error(message: str) -> DescriptorError:
    """A DescriptorError whose ``detail`` is the bare message, so callers that know
    the file and line can re-raise it with those."""
    err = DescriptorError(message)
    err.detail = message
    return err


class _Parser:
    def __init__(self, text: str, node_names: set[str] | None):
        self.text = text
        self.node_names = node_names
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN_RE.match(text, pos)
            if m is None or m.end() == pos:
                break
            if m.group(1):
                self.tokens.append(("name", m.group(1), m.start(1)))
            elif m.group(2):
                self.tokens.append(("num", m.group(2), m.start(2)))
            elif m.group(3):
                self.tokens.append(("punct", m.group(3), m.start(3)))
            pos = m.end()
        self.i = 0
        self.depth = 0

    def error(self, message: str) -> DescriptorError:
        if self.i < len(self.tokens):
            kind, tok, pos = self.tokens[self.i]
            where = f" at {tok!r} (column {pos + 1})"
        else:
            where = " at end of input"
        return _error(f"bad descriptor {self.text!r}: {message}{where}")

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else (None, None, None)

    def take(self, kind=None, value=None):
        tk = self.peek()
        if tk[0] is None or (kind and tk[0] != kind) or (value and tk[1] != value):
            want = value or kind or "a token"
            raise self.error(f"expected {want}")
        self.i += 1
        return tk

    def int_arg(self, what: str, limit: int | str, positive: bool = False) -> int:
        """An integer argument: ``what`` (for messages) must lie within ``limit``,
        a number or the name of a pynnet3.limits limit (magnitude), and be > 0
        when ``positive``."""
        kind, tok, _ = self.peek()
        try:
            value = int(tok) if kind == "num" else None
        except ValueError:
            value = None
        if value is None:
            raise self.error("expected an integer")
        if isinstance(limit, str):
            problem = limits.exceeded(limit, value, what)
        else:
            problem = f"{what} = {value} is outside [{-limit}, {limit}]" if abs(value) > limit \
                else None
        if not problem and positive and value <= 0:
            problem = f"{what} must be positive"
        if problem:
            raise self.error(problem)
        self.i += 1
        return value

    def float_arg(self) -> float:
        kind, tok, _ = self.peek()
        try:
            value = float(tok) if kind == "num" else None
        except ValueError:
            value = None
        if value is None:
            raise self.error("expected a number")
        if not abs(value) <= _FLOAT32_MAX:
            raise self.error("expected a finite number (within float range)")
        self.i += 1
        return value

    def parse(self):
        expr = self.expr()
        if self.i != len(self.tokens):
            raise self.error("unexpected trailing text")
        return expr

    def expr(self):
        kind, tok, _ = self.peek()
        if kind != "name":
            raise self.error("expected a node name or a descriptor function")
        nxt = self.tokens[self.i + 1] if self.i + 1 < len(self.tokens) else (None, None, None)
        if nxt[1] == "(":
            if tok not in _FUNCTIONS:
                raise self.error(f"unknown descriptor function {tok!r} (expected one of "
                                 f"{', '.join(sorted(_FUNCTIONS))})")
            if self.depth >= MAX_DEPTH:
                raise self.error(f"descriptor functions nested more than {MAX_DEPTH} deep")
            self.i += 2
            self.depth += 1
            node = getattr(self, "f_" + tok)()
            self.depth -= 1
            self.take("punct", ")")
            return node
        self.i += 1
        if self.node_names is not None and tok not in self.node_names:
            self.i -= 1
            raise self.error(f"unknown node {tok!r}")
        return ("node", tok)

    def comma(self):
        self.take("punct", ",")

    def expr_list(self, minimum: int) -> list:
        items = [self.expr()]
        while self.peek()[1] == ",":
            self.i += 1
            items.append(self.expr())
        if len(items) < minimum:
            raise self.error(f"expected at least {minimum} arguments")
        return items

    def f_Append(self):
        return ("append", self.expr_list(1))

    def f_Sum(self):
        terms = self.expr_list(1)
        # Sum(a, b, c) is Sum(a, Sum(b, c)): k terms nest k - 1 deep
        if self.depth - 1 + len(terms) - 1 > MAX_DEPTH:
            raise self.error(f"Sum() of {len(terms)} terms nests more than {MAX_DEPTH} deep")
        return ("sum", terms)

    def f_Failover(self):
        a = self.expr()
        self.comma()
        return ("failover", [a, self.expr()])

    def f_IfDefined(self):
        return ("ifdefined", self.expr())

    def f_Offset(self):
        a = self.expr()
        self.comma()
        t = self.int_arg("Offset() t-offset", "max_context")
        x = 0
        if self.peek()[1] == ",":
            self.i += 1
            x = self.int_arg("Offset() x-offset", _X_LIMIT)
        return ("offset", a, t, x)

    def f_Round(self):
        a = self.expr()
        self.comma()
        return ("round", a, self.int_arg("Round() modulus", "max_modulus", positive=True))

    def f_ReplaceIndex(self):
        a = self.expr()
        self.comma()
        kind, var, _ = self.take("name")
        if var not in ("t", "x"):
            self.i -= 1
            raise self.error("ReplaceIndex() variable must be t or x")
        self.comma()
        value = self.int_arg(f"ReplaceIndex() {var} value",
                             "max_context" if var == "t" else _X_LIMIT)
        return ("replace", a, var, value)

    def f_Switch(self):
        return ("switch", self.expr_list(1))

    def f_Const(self):
        v = self.float_arg()
        self.comma()
        return ("const", v, self.int_arg("Const() dimension", "max_dim", positive=True))

    def f_Scale(self):
        s = self.float_arg()
        self.comma()
        return ("scale", s, self.expr())


def _normalize(g, text: str) -> list:
    """General parse tree -> list of normal-form parts."""
    kind = g[0]
    if kind == "node":
        return [NodeRef(g[1])]
    if kind == "append":
        return [p for a in g[1] for p in _normalize(a, text)]
    if kind in ("sum", "failover"):
        args = [_normalize(a, text) for a in g[1]]
        lengths = {len(a) for a in args}
        if len(lengths) != 1:
            raise _error(f"bad descriptor {text!r}: {kind.title()}() of Append "
                         "expressions with different numbers of terms")
        cls = SumOf if kind == "sum" else FailoverOf
        out = []
        for col in zip(*args, strict=True):
            acc = col[-1]
            for item in reversed(col[:-1]):
                acc = cls(item, acc)
            out.append(acc)
        return out
    if kind == "ifdefined":
        return [IfDefinedOf(p) for p in _normalize(g[1], text)]
    if kind == "const":
        return [ConstOf(float(np.float32(g[1])), g[2])]
    if kind == "scale":
        return [_push(p, ("scale", float(np.float32(g[1])))) for p in _normalize(g[2], text)]
    if kind == "offset":
        return [_push(p, ("offset", g[2], g[3])) for p in _normalize(g[1], text)]
    if kind == "round":
        return [_push(p, ("round", g[2])) for p in _normalize(g[1], text)]
    if kind == "replace":
        return [_push(p, ("replace", g[2], g[3])) for p in _normalize(g[1], text)]
    if kind == "switch":
        # Switch(Append(a, b), Append(c, d)) is Append(Switch(a, c), Switch(b, d)).
        args = [_normalize(a, text) for a in g[1]]
        if len({len(a) for a in args}) != 1:
            raise _error(f"bad descriptor {text!r}: Switch() of Append expressions with "
                         "different numbers of terms")
        out = []
        for col in zip(*args, strict=True):
            if not all(isinstance(c, _FORWARDING) for c in col):
                raise _error(f"bad descriptor {text!r}: Switch() arguments must be node "
                             "expressions (no Sum, Failover, IfDefined or Const inside)")
            out.append(SwitchOf(tuple(col)))
        return out
    raise _error(f"bad descriptor {text!r}")


def _push(e, op):
    """Apply a forwarding operation (or scale) to a normal-form part, pushing it
    below Sum / Failover / IfDefined as Kaldi's normalization does."""
    if isinstance(e, _TwoTerms):
        return type(e)(_push(e.a, op), _push(e.b, op))
    if isinstance(e, IfDefinedOf):
        return IfDefinedOf(_push(e.a, op))
    if isinstance(e, ConstOf):
        if op[0] == "scale":
            return ConstOf(float(np.float32(e.value * op[1])), e.dim)
        return e
    kind = op[0]
    if kind == "scale":
        return _scale_leaves(e, op[1])
    if kind == "offset":
        if isinstance(e, OffsetOf):
            e, t, x = e.src, e.t_offset + op[1], e.x_offset + op[2]
        else:
            t, x = op[1], op[2]
        # Kaldi drops a zero offset: Offset(x, 0) prints as x.
        return e if (t, x) == (0, 0) else OffsetOf(e, t, x)
    if kind == "round":
        return RoundOf(e, op[1])
    if kind == "replace":
        return ReplaceIndexOf(e, op[1], op[2])
    raise TypeError(op)


def _scale_leaves(e, s: float):
    """Forwarding chain ``e`` with every leaf's scale multiplied by ``s`` (in float32)."""
    if not isinstance(e, _FORWARDING):
        raise TypeError(e)
    return map_refs(e, lambda r: NodeRef(r.node, float(np.float32(r.scale * s))))


def parse_descriptor(text: str, node_names: set[str] | None = None) -> Descriptor:
    """Parse and normalize a descriptor. With ``node_names``, unknown nodes are errors."""
    if not text or not text.strip():
        raise _error("empty descriptor")
    tree = _Parser(text, node_names).parse()
    return Descriptor(tuple(_normalize(tree, text)))


def part_computable(e, idx: np.ndarray, available: Availability) -> np.ndarray:
    """Computability only (no terms), evaluated lazily: the second side of a Sum is
    only asked about rows where the first is computable, the second side of a
    Failover only where the first is not, and IfDefined / Const never ask."""
    idx = np.asarray(idx, dtype=np.int64).reshape(-1, 3)
    return part_computable_keys(e, pack(idx), lambda node, k: available(node, unpack(k)))


def part_computable_keys(e, keys: np.ndarray, available: Availability) -> np.ndarray:
    """:func:`part_computable` on packed keys (``available(node, keys)``)."""
    k = len(keys)
    if k == 0:
        return np.zeros(0, dtype=bool)
    if isinstance(e, _FORWARDING):
        cands: list = []
        _forward(e, keys, np.arange(k, dtype=np.int64), cands)
        if len(cands) == 1:  # (no Switch: one candidate for all rows, in order)
            ref, _, src = cands[0]
            return np.array(available(ref.node, src), dtype=bool)  # (callers write to it)
        res = np.zeros(k, dtype=bool)
        for ref, rows, src in cands:
            res[rows] = available(ref.node, src)
        return res
    if isinstance(e, SumOf):
        res = part_computable_keys(e.a, keys, available)
        if res.any():
            res[res] = part_computable_keys(e.b, keys[res], available)
        return res
    if isinstance(e, FailoverOf):
        res = part_computable_keys(e.a, keys, available)
        if not res.all():
            res[~res] = part_computable_keys(e.b, keys[~res], available)
        return res
    return np.ones(k, dtype=bool)


TimeBounds = tuple[float, float]
"""``(lo, hi)``: every computable cindex of a node has ``lo <= t <= hi`` (±inf when
unbounded; ``lo > hi`` when nothing is computable). An over-approximation."""

UNBOUNDED: TimeBounds = (-math.inf, math.inf)


def _meet(a: TimeBounds, b: TimeBounds) -> TimeBounds:
    return (max(a[0], b[0]), min(a[1], b[1]))


def _join(a: TimeBounds, b: TimeBounds) -> TimeBounds:
    if a[0] > a[1]:
        return b
    if b[0] > b[1]:
        return a
    return (min(a[0], b[0]), max(a[1], b[1]))


def part_time_bounds(e, node_bounds: Callable[[str], TimeBounds]) -> TimeBounds:
    """Bounds on the t of the rows that part ``e`` can compute, given bounds on the
    computable t of each node (``node_bounds``). Sound, not tight: a row outside
    is certainly not computable; one inside may or may not be."""
    if isinstance(e, NodeRef):
        return node_bounds(e.node)
    if isinstance(e, OffsetOf):
        lo, hi = part_time_bounds(e.src, node_bounds)
        return (lo - e.t_offset, hi - e.t_offset)
    if isinstance(e, RoundOf):
        # the row at t reads floor(t/m)*m, which is <= t and > t - m
        lo, hi = part_time_bounds(e.src, node_bounds)
        return (lo, hi + e.t_modulus - 1) if lo <= hi else (lo, hi)
    if isinstance(e, ReplaceIndexOf):
        lo, hi = part_time_bounds(e.src, node_bounds)
        if e.variable == "x":
            return (lo, hi)
        return UNBOUNDED if lo <= e.value <= hi else (math.inf, -math.inf)
    if isinstance(e, SwitchOf):
        out = (math.inf, -math.inf)
        for s in e.srcs:
            out = _join(out, part_time_bounds(s, node_bounds))
        return out
    if isinstance(e, SumOf):
        return _meet(part_time_bounds(e.a, node_bounds), part_time_bounds(e.b, node_bounds))
    if isinstance(e, FailoverOf):
        return _join(part_time_bounds(e.a, node_bounds), part_time_bounds(e.b, node_bounds))
    return UNBOUNDED  # IfDefined, Const: computable everywhere


def descriptor_time_bounds(d: Descriptor, node_bounds: Callable[[str], TimeBounds]
                           ) -> TimeBounds:
    """:func:`part_time_bounds` of a whole descriptor (every part is required)."""
    out = UNBOUNDED
    for p in d.parts:
        out = _meet(out, part_time_bounds(p, node_bounds))
    return out


def descriptor_computable(d: Descriptor, idx: np.ndarray, available: Availability) -> np.ndarray:
    idx = np.asarray(idx, dtype=np.int64).reshape(-1, 3)
    return descriptor_computable_keys(d, pack(idx), lambda node, k: available(node, unpack(k)))


def descriptor_computable_keys(d: Descriptor, keys: np.ndarray,
                               available: Availability) -> np.ndarray:
    """Whether every part is computable (:func:`part_computable_keys`), each part
    asked only about the rows all earlier parts can compute."""
    res = part_computable_keys(d.parts[0], keys, available) if d.parts \
        else np.ones(len(keys), dtype=bool)
    for p in d.parts[1:]:
        if not res.any():
            break
        if res.all():
            res = part_computable_keys(p, keys, available)
        else:
            res[res] = part_computable_keys(p, keys[res], available)
    return res
