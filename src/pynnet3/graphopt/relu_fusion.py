"""Kernel fusion (``fuse`` registry): a linear layer, its ReLU and a positive
per-column map after it as one :class:`~pynnet3.components.fused.AffineReluComponent`.

``fuse-affine-relu-map``: ``map(ReLU(linear(x)))`` where the map is a fixed
elementwise ``y = x*s + o`` with every ``s > 0`` (test-mode BatchNorm, FixedScale,
ScaleAndOffset, ...) becomes ``max(x (sW)^T + (s b + o), o)``: the product is written
once and one pass does bias, ReLU and map, where the three components take at
least four passes over the output. ``fuse-affine-relu``: the same without a map.
Both need the inner nodes to have no other consumer, as every pattern does.

A map that a Sum or an output reads besides a linear layer stays whatever
constant folding does (TDNN-F's BatchNorm feeds its bypass), so folding it into
that linear layer saves nothing; :func:`absorbed_by_relu_fusion` tells the fold
rule to leave it to this fusion, which removes it.
"""

from __future__ import annotations

import numpy as np

from ..components.fused import UnfusedPart, fused_affine_relu
from ..nnet import Node
from ..rewrite.algebra import offsets_of_single_node
from ..rewrite.pattern import Match, Pattern, match_pattern
from ..rewrite.rules import NewComponent, Replacement, RewriteContext, Rule, register_rule
from .linear import (
    AFFINE_TYPES,
    ELEMENTWISE_TYPES,
    LINEAR_TYPES,
    elementwise,
    linear_params,
    with_linear_params,
)

RELU = "RectifiedLinearComponent"
MAP_RULE = "fuse-affine-relu-map"
MAP_PATTERN = Pattern("linear->relu->map", entries=(ELEMENTWISE_TYPES, RELU, LINEAR_TYPES))
RELU_PATTERN = Pattern("linear->relu", entries=(RELU, LINEAR_TYPES))


def positive_map(comp, keep_derivatives: bool) -> tuple[np.ndarray, np.ndarray] | str:
    """``(s, o)`` of a fixed elementwise map with every scale > 0, or why not."""
    ew = elementwise(comp, keep_derivatives)
    if ew is None:
        return f"{comp.type_name} is not a fixed elementwise map in its mode"
    s, o = ew
    if not (np.all(s > 0) and np.all(np.isfinite(s)) and np.all(np.isfinite(o))):
        return f"{comp.type_name} has scales <= 0 (ReLU commutes only with positive ones)"
    return s, o


def check_chain(match: Match, ctx: RewriteContext) -> str | None:
    """The match holds when the map (if any) is positive and the linear layer would
    not rather become a TDNN layer (``fuse-spliced-affine-as-tdnn`` goes first)."""
    if len(match.nodes) == 3:
        ew = positive_map(match.components[0], ctx.keep_derivatives)
        if isinstance(ew, str):
            return f"{match.root!r}: {ew}"
    lin_node, lin = match.nodes[-1], match.components[-1]
    if lin.type_name in AFFINE_TYPES:
        found = offsets_of_single_node(match.inputs[-1])
        if found is not None and len(found[1]) > 1 and len(set(found[1])) == len(found[1]):
            return f"{lin_node!r} reads spliced frames: fuse-spliced-affine-as-tdnn goes first"
    return None


def fuse_affine_relu(match: Match, ctx: RewriteContext) -> Replacement | str:
    reason = check_chain(match, ctx)
    if reason is not None:
        return reason
    lin = match.components[-1]
    w, b = linear_params(lin)
    if len(match.nodes) == 3:
        s, o = positive_map(match.components[0], ctx.keep_derivatives)
        w = w * s[:, None]
        b = b * s + o
    else:
        s, o = None, np.zeros(w.shape[0])
    names = [ctx.nnet.node(n).component for n in reversed(match.nodes)]
    parts = [UnfusedPart(node, cname, comp) for node, cname, comp in
             zip(reversed(match.nodes), names, reversed(match.components), strict=True)]
    new_name = ".".join(names)
    comp = fused_affine_relu(with_linear_params(lin, w, b), o.astype(np.float32), parts,
                             s)
    return Replacement(
        [Node("component-node", match.root, component=new_name, descriptor=match.inputs[-1])],
        [NewComponent(new_name, comp, key=("affine-relu", *names))],
        note=" + ".join(c.type_name for c in reversed(match.components)) + " as one kernel")


def absorbed_by_relu_fusion(ctx: RewriteContext, node: str) -> str | None:
    """Why folding elementwise node ``node`` into one of its linear consumers gains
    nothing: it stays for a consumer that is not a linear layer (or an output, or
    it is preserved), and ``fuse-affine-relu-map`` (when this optimization runs it)
    can absorb it; else None."""
    if ctx.enabled_rules is not None and MAP_RULE not in ctx.enabled_rules:
        return None
    graph = ctx.graph
    others = [c for c in graph[node].consumer_names
              if graph[c].kind != "component-node"
              or ctx.nnet.components[graph[c].node.component].type_name not in LINEAR_TYPES]
    if not others and node not in ctx.preserve:
        return None
    m = match_pattern(graph, node, MAP_PATTERN, ctx.preserve)
    if not isinstance(m, Match) or check_chain(m, ctx) is not None:
        return None
    stays = others[0] if others else "preserve"
    return (f"{node!r} stays for {stays!r}: fuse-affine-relu-map removes it instead")


register_rule("fuse", Rule(
    MAP_RULE, MAP_PATTERN, fuse_affine_relu, check=check_chain,
    description="a linear layer, its ReLU and a positive elementwise map (test-mode "
                "BatchNorm, ...) as one kernel writing its output once"))
register_rule("fuse", Rule(
    "fuse-affine-relu", RELU_PATTERN, fuse_affine_relu, check=check_chain,
    description="a linear layer and its ReLU as one kernel writing its output once"))
