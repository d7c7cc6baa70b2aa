"""Descriptor algebra for network rewrites: substitution and reference analysis.

A rewrite that removes an identity-like node ``x`` (its output equals its input
descriptor ``D``) must make every consumer read ``D`` where it read ``x``. For a
consumer chain ``C(x)`` (Offset / Round / ReplaceIndex / Switch / Scale around
the reference) the result is ``C`` applied to ``D``: C maps the consumer's index
first, then D maps it again. Computability is preserved because a simple node is
computable at an index exactly when its descriptor is.

Substitution builds the composed expression and re-normalizes it with the
descriptor parser, so the result is always in Kaldi's canonical form (offsets
merged, forwarding operations pushed below Sum / IfDefined / Failover, Append
only at the top) and prints as Kaldi would write it. When no canonical form
exists (an Append substituted inside a Sum, a Sum inside a Switch) substitution
refuses with a reason instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..descriptor import (
    ConstOf,
    Descriptor,
    FailoverOf,
    IfDefinedOf,
    NodeRef,
    OffsetOf,
    ReplaceIndexOf,
    RoundOf,
    SumOf,
    SwitchOf,
    map_refs,
    parse_descriptor,
)
from ..errors import DescriptorError


class SubstitutionError(Exception):
    """A descriptor substitution has no canonical form; ``str(e)`` says why."""


def _text(e) -> str:
    """Print a (possibly non-normal) expression in Kaldi descriptor syntax."""
    if isinstance(e, Descriptor):
        if len(e.parts) == 1:
            return _text(e.parts[0])
        return "Append(" + ", ".join(_text(p) for p in e.parts) + ")"
    if isinstance(e, _Scaled):
        return f"Scale({_float(e.scale)}, {_text(e.inner)})"
    if isinstance(e, NodeRef):
        return str(e)
    if isinstance(e, OffsetOf):
        return f"Offset({_text(e.src)}, {e.t_offset}, {e.x_offset})"
    if isinstance(e, RoundOf):
        return f"Round({_text(e.src)}, {e.t_modulus})"
    if isinstance(e, ReplaceIndexOf):
        return f"ReplaceIndex({_text(e.src)}, {e.variable}, {e.value})"
    if isinstance(e, SwitchOf):
        return "Switch(" + ", ".join(_text(s) for s in e.srcs) + ")"
    if isinstance(e, (SumOf, FailoverOf)):
        return f"{e.function}({_text(e.a)}, {_text(e.b)})"
    if isinstance(e, IfDefinedOf):
        return f"IfDefined({_text(e.a)})"
    if isinstance(e, ConstOf):
        return str(e)
    raise TypeError(e)


def _float(x: float) -> str:
    # repr of the float32 value: exact round trip through the parser (which
    # rounds to float32 again), unlike Kaldi's 7-digit printing.
    return repr(float(np.float32(x)))


@dataclass(frozen=True)
class _Scaled:
    """A scale around a whole sub-expression (printed as ``Scale(s, ...)``)."""

    scale: float
    inner: object


def _replace(e, node: str, replacement: Descriptor):
    """``e`` with every reference to ``node`` replaced by ``replacement`` (scaled
    by the reference's scale); not normalized."""
    def swap(ref: NodeRef):
        if ref.node != node:
            return ref
        inner = replacement if len(replacement.parts) > 1 else replacement.parts[0]
        return inner if ref.scale == 1.0 else _Scaled(ref.scale, inner)

    return map_refs(e, swap)


def substitute(desc: Descriptor, node: str, replacement: Descriptor) -> Descriptor:
    """``desc`` reading ``replacement`` wherever it read ``node``, in canonical form.
    Raises :class:`SubstitutionError` when the result cannot be expressed."""
    composed = Descriptor(tuple(_replace(p, node, replacement) for p in desc.parts))
    text = _text(composed)
    try:
        out = _consts_first(parse_descriptor(text))
    except DescriptorError as e:
        raise SubstitutionError(f"{desc} with {node} := {replacement}: "
                                f"{getattr(e, 'detail', str(e))}") from None
    if _late_consts(out) > _late_consts(desc):
        raise SubstitutionError(f"{desc} with {node} := {replacement}: a Const() would "
                                "follow other terms it cannot be moved before")
    return out


def reparse(desc: Descriptor) -> Descriptor:
    """``desc`` in canonical form (as the parser would normalize its text), with
    Const() terms of a Sum first."""
    return _consts_first(parse_descriptor(_text(desc)))


def _consts_first(desc: Descriptor) -> Descriptor:
    """Sum terms reordered so that Const() terms come first, merged into one (a Sum
    is commutative; the compiler sets a constant only as the first term of a row)."""
    parts = []
    for p in desc.parts:
        if isinstance(p, SumOf):
            terms: list = []
            _flatten_sum(p, terms)
            consts = [t for t in terms if isinstance(t, ConstOf)]
            if len(consts) > 1:  # Const(a, d) + Const(b, d) = Const(a + b, d)
                consts = [ConstOf(float(np.float32(sum(c.value for c in consts))),
                                  consts[0].dim)]
            ordered = consts + [t for t in terms if not isinstance(t, ConstOf)]
            if ordered != terms:
                acc = ordered[-1]
                for t in reversed(ordered[:-1]):
                    acc = SumOf(t, acc)
                p = acc
        parts.append(p)
    return Descriptor(tuple(parts))


def _late_consts(desc: Descriptor) -> int:
    """Const() leaves that are not the first leaf of their part."""
    count = 0
    for p in desc.parts:
        leaves: list = []
        _leaves(p, leaves)
        count += sum(isinstance(x, ConstOf) for x in leaves[1:])
    return count


def _leaves(e, out: list) -> None:
    if isinstance(e, (SumOf, FailoverOf)):
        _leaves(e.a, out)
        _leaves(e.b, out)
    elif isinstance(e, IfDefinedOf):
        _leaves(e.a, out)
    else:
        out.append(e)


# -- reference analysis ----------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """One leaf of a descriptor that reads a node: which part (column block) it is
    in, its scale, its time/x offset (when the chain is only offsets), and whether it
    sits under Sum / IfDefined / Failover / Round / ReplaceIndex / Switch."""

    node: str
    part: int
    scale: float
    t_offset: int
    x_offset: int
    wrappers: tuple[str, ...]

    @property
    def is_offset_chain(self) -> bool:
        """Only Offset (or nothing) between the part's top and the node."""
        return all(w == "Offset" for w in self.wrappers)


def references(desc: Descriptor) -> list[Reference]:
    """Every node reference of ``desc``, part by part, left to right."""
    # (a descriptor is immutable and its references are frozen: found once per
    # descriptor, kept beside its cached properties; the network optimizer's graph
    # is rebuilt after every change and asks for every node's)
    found = desc.__dict__.get("_references")
    if found is None:
        out: list[Reference] = []
        for i, p in enumerate(desc.parts):
            _refs(p, i, 0, 0, (), out)
        found = tuple(out)
        desc.__dict__["_references"] = found
    return list(found)


def _refs(e, part: int, t: int, x: int, wrappers: tuple, out: list) -> None:
    if isinstance(e, NodeRef):
        out.append(Reference(e.node, part, e.scale, t, x, wrappers))
    elif isinstance(e, OffsetOf):
        _refs(e.src, part, t + e.t_offset, x + e.x_offset, wrappers + ("Offset",), out)
    elif isinstance(e, RoundOf):
        _refs(e.src, part, t, x, wrappers + ("Round",), out)
    elif isinstance(e, ReplaceIndexOf):
        _refs(e.src, part, t, x, wrappers + ("ReplaceIndex",), out)
    elif isinstance(e, SwitchOf):
        for s in e.srcs:
            _refs(s, part, t, x, wrappers + ("Switch",), out)
    elif isinstance(e, (SumOf, FailoverOf)):
        _refs(e.a, part, t, x, wrappers + (e.function,), out)
        _refs(e.b, part, t, x, wrappers + (e.function,), out)
    elif isinstance(e, IfDefinedOf):
        _refs(e.a, part, t, x, wrappers + ("IfDefined",), out)


def part_is_linear_in(part, node: str) -> bool:
    """True when ``part`` is a sum of forwarding chains (Offset / Round /
    ReplaceIndex, any scales) that all read ``node``: a linear map of the node's
    values with no availability choice (no IfDefined / Failover / Const / Switch)."""
    if isinstance(part, SumOf):
        return part_is_linear_in(part.a, node) and part_is_linear_in(part.b, node)
    while isinstance(part, (OffsetOf, RoundOf, ReplaceIndexOf)):
        part = part.src
    return isinstance(part, NodeRef) and part.node == node


def part_scale_sum(part) -> float:
    """Sum of the leaf scales of a part that :func:`part_is_linear_in` accepts."""
    if isinstance(part, SumOf):
        return part_scale_sum(part.a) + part_scale_sum(part.b)
    while isinstance(part, (OffsetOf, RoundOf, ReplaceIndexOf)):
        part = part.src
    return float(part.scale)


def unscale_part(part):
    """The part with every leaf scale set to 1 (for a single forwarding chain)."""
    return _with_scale(part, 1.0)


def is_forwarding(part) -> bool:
    """A single chain of Offset / Round / ReplaceIndex / Switch around node refs."""
    return isinstance(part, (NodeRef, OffsetOf, RoundOf, ReplaceIndexOf, SwitchOf))


def chain_scale(part) -> float | None:
    """The scale of a forwarding chain's leaves when they all agree, else None."""
    scales = {r.scale for r in references(Descriptor((part,)))}
    return scales.pop() if len(scales) == 1 else None


def offsets_of_single_node(desc: Descriptor) -> tuple[str, list[int]] | None:
    """``(node, [t offsets])`` when every part is ``Offset(node, t)`` or ``node``
    of one node with scale 1 and no x offset (Kaldi's collapsible form)."""
    node = None
    offsets: list[int] = []
    for p in desc.parts:
        t = 0
        if isinstance(p, OffsetOf):
            if p.x_offset != 0:
                return None
            t, p = p.t_offset, p.src
        if not isinstance(p, NodeRef) or p.scale != 1.0:
            return None
        if node is None:
            node = p.node
        elif p.node != node:
            return None
        offsets.append(t)
    return (node, offsets) if node is not None else None


def shifted_reads(desc: Descriptor) -> tuple[str, list[tuple[int, int, float]]] | None:
    """``(node, [(t offset, x offset, scale)] per part)`` when every part is one
    node, ``Offset(node, t[, x])`` or a ``Scale`` of those, all of one node: the
    form Kaldi's ModelCollapser collapses through (its DescriptorIsCollapsible: a
    SimpleForwardingDescriptor, which carries a scale, under at most one Offset).
    Else None."""
    node = None
    shifts: list[tuple[int, int, float]] = []
    for p in desc.parts:
        t = x = 0
        if isinstance(p, OffsetOf):
            t, x, p = p.t_offset, p.x_offset, p.src
        if not isinstance(p, NodeRef) or (node is not None and p.node != node):
            return None
        node = p.node
        shifts.append((t, x, float(p.scale)))
    return (node, shifts) if node is not None else None


def scaled(desc: Descriptor, scale: float) -> Descriptor:
    """``Scale(scale, desc)`` in canonical form (scales pushed to the leaves)."""
    if scale == 1.0:
        return desc
    return parse_descriptor(_text(_Scaled(scale, desc if len(desc.parts) > 1
                                          else desc.parts[0])))


def merge_sum_terms(part):
    """A part whose Sum terms that read the same chain are merged into one term
    with the summed scale (``Sum(Scale(a, x), Scale(b, x))`` -> ``Scale(a+b, x)``);
    the part itself when nothing merges. Computability is unchanged: merged
    terms need the same cindexes."""
    if not isinstance(part, SumOf):
        return part
    terms: list = []
    _flatten_sum(part, terms)
    groups: dict[str, list] = {}
    order: list[str] = []
    for t in terms:
        key = str(unscale_part(t)) if is_forwarding(t) and chain_scale(t) is not None \
            else f"#{len(order)}:{t}"
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(t)
    if len(order) == len(terms):
        return part
    merged = []
    for key in order:
        g = groups[key]
        if len(g) == 1:
            merged.append(g[0])
            continue
        total = float(np.float32(sum(chain_scale(t) for t in g)))
        merged.append(_with_scale(unscale_part(g[0]), total))
    acc = merged[-1]
    for t in reversed(merged[:-1]):
        acc = SumOf(t, acc)
    return acc


def _flatten_sum(e, out: list) -> None:
    if isinstance(e, SumOf):
        _flatten_sum(e.a, out)
        _flatten_sum(e.b, out)
    else:
        out.append(e)


def _with_scale(chain, s: float):
    """A forwarding chain with every leaf's scale set to ``s``."""
    if not is_forwarding(chain):
        raise TypeError(chain)
    return map_refs(chain, lambda ref: NodeRef(ref.node, s))
