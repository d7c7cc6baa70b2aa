"""Pruning: nodes that compute nothing new, and nodes nothing needs.

* Identity-like component nodes (NoOp, test-mode dropout families, test-mode
  SpecAugment, BackpropTruncation when derivatives are not kept, elementwise
  maps that are a uniform scale) are replaced by ``Scale(c, their input)`` in
  every consumer. A node whose input is a computed expression (a Sum, an Append)
  is only inlined when it is read once: with more readers it is where that
  expression is computed once (TDNN-F's NoOp bypasses), and inlining would
  compute it again per reader. Except a test-mode dropout whose every reader is
  a component node reading only it, at offsets (Kaldi's CollapseModel rewires
  exactly those readers to the dropout's input expression, so the dropout goes:
  see :func:`_collapsed_by_kaldi`).
* Full-width dim-range nodes are their source.
* An identity-like node over an ``Append`` read only by dim-range nodes that each
  select one part (an LSTM's BackpropTruncation over ``Append(c, r)``, read as
  ``c_trunc`` and ``r_trunc``) is taken out: each dim-range node becomes its part.
  Only where the parts are computable at exactly the same indexes (see
  :func:`_computability_root`), since the Append was computable only where all of
  them are, and a consumer's IfDefined / Failover sees that.
* Orphan nodes and components (Kaldi's RemoveOrphanNodes / Components).
"""

from __future__ import annotations

from ..components.base import Flags
from ..components.dropout import RandomComponent
from ..descriptor import Descriptor, NodeRef
from ..rewrite.algebra import is_forwarding, scaled, shifted_reads
from ..rewrite.rewriter import NetworkRewriter, RewriteRefused
from .linear import identity_scale


def prune(rewriter: NetworkRewriter, keep_derivatives: bool = False) -> list[str]:
    """Run the pruning pass; returns notes of what was removed (and why not, for
    identity nodes that had to stay)."""
    notes: list[str] = []
    nnet = rewriter.nnet
    for name in [n.name for n in nnet.nodes]:
        if not nnet.has_node(name) or rewriter.is_protected(name):
            continue
        node = nnet.node(name)  # (current: earlier inlines may have rewired it)
        if node.kind == "component-node":
            comp = nnet.components[node.component]
            c = identity_scale(comp, keep_derivatives)
            if c is None:
                continue
            desc = node.descriptor
            forwarding = len(desc.parts) == 1 and is_forwarding(desc.parts[0])
            if not forwarding and len(rewriter.graph[name].consumers) > 1 \
                    and not _collapsed_by_kaldi(rewriter, name, comp.type_name):
                continue
            try:
                rewriter.inline(name, scaled(desc, c),
                                f"{comp.type_name} is the identity" if c == 1.0
                                else f"{comp.type_name} is Scale({c:g})")
                notes.append(f"{name} ({comp.type_name})")
                if isinstance(comp, RandomComponent) and getattr(comp, "test_mode", False):
                    # (the network can no longer run it in training mode: Nnet's
                    # set_test_mode(False) says so, from this record)
                    record = (*getattr(nnet, "pruned_test_mode", ()),
                              ("DropoutComponent", comp.type_name, name))
                    object.__setattr__(nnet, "pruned_test_mode", record)
            except RewriteRefused as e:
                notes.append(f"kept {name}: {e}")
        elif node.kind == "dim-range-node":
            if node.dim_offset == 0 and node.dim == nnet.node_dim(node.source):
                try:
                    rewriter.inline(name, note="full-width dim range")
                    notes.append(f"{name} (full-width dim-range)")
                except RewriteRefused as e:
                    notes.append(f"kept {name}: {e}")
    _split_appends(rewriter, keep_derivatives, notes)
    if rewriter.remove_orphans():
        notes.append("orphans")
    return notes


KALDI_DROPOUT_TYPES = ("DropoutComponent", "GeneralDropoutComponent")


def _collapsed_by_kaldi(rewriter: NetworkRewriter, name: str, type_name: str) -> bool:
    """Whether Kaldi's CollapseModel (collapse-dropout) removes dropout node ``name``
    however its input is computed: it is a Dropout / GeneralDropout (test mode, so
    identity-like here) and every consumer is a component node whose input is only
    this node at offsets (Kaldi's DescriptorIsCollapsible), each of which Kaldi
    makes read the dropout's input expression instead. An output node or any
    other kind of read keeps the dropout in Kaldi's model too."""
    if type_name not in KALDI_DROPOUT_TYPES:
        return False
    graph = rewriter.graph
    for consumer in graph[name].consumer_names:
        node = graph[consumer].node
        if node.kind != "component-node":
            return False
        found = shifted_reads(node.descriptor)
        if found is None or found[0] != name:
            return False
    return True


def _split_appends(rewriter: NetworkRewriter, keep_derivatives: bool,
                   notes: list[str]) -> None:
    """Identity nodes over an Append whose every consumer is a dim-range node that
    selects exactly one part: those dim-range nodes read their parts instead (the
    identity node is then an orphan). See the module docstring for when."""
    nnet = rewriter.nnet
    for name in [n.name for n in nnet.nodes]:
        if not nnet.has_node(name) or rewriter.is_protected(name):
            continue
        node = nnet.node(name)
        if node.kind != "component-node" or len(node.descriptor.parts) < 2:
            continue
        c = identity_scale(nnet.components[node.component], keep_derivatives)
        parts = node.descriptor.parts
        if c is None or not all(isinstance(p, NodeRef) for p in parts):
            continue
        if len({_computability_root(nnet, p.node) for p in parts}) != 1:
            continue
        spans, start = {}, 0
        for p in parts:
            dim = nnet.node_dim(p.node)
            spans[(start, dim)] = p
            start += dim
        consumers = rewriter.graph[name].consumer_names
        plan = []
        for d in consumers:
            dn = nnet.node(d)
            part = spans.get((dn.dim_offset, dn.dim)) if dn.kind == "dim-range-node" \
                else None
            if part is None or rewriter.is_protected(d):
                break
            plan.append((d, part))
        if not plan or len(plan) != len(consumers):
            continue
        for d, part in plan:
            try:
                rewriter.inline(d, scaled(Descriptor((part,)), c),
                                f"selects {part.node} of {name}'s Append")
                notes.append(f"{d} (reads {part.node}; {name} is the identity)")
            except RewriteRefused as e:
                notes.append(f"kept {d}: {e}")


def _computability_root(nnet, name: str) -> str:
    """The node whose computability ``name``'s equals at every index: through
    dim-range nodes to their source, and through simple components (Kaldi's
    kSimpleComponent: output index i needs exactly input index i) reading one plain
    node. Two nodes with the same root are computable at the same indexes."""
    seen = set()
    while name not in seen:
        seen.add(name)
        node = nnet.node(name)
        if node.kind == "dim-range-node":
            name = node.source
            continue
        if node.kind != "component-node":
            break
        parts = node.descriptor.parts
        if not (len(parts) == 1 and isinstance(parts[0], NodeRef)
                and nnet.components[node.component].properties() & Flags.SIMPLE):
            break
        name = parts[0].node
    return name
