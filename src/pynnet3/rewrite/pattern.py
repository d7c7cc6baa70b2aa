"""Patterns as data, and the matcher (seed 004's algorithm on nnet3 networks).

A :class:`Pattern` describes a chain of component nodes, root first, walking
inputs backwards: ``entries[0]`` is the root's component type(s), ``entries[1]``
the type of the node the root reads, and so on. ``config_patterns[k]`` are
required values of entry k's component settings (a value, or a predicate);
``sub_patterns[k]`` are conditions on its parameter arrays; ``is_output`` asks
that the root feed an output node. ``edges[k]`` says how entry k may read entry
k+1:

* ``"plain"``: its whole input is that node (``input=bn``);
* ``"spliced"``: every part is the node at some time offset, scale 1 (Kaldi's
  collapsible form ``Append(Offset(bn, -1), bn, Offset(bn, 1))``);
* ``"shifted"``: every part is the node, at a time (and x) offset or not, with
  any scale (all of Kaldi's collapsible form, :func:`~.algebra.shifted_reads`);
* ``"columns"``: some parts read the node through forwarding chains or sums of
  them (any scales, no IfDefined / Failover / Const / Switch); other parts read
  other nodes.

Inner nodes (entries 1..) must be component nodes with a single consumer that
feed no output and are not preserved (cirkit's rule: a fused node's value must
not be needed elsewhere), unless the pattern says ``shared_inner`` (the rule then
leaves the inner node in place for its other consumers). When a match fails the
matcher returns a :class:`MatchFailure` saying which entry and which condition.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..components.base import Component
from ..descriptor import Descriptor
from .algebra import Reference, offsets_of_single_node, part_is_linear_in, shifted_reads
from .graph import NetworkGraph

EDGE_KINDS = ("plain", "spliced", "shifted", "columns")


@dataclass(frozen=True)
class ParamPattern:
    """A condition on one parameter array (or array attribute) of a component:
    ``check(array) -> bool``, described for failure messages."""

    description: str
    check: Callable[[np.ndarray], bool]


@dataclass(frozen=True)
class Pattern:
    """See the module docstring. ``entries`` items are Kaldi type names or tuples
    of alternatives; missing ``config_patterns`` / ``sub_patterns`` / ``edges``
    items mean "no condition" / ``"plain"``."""

    name: str
    entries: tuple
    config_patterns: tuple[Mapping[str, object], ...] = ()
    sub_patterns: tuple[Mapping[str, ParamPattern], ...] = ()
    is_output: bool = False
    edges: tuple[str, ...] = ()
    shared_inner: bool = False

    def __post_init__(self) -> None:
        entries = tuple((e,) if isinstance(e, str) else tuple(e) for e in self.entries)
        object.__setattr__(self, "entries", entries)
        if not entries:
            raise ValueError(f"pattern {self.name!r} has no entries")
        for k, kind in enumerate(self.edges):
            if kind not in EDGE_KINDS:
                raise ValueError(f"pattern {self.name!r}: edge {k} kind {kind!r} not in "
                                 f"{EDGE_KINDS}")

    def edge(self, k: int) -> str:
        return self.edges[k] if k < len(self.edges) else "plain"

    def config(self, k: int) -> Mapping[str, object]:
        return self.config_patterns[k] if k < len(self.config_patterns) else {}

    def params(self, k: int) -> Mapping[str, ParamPattern]:
        return self.sub_patterns[k] if k < len(self.sub_patterns) else {}


@dataclass
class Match:
    """A pattern found at ``nodes[0]`` (the root): ``nodes[k]`` matched entry k,
    ``components[k]`` is its component, ``links[k]`` the references through which
    ``nodes[k]`` reads ``nodes[k + 1]``, ``inputs[k]`` the input descriptor of
    ``nodes[k]``."""

    pattern: Pattern
    nodes: tuple[str, ...]
    components: tuple[Component, ...]
    links: tuple[tuple[Reference, ...], ...] = field(default_factory=tuple)
    inputs: tuple[Descriptor, ...] = field(default_factory=tuple)

    @property
    def root(self) -> str:
        return self.nodes[0]

    @property
    def size(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class MatchFailure:
    """Why ``pattern`` does not match at ``node``: the entry it failed on (None for
    conditions on the whole match) and the condition."""

    pattern: str
    node: str
    entry: int | None
    reason: str

    def __str__(self) -> str:
        where = f"entry {self.entry}" if self.entry is not None else "match"
        return f"{self.pattern} at {self.node}: {where}: {self.reason}"

    def __bool__(self) -> bool:
        return False


def component_config(comp: Component) -> dict[str, object]:
    """The settings a config pattern can ask about: the component's public
    non-array attributes (``test_mode``, ``dropout_proportion``, ...) plus ``type``."""
    cfg: dict[str, object] = {"type": comp.type_name}
    for k, v in vars(comp).items():
        if not k.startswith("_") and not isinstance(v, (np.ndarray, list, dict)):
            cfg[k] = v
    return cfg


_NO_SETTING = object()


def _setting(comp: Component, key: str):
    """``component_config(comp)[key]``, or ``_NO_SETTING`` when it has no such key
    (without building the whole dict: the matcher asks for one or two)."""
    v = vars(comp).get(key, _NO_SETTING)
    if v is not _NO_SETTING and not key.startswith("_") \
            and not isinstance(v, (np.ndarray, list, dict)):
        return v
    return comp.type_name if key == "type" else _NO_SETTING


def match_pattern(graph: NetworkGraph, root: str, pattern: Pattern,
                  preserve: frozenset[str] = frozenset()) -> Match | MatchFailure:
    """Try ``pattern`` rooted at node ``root``."""
    nodes: list[str] = []
    comps: list[Component] = []
    links: list[tuple[Reference, ...]] = []
    current = root

    def fail(entry: int | None, reason: str) -> MatchFailure:
        return MatchFailure(pattern.name, root, entry, reason)

    for k, types in enumerate(pattern.entries):
        gn = graph[current]
        if gn.kind != "component-node":
            return fail(k, f"{current!r} is a {gn.kind}, not a component node")
        comp = graph.component(current)
        if comp.type_name not in types:
            return fail(k, f"{current!r} is {comp.type_name}, want {' or '.join(types)}")
        if k > 0 and not pattern.shared_inner:
            consumers = gn.consumer_names
            if len(consumers) != 1:
                return fail(k, f"{current!r} has {len(consumers)} consumers "
                               f"({', '.join(consumers)}); an inner node needs exactly one")
            if current in preserve:
                return fail(k, f"{current!r} is preserved")
        if k > 0 and graph.feeds_output(current) and not pattern.shared_inner:
            return fail(k, f"{current!r} feeds an output node")
        for key, want in pattern.config(k).items():
            have = _setting(comp, key)
            if have is _NO_SETTING:
                return fail(k, f"{comp.type_name} has no setting {key!r}")
            ok = want(have) if callable(want) else have == want
            if not ok:
                return fail(k, f"{current!r} has {key}={have!r}, want "
                               f"{getattr(want, '__name__', repr(want))}")
        for pname, pp in pattern.params(k).items():
            arr = comp.params().get(pname)
            if arr is None:
                arr = getattr(comp, pname, None)
            if arr is None:
                return fail(k, f"{comp.type_name} has no parameter {pname!r}")
            if not pp.check(np.asarray(arr)):
                return fail(k, f"{current!r} parameter {pname}: not {pp.description}")
        if current in nodes:
            return fail(k, f"{current!r} already in the match (a cycle)")
        nodes.append(current)
        comps.append(comp)
        if k == len(pattern.entries) - 1:
            break
        found = _producer(graph, current, pattern.edge(k), pattern.entries[k + 1])
        if isinstance(found, str):
            return fail(k, found)
        current, refs = found
        links.append(refs)
    if pattern.is_output and not graph.feeds_output(root):
        return fail(None, f"{root!r} does not feed an output node")
    return Match(pattern, tuple(nodes), tuple(comps), tuple(links),
                 tuple(graph[n].node.descriptor for n in nodes))


def _producer(graph: NetworkGraph, node: str, edge: str,
              want_types: tuple[str, ...]) -> tuple[str, tuple[Reference, ...]] | str:
    """The node that ``node`` reads through an edge of kind ``edge`` (with the
    references), or the reason there is none."""
    n = graph[node].node
    desc = n.descriptor
    refs = tuple(e.ref for e in graph[node].inputs)
    if edge == "plain":
        if len(desc.parts) == 1 and len(refs) == 1 and not refs[0].wrappers \
                and refs[0].scale == 1.0:
            return refs[0].node, refs
        return f"input {desc} is not a single plain node"
    if edge == "spliced":
        found = offsets_of_single_node(desc)
        if found is None:
            return f"input {desc} is not one node at time offsets"
        return found[0], refs
    if edge == "shifted":
        found = shifted_reads(desc)
        if found is None:
            return f"input {desc} is not one node at offsets"
        return found[0], refs
    # columns: a node read only through parts that are linear in it
    candidates = []
    for name in dict.fromkeys(r.node for r in refs):
        parts = {r.part for r in refs if r.node == name}
        if all(part_is_linear_in(desc.parts[i], name) for i in parts):
            candidates.append(name)
    typed = [c for c in candidates if graph[c].kind == "component-node"
             and graph.component(c).type_name in want_types]
    if not typed:
        return (f"no part of {desc} is a linear read of a {' or '.join(want_types)} node"
                if candidates else f"no node of {desc} is read only through plain "
                                   "offsets, scales and sums")
    name = typed[0]
    return name, tuple(r for r in refs if r.node == name)
