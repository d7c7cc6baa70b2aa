"""Pruning: nodes that compute nothing new, and nodes nothing needs.

* Identity-like component nodes (NoOp, test-mode dropout families, test-mode
  SpecAugment, BackpropTruncation when derivatives are not kept, elementwise
  maps that are a uniform scale) are replaced by ``Scale(c, their input)`` in
  every consumer. A node whose input is a computed expression (a Sum, an Append)
  is only inlined when it is read once: with more readers it is where that
  expression is computed once (TDNN-F's NoOp bypasses), and inlining would
  compute it again per reader.
* Full-width dim-range nodes are their source.
* Orphan nodes and components (Kaldi's RemoveOrphanNodes / Components).
"""

from __future__ import annotations

from ..components.dropout import RandomComponent
from ..rewrite.algebra import is_forwarding, scaled
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
            if not forwarding and len(rewriter.graph[name].consumers) > 1:
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
    if rewriter.remove_orphans():
        notes.append("orphans")
    return notes
