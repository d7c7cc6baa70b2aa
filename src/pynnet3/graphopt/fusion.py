"""Fusion rules: the ``parameter`` registry (components that read the same input
computed as one) and the ``fuse`` registry.

``fuse-sibling-affines``: affine components whose nodes read the identical
descriptor become one affine component over their stacked weights (one GEMM
that reads the input once); each original node becomes a dim-range node of the
fused one under its own name, so consumers need no rewiring. Only siblings that
lead to the same output nodes fuse: a decode request that asks for one output
must not start computing a head it did not need (TDNN-F's chain and xent heads
stay apart).
"""

from __future__ import annotations

import numpy as np

from ..components.tdnn import TdnnComponent
from ..descriptor import Descriptor, NodeRef
from ..nnet import Node
from ..rewrite.algebra import offsets_of_single_node
from ..rewrite.pattern import Match, Pattern, match_pattern
from ..rewrite.rules import NewComponent, Replacement, RewriteContext, Rule, register_rule
from .folding import MERGE_PATTERN, merge_affine_into_affine
from .linear import AFFINE_TYPES, has_bias, linear_params, with_linear_params


def _outputs_reached(nnet, name: str) -> frozenset[str]:
    consumers: dict[str, list[str]] = {}
    for n in nnet.nodes:
        for src in n.inputs():
            consumers.setdefault(src, []).append(n.name)
    seen, stack, outs = set(), [name], set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if nnet.node(x).kind == "output-node":
            outs.add(x)
        stack.extend(consumers.get(x, ()))
    return frozenset(outs)


def _siblings(match: Match, ctx: RewriteContext) -> list:
    text = str(match.inputs[0])
    return [n for n in ctx.nnet.nodes if n.kind == "component-node"
            and str(n.descriptor) == text
            and ctx.nnet.components[n.component].type_name in AFFINE_TYPES]


def has_siblings(match: Match, ctx: RewriteContext) -> str | None:
    """The match holds when another affine node reads the same input and the root
    is the first of them (the group is fused from there)."""
    group = _siblings(match, ctx)
    if len(group) < 2:
        return "no other affine node reads the same input"
    if group[0].name != match.root:
        return f"fused from its first sibling {group[0].name!r}"
    return None


def fuse_sibling_affines(match: Match, ctx: RewriteContext) -> Replacement | str:
    root = match.root
    nnet = ctx.nnet
    reason = has_siblings(match, ctx)
    if reason is not None:
        return reason
    group = _siblings(match, ctx)
    reach = _outputs_reached(nnet, root)
    group = [n for n in group if _outputs_reached(nnet, n.name) == reach]
    if len(group) < 2:
        return "its siblings lead to other outputs (a request may want only some)"
    comps = [nnet.components[n.component] for n in group]
    params = [linear_params(c) for c in comps]
    w = np.vstack([p[0] for p in params])
    b = np.concatenate([p[1] for p in params])
    bias = b if any(has_bias(c) for c in comps) else None
    fused_name = ".".join(n.name for n in group)
    taken = {n.name for n in nnet.nodes}
    base, k = fused_name, 1
    while fused_name in taken:
        k += 1
        fused_name = f"{base}.{k}"
    comp_name = ".".join(n.component for n in group)
    fused = Node("component-node", fused_name, component=comp_name, descriptor=match.inputs[0])
    ranges, offset = [], 0
    for n, c in zip(group, comps, strict=True):
        ranges.append(Node("dim-range-node", n.name, source=fused_name, dim_offset=offset,
                           dim=c.output_dim))
        offset += c.output_dim
    return Replacement([fused, ranges[0]],
                       [NewComponent(comp_name, with_linear_params(comps[0], w, bias))],
                       replaces=ranges[1:], note=f"{len(group)} affines as one GEMM")


def is_spliced(match: Match, ctx: RewriteContext) -> str | None:
    """The match holds when the input is one node at several distinct time offsets."""
    found = offsets_of_single_node(match.inputs[0])
    if found is None:
        return f"its input {match.inputs[0]} is not one node at time offsets"
    offsets = found[1]
    if len(offsets) < 2:
        return "it reads a single frame: nothing is spliced"
    if len(set(offsets)) != len(offsets):
        return f"time offsets {offsets} repeat"
    return None


def fuse_spliced_affine(match: Match, ctx: RewriteContext) -> Replacement | str:
    """An affine layer reading one node at several time offsets becomes a TDNN layer
    over that node: the TDNN reads the offsets itself, so no spliced input is
    assembled (no copies), and a forward-only run accumulates one product per
    offset."""
    root = match.root
    comp = match.components[0]
    reason = is_spliced(match, ctx)
    if reason is not None:
        return reason
    node, offsets = offsets_of_single_node(match.inputs[0])
    split = _splits_a_shared_layer(ctx, root, offsets)
    if split:
        return split
    pending = _merge_pending(ctx, root)
    if pending:
        return f"merge-affine-into-affine applies first ({pending})"
    w, b = linear_params(comp)
    d = w.shape[1] // len(offsets)
    order = sorted(range(len(offsets)), key=lambda k: offsets[k])
    cols = np.concatenate([np.arange(k * d, (k + 1) * d) for k in order])
    tdnn = TdnnComponent()
    tdnn.time_offsets = [offsets[k] for k in order]
    tdnn.linear_params = np.ascontiguousarray(w[:, cols], dtype=np.float32)
    tdnn.bias_params = (b.astype(np.float32) if has_bias(comp)
                        else np.zeros(0, np.float32))
    for attr in ("learning_rate", "learning_rate_factor", "max_change", "l2_regularize"):
        setattr(tdnn, attr, getattr(comp, attr))
    if comp.type_name == "FixedAffineComponent":  # (an LDA stays fixed: rate 0 for good)
        tdnn.learning_rate = tdnn.learning_rate_factor = 0.0
    tdnn.rank_in = min(20, (d * len(offsets) + 1) // 2)
    tdnn.rank_out = min(80, (w.shape[0] + 1) // 2)
    cname = ctx.nnet.node(root).component
    new_name = f"{cname}.tdnn"
    return Replacement(
        [Node("component-node", root, component=new_name,
              descriptor=Descriptor((NodeRef(node),)))],
        [NewComponent(new_name, tdnn, key=("tdnn", cname, tuple(offsets)))],
        note=f"offsets {tdnn.time_offsets} read by the layer itself")


def _splits_a_shared_layer(ctx: RewriteContext, root: str, offsets: list[int]) -> str:
    """Why converting ``root`` would add a component: its component is also used by
    a node that does not read one node at the same offsets (that node keeps the
    affine component beside the new TDNN one); "" when every user converts to the
    same TDNN component."""
    cname = ctx.nnet.node(root).component
    for n in ctx.nnet.nodes:
        if n.kind == "component-node" and n.component == cname and n.name != root:
            found = offsets_of_single_node(n.descriptor)
            if found is None or found[1] != offsets:
                return (f"its component {cname!r} is shared with {n.name!r}, which reads "
                        f"{n.descriptor}: a TDNN copy for {root!r} alone is a component more")
    return ""


def _merge_pending(ctx: RewriteContext, name: str) -> str:
    """A merge of ``name`` with the affine layer it reads or that reads it, which the
    fold registry would make (a TDNN is not an affine type, so converting ``name``
    first would keep that merge from happening); "" when there is none."""
    graph = ctx.graph
    for root in [name, *graph[name].consumer_names]:
        if graph[root].kind != "component-node":
            continue
        m = match_pattern(graph, root, MERGE_PATTERN, ctx.preserve)
        if isinstance(m, Match) and name in m.nodes and \
                not isinstance(merge_affine_into_affine(m, ctx), str):
            return f"{m.nodes[1]} into {m.nodes[0]}"
    return ""


register_rule("fuse", Rule(
    "fuse-spliced-affine-as-tdnn",
    Pattern("spliced-affine", entries=(("AffineComponent", "NaturalGradientAffineComponent",
                                        "FixedAffineComponent", "LinearComponent"),)),
    fuse_spliced_affine, check=is_spliced,
    description="an affine layer over one node at several time offsets as a TDNN layer "
                "(no spliced copy)"))

register_rule("parameter", Rule(
    "fuse-sibling-affines", Pattern("sibling-affines", entries=(AFFINE_TYPES,)),
    fuse_sibling_affines, check=has_siblings,
    description="affine layers reading the same input computed as one GEMM"))
