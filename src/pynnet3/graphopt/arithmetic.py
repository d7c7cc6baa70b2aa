"""Arithmetic simplification of descriptors and linear layers.

* Sum terms that read the same chain merge (``Sum(Scale(a, x), Scale(b, x))``
  is ``Scale(a+b, x)``); offsets and nested scales are merged by the canonical
  form every rewrite goes through.
* A descriptor ``Scale(c, ...)`` feeding a linear component moves into that
  component's weights (the column block it feeds), so no scaled copy is made;
  not for a component that other nodes use with other scales (that would split
  it in two).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..descriptor import Descriptor
from ..nnet import Node
from ..rewrite.algebra import chain_scale, is_forwarding, merge_sum_terms, reparse, unscale_part
from ..rewrite.rewriter import NetworkRewriter
from .linear import LINEAR_TYPES, has_bias, linear_params, with_linear_params


def simplify(rewriter: NetworkRewriter) -> list[str]:
    """Run the arithmetic pass; returns notes of what changed."""
    notes: list[str] = []
    nnet = rewriter.nnet
    for name in [n.name for n in nnet.nodes]:
        node = nnet.node(name)
        if node.descriptor is None:
            continue
        parts = tuple(merge_sum_terms(p) for p in node.descriptor.parts)
        if parts != node.descriptor.parts:
            desc = reparse(Descriptor(parts))
            rewriter.set_input(node.name, desc, "merged Sum terms")
            notes.append(f"{node.name}: merged Sum terms")
    for name in [n.name for n in nnet.nodes]:
        node = nnet.node(name)
        if node.kind == "component-node" and \
                nnet.components[node.component].type_name in LINEAR_TYPES:
            note = _fold_scales(rewriter, node)
            if note:
                notes.append(note)
    if rewriter.remove_orphans():
        notes.append("orphans")
    return notes


def _part_scales(desc: Descriptor) -> list[float]:
    """Per part, the scale of its forwarding chain (1 for a part that is not one)."""
    scales = []
    for p in desc.parts:
        c = chain_scale(p) if is_forwarding(p) else None
        scales.append(1.0 if c is None else c)
    return scales


def _same_for_every_user(rewriter: NetworkRewriter, node: Node) -> bool:
    """Whether every node using ``node``'s component reads its input with the same
    part scales and widths: only then do they all move to one scaled copy. Else the
    copy would be a component more (a shared layer split in two, which Kaldi's
    CollapseModel never does) to save a scale that the copy into the input matrix
    applies for free."""
    nnet = rewriter.nnet
    users = rewriter.graph.component_users().get(node.component, [])

    def key(n: Node) -> tuple:
        return tuple(_part_scales(n.descriptor)), tuple(n.descriptor.part_dims(nnet.node_dim))

    want = key(node)
    return all(key(nnet.node(u)) == want for u in users)


def _fold_scales(rewriter: NetworkRewriter, node: Node) -> str | None:
    nnet = rewriter.nnet
    comp = nnet.components[node.component]
    desc = node.descriptor
    scales = _part_scales(desc)
    if all(c == 1.0 for c in scales):
        return None
    if comp.type_name == "TdnnComponent" and len(desc.parts) != 1:
        return None
    if not _same_for_every_user(rewriter, node):
        return None
    w, b = linear_params(comp)
    w = w.copy()
    factor = np.ones(w.shape[1])  # (what each column of W is scaled by)
    if comp.type_name == "TdnnComponent":
        w *= scales[0]
        factor *= scales[0]
    else:
        dims = desc.part_dims(nnet.node_dim)
        starts = np.concatenate([[0], np.cumsum(dims)])
        for i, c in enumerate(scales):
            w[:, int(starts[i]):int(starts[i + 1])] *= c
            factor[int(starts[i]):int(starts[i + 1])] = c
    parts = tuple(unscale_part(p) if c != 1.0 else p
                  for p, c in zip(desc.parts, scales, strict=True))
    new = with_linear_params(comp, w, b if has_bias(comp) else None, scaled_by=factor)
    dims = tuple(desc.part_dims(nnet.node_dim))
    name = rewriter.add_component(f"{node.component}.scaled", new,
                                  key=("scaled", node.component, tuple(scales), dims))
    rewriter.replace_node(node.name, replace(node, component=name,
                                             descriptor=reparse(Descriptor(parts))),
                          "descriptor scales moved into the weights")
    return f"{node.name}: Scale() moved into {comp.type_name} weights"
