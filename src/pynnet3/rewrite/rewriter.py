"""The one mutation path for network rewrites.

Every network-level pass and every pattern rule changes an :class:`~pynnet3.Nnet`
only through a :class:`NetworkRewriter`: it adds components, replaces or inserts
nodes, rewires consumers by descriptor substitution, inlines identity nodes and
drops orphans. It records each change (so drivers know whether anything changed
and reports can list it), refuses unsafe edits (removing a preserved, input or
output node; a substitution with no canonical form) before touching anything,
and :meth:`validate` checks that the result is a valid network that
``nnet.write()`` can save as a Kaldi model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..components.base import Component
from ..descriptor import Descriptor, NodeRef
from ..nnet import Nnet, Node
from .algebra import SubstitutionError, substitute
from .graph import NetworkGraph


class RewriteRefused(Exception):
    """An edit the rewriter will not make; ``str(e)`` says why. Nothing changed."""


@dataclass
class Change:
    """One recorded edit: ``op`` (add-component, replace-node, insert-node,
    set-input, inline, remove-node, remove-component), the object's name, a note."""

    op: str
    name: str
    note: str = ""


@dataclass
class NetworkRewriter:
    """Mutates ``nnet`` in place (callers hand it a copy); see the module docstring.

    ``preserve`` names nodes that must keep their name and values (never inlined
    or removed); output and input nodes are always kept."""

    nnet: Nnet
    preserve: frozenset[str] = frozenset()
    changes: list[Change] = field(default_factory=list)
    _made: dict[tuple, str] = field(default_factory=dict)
    _graph: NetworkGraph | None = None
    # len(changes) when validate() last passed (None: never): no change since, no
    # new check needed
    _valid_at: int | None = None

    # -- views -----------------------------------------------------------------------
    @property
    def graph(self) -> NetworkGraph:
        """A graph view of the current network (rebuilt after each change)."""
        if self._graph is None:
            self._graph = NetworkGraph(self.nnet)
        return self._graph

    def _changed(self, op: str, name: str, note: str = "") -> None:
        self.changes.append(Change(op, name, note))
        self._graph = None

    def is_protected(self, name: str) -> bool:
        """Preserved, input or output nodes: never inlined or removed."""
        n = self.nnet.node(name)
        return name in self.preserve or n.kind in ("input-node", "output-node")

    # -- components --------------------------------------------------------------------
    def add_component(self, name: str, component: Component, key: object = None) -> str:
        """Add ``component`` under ``name`` (Kaldi's ``a.b`` naming for merges).

        With ``key``, a component this rewriter already made under that name with
        an equal key is reused (a merge is built once, as Kaldi does); any other
        clash gets a numeric suffix. Returns the name used."""
        made_key = (name, key)
        if key is not None:
            earlier = self._made.get(made_key)
            if earlier is not None and earlier in self.nnet.components:
                return earlier
        base, k = name, 1
        while name in self.nnet.components:
            k += 1
            name = f"{base}.{k}"
        self.nnet.components[name] = component
        if key is not None:
            self._made[made_key] = name
        self._changed("add-component", name, component.type_name)
        return name

    # -- nodes ---------------------------------------------------------------------------
    def replace_node(self, name: str, node: Node, note: str = "") -> None:
        """Put ``node`` where node ``name`` is (its kind and name may differ)."""
        idx = self._index(name)
        if node.name != name and self.nnet.has_node(node.name):
            raise RewriteRefused(f"cannot rename {name!r} to existing node {node.name!r}")
        nodes = list(self.nnet.nodes)
        nodes[idx] = node
        self.nnet.nodes = nodes
        self._changed("replace-node", node.name, note)

    def insert_before(self, anchor: str, node: Node, note: str = "") -> None:
        """Insert a new node just before ``anchor`` in network order."""
        if self.nnet.has_node(node.name):
            raise RewriteRefused(f"node {node.name!r} already exists")
        idx = self._index(anchor)
        self.nnet.nodes = self.nnet.nodes[:idx] + [node] + self.nnet.nodes[idx:]
        self._changed("insert-node", node.name, note)

    def set_input(self, name: str, descriptor: Descriptor, note: str = "") -> None:
        """Give component / output node ``name`` a new input descriptor."""
        n = self.nnet.node(name)
        if n.descriptor is None:
            raise RewriteRefused(f"{n.kind} {name!r} has no input descriptor")
        self.replace_node(name, replace(n, descriptor=descriptor), note or f"input={descriptor}")
        self.changes[-1].op = "set-input"

    def unique_node_name(self, base: str) -> str:
        name, k = base, 1
        while self.nnet.has_node(name):
            k += 1
            name = f"{base}.{k}"
        return name

    # -- rewiring ------------------------------------------------------------------------
    def inline(self, name: str, replacement: Descriptor | None = None, note: str = "") -> None:
        """Make every consumer of node ``name`` read ``replacement`` (default: the
        node's own input descriptor) instead, then remove the node.

        Only for nodes whose output equals that descriptor (identity components,
        full-width dim ranges) or where the caller has proved the equivalence.
        Refuses (changing nothing) for protected nodes and for substitutions
        without a canonical form, e.g. an Append into a Sum or a computed
        expression into a dim-range node's source."""
        if self.is_protected(name):
            raise RewriteRefused(f"node {name!r} is preserved, an input or an output")
        node = self.nnet.node(name)
        if replacement is None:
            if node.kind == "dim-range-node":
                replacement = Descriptor((NodeRef(node.source),))
            elif node.descriptor is None:
                raise RewriteRefused(f"{node.kind} {name!r} has no descriptor to inline")
            else:
                replacement = node.descriptor
        if name in replacement.node_names():
            raise RewriteRefused(f"node {name!r} reads itself (a recurrence); not inlined")
        plain_source = (len(replacement.parts) == 1 and isinstance(replacement.parts[0], NodeRef)
                        and replacement.parts[0].scale == 1.0)
        updates: list[Node] = []
        for consumer in self.graph[name].consumer_names:
            c = self.nnet.node(consumer)
            if c.kind == "dim-range-node":
                if not plain_source:
                    raise RewriteRefused(
                        f"dim-range node {consumer!r} reads {name!r}, whose input "
                        f"{replacement} is not a plain node")
                updates.append(replace(c, source=replacement.parts[0].node))
                continue
            try:
                updates.append(replace(c, descriptor=substitute(c.descriptor, name,
                                                                replacement)))
            except SubstitutionError as e:
                raise RewriteRefused(f"cannot rewire {consumer!r}: {e}") from None
        for u in updates:
            self.replace_node(u.name, u, f"reads {replacement} for {name}")
            self.changes[-1].op = "set-input"
        self.remove_node(name, note or f"inlined as {replacement}")

    def remove_node(self, name: str, note: str = "") -> None:
        """Remove a node nobody reads."""
        if self.graph[name].consumers:
            raise RewriteRefused(f"node {name!r} still has consumers "
                                 f"{self.graph[name].consumer_names}")
        idx = self._index(name)
        self.nnet.nodes = self.nnet.nodes[:idx] + self.nnet.nodes[idx + 1:]
        self._changed("remove-node", name, note)

    def remove_orphans(self) -> int:
        """Remove nodes no output depends on (inputs and preserved nodes stay) and
        components no node uses, as Kaldi's RemoveOrphanNodes / Components
        (:meth:`Nnet.orphan_nodes` / :meth:`Nnet.orphan_components`).
        Returns how many things were removed."""
        removed = 0
        orphans = [name for name in self.nnet.orphan_nodes(keep=self.preserve)
                   if self.nnet.node(name).kind != "input-node"]
        if orphans:
            gone = set(orphans)
            self.nnet.nodes = [n for n in self.nnet.nodes if n.name not in gone]
            for name in orphans:
                self._changed("remove-node", name, "orphan")
                removed += 1
        for cname in self.nnet.remove_orphan_components():
            self._changed("remove-component", cname, "orphan")
            removed += 1
        return removed

    def validate(self) -> None:
        """Raise a pynnet3 error unless the network is valid (names, dims, wiring).
        Every change goes through this rewriter, so a network validated since the
        last change is not checked again."""
        if self._valid_at is not None and self._valid_at == len(self.changes):
            return
        self.nnet.validate("rewritten network")
        self._valid_at = len(self.changes)

    def _index(self, name: str) -> int:
        for i, n in enumerate(self.nnet.nodes):
            if n.name == name:
                return i
        raise RewriteRefused(f"no node named {name!r}")
