"""A read-only graph view of an :class:`~pynnet3.Nnet` for network-level passes.

Nodes are the network's nodes (input, component, dim-range, output); an
:class:`Edge` is one reference of a consumer's descriptor to a producer (or a
dim-range node's source), carrying the part (column block) it feeds, its scale,
its time/x offset and the descriptor constructs around it (Sum, IfDefined,
Failover, Round, ReplaceIndex, Switch). Each node knows its consumers.

The view is a snapshot: build a new one after the network changes (the
rewriter does). It never mutates the network.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..components.base import Component
from ..nnet import Nnet, Node
from .algebra import Reference, references


@dataclass(frozen=True)
class Edge:
    """``src`` feeds ``dst``; ``ref`` is None for a dim-range node's source."""

    src: str
    dst: str
    ref: Reference | None = None

    @property
    def t_offset(self) -> int:
        return self.ref.t_offset if self.ref is not None else 0

    @property
    def scale(self) -> float:
        return self.ref.scale if self.ref is not None else 1.0

    def label(self) -> str:
        """Short text: offsets, scale and wrappers, e.g. ``t-1 *0.66 IfDefined``."""
        if self.ref is None:
            return "dim-range"
        bits = []
        if self.ref.t_offset:
            bits.append(f"t{self.ref.t_offset:+d}")
        if self.ref.x_offset:
            bits.append(f"x{self.ref.x_offset:+d}")
        if self.ref.scale != 1.0:
            bits.append(f"*{self.ref.scale:g}")
        bits.extend(w for w in dict.fromkeys(self.ref.wrappers) if w != "Offset")
        return " ".join(bits)


@dataclass
class GraphNode:
    """One node with its incoming edges (descriptor order) and consumers."""

    node: Node
    position: int
    inputs: list[Edge] = field(default_factory=list)
    consumers: list[Edge] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def kind(self) -> str:
        return self.node.kind

    @property
    def consumer_names(self) -> list[str]:
        """Distinct consumer node names, in network order of first reference."""
        return list(dict.fromkeys(e.dst for e in self.consumers))

    @property
    def source_names(self) -> list[str]:
        return list(dict.fromkeys(e.src for e in self.inputs))


class NetworkGraph:
    """Nodes by name with edges and consumers; see the module docstring."""

    def __init__(self, nnet: Nnet):
        self.nnet = nnet
        self.nodes: dict[str, GraphNode] = {
            n.name: GraphNode(n, i) for i, n in enumerate(nnet.nodes)}
        for gn in self.nodes.values():
            n = gn.node
            if n.kind == "dim-range-node":
                edges = [Edge(n.source, n.name)]
            elif n.descriptor is not None:
                edges = [Edge(r.node, n.name, r) for r in references(n.descriptor)]
            else:
                edges = []
            gn.inputs = edges
            for e in edges:
                self.nodes[e.src].consumers.append(e)

    def __getitem__(self, name: str) -> GraphNode:
        return self.nodes[name]

    def __contains__(self, name: str) -> bool:
        return name in self.nodes

    def __iter__(self):
        return iter(self.nodes.values())

    def component(self, name: str) -> Component | None:
        """The component of a component-node (None for other kinds)."""
        n = self.nodes[name].node
        return self.nnet.components[n.component] if n.kind == "component-node" else None

    def feeds_output(self, name: str) -> bool:
        """True when an output node reads ``name`` directly."""
        return any(self.nodes[c].kind == "output-node" for c in self[name].consumer_names)

    def component_users(self) -> dict[str, list[str]]:
        """Component name -> the component-nodes that use it."""
        users: dict[str, list[str]] = {name: [] for name in self.nnet.components}
        for gn in self.nodes.values():
            if gn.kind == "component-node":
                users.setdefault(gn.node.component, []).append(gn.name)
        return users

    def scc_of(self, name: str) -> set[str]:
        """The nodes on a cycle through ``name`` (its strongly connected component;
        just ``{name}`` unless it reads itself or takes part in a recurrence)."""
        def reach(start: str, step) -> set[str]:
            seen, stack = set(), [start]
            while stack:
                x = stack.pop()
                for y in step(x):
                    if y not in seen:
                        seen.add(y)
                        stack.append(y)
            return seen

        ahead = reach(name, lambda x: self.nodes[x].consumer_names)
        behind = reach(name, lambda x: self.nodes[x].source_names)
        return (ahead & behind) | {name}

    def reverse_topological(self) -> list[str]:
        """Node names, consumers before producers (recurrences broken at back edges:
        network order decides among nodes of one cycle)."""
        order: list[str] = []
        state: dict[str, int] = {}
        for start in reversed(list(self.nodes)):
            if start in state:
                continue
            stack = [(start, iter(self.nodes[start].source_names))]
            state[start] = 1
            while stack:
                name, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    stack.pop()
                    state[name] = 2
                    order.append(name)
                elif nxt not in state:
                    state[nxt] = 1
                    stack.append((nxt, iter(self.nodes[nxt].source_names)))
        order.reverse()
        return order

    def describe(self) -> str:
        """One line per node: kind, name, component type, inputs with edge labels and
        consumers (what ``pynnet3 optimize-network --report`` shows for a graph)."""
        lines = []
        for gn in self.nodes.values():
            comp = self.component(gn.name)
            what = f" [{comp.type_name}]" if comp is not None else ""
            ins = ", ".join(f"{e.src}({e.label()})" if e.label() else e.src for e in gn.inputs)
            outs = ", ".join(gn.consumer_names)
            lines.append(f"{gn.kind} {gn.name}{what} <- {ins or '-'} -> {outs or '-'}")
        return "\n".join(lines)
