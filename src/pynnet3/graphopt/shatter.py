"""Shatter rules (the ``shatter`` registry): one node split into several so that
other rules can see its parts.

``split-recurrent-affine``: an affine layer inside a recurrence whose input
appends non-recurrent parts (the layer below) and recurrent ones (the previous
step's output) becomes two layers whose sum feeds the consumers: the
non-recurrent product is then one GEMM over all frames, and only the small
recurrent one runs step by step (LSTM ``W_all``: 160 -> 512 per step becomes 32
-> 512 per step plus one 128 -> 512 product for the whole sequence). Off by
default: at decode shapes the per-step Sum costs about what the smaller product
saves (tdnn_lstm N=32: 100.8 vs 99.3 ms, 1567 -> 1708 commands); turn it on with
``NetworkOptions(enable_rules=("split-recurrent-affine",))``. At one or a few
sequences per request it pays (a step's product is then a matrix-vector product bound
by reading the weights: tdnn_lstm N=1 35% and N=8 18% faster), and ``pynnet3 compute``
turns it on for up to 8 chunks per request.

``shatter-composite``: a CompositeComponent node becomes a chain of nodes, one
per sub-component (the last keeps the node's name), so a BatchNorm or a
FixedScale inside it can fold into a neighbouring affine. It declines unless
pruning and folding, tried on a copy, then leave no more component nodes than
before (shattering alone only adds nodes; a component shared by several nodes
may need a copy per node until all of them are shattered).
"""

from __future__ import annotations

import warnings

import numpy as np

from ..components.affine import FixedAffineComponent, LinearComponent
from ..components.simple_misc import NoOpComponent
from ..descriptor import Descriptor, NodeRef, SumOf
from ..nnet import Node
from ..rewrite.engine import apply_replacement, rewrite_to_fixed_point
from ..rewrite.pattern import Match, Pattern
from ..rewrite.rewriter import NetworkRewriter
from ..rewrite.rules import (
    REGISTRIES,
    NewComponent,
    Replacement,
    RewriteContext,
    Rule,
    register_rule,
)
from .linear import (
    AFFINE_TYPES,
    LINEAR_TYPES,
    elementwise,
    has_bias,
    identity_scale,
    linear_params,
    with_linear_params,
)
from .pruning import prune


def shatter_composite(match: Match, ctx: RewriteContext) -> Replacement | str:
    subs = match.components[0].sub_components()
    if len(subs) < 2:
        return "a composite of one component gains nothing from shattering"
    if not _could_fold(match, subs, ctx):
        return ("no part is an identity, or an elementwise map next to a linear layer "
                "that could absorb it")
    rep = _shattered(match, ctx)
    if isinstance(rep, str):
        return rep
    # Shattering pays only if folding then removes parts: try it on a copy.
    trial = NetworkRewriter(ctx.nnet.copy(), ctx.preserve)
    apply_replacement(trial, match, _shattered(match, ctx), "shatter-composite (trial)")
    prune(trial, ctx.keep_derivatives)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rewrite_to_fixed_point(trial, list(REGISTRIES["fold"]),
                               keep_derivatives=ctx.keep_derivatives)
    trial.remove_orphans()
    before, after = _component_nodes(ctx.nnet), _component_nodes(trial.nnet)
    if after > before:
        return (f"folding would not remove enough parts: {after} component nodes after, "
                f"{before} before")
    return rep


def _component_nodes(nnet) -> int:
    return sum(n.kind == "component-node" for n in nnet.nodes)


def _shattered(match: Match, ctx: RewriteContext) -> Replacement | str:
    root = match.root
    subs = match.components[0].sub_components()
    cname = ctx.nnet.node(root).component
    nodes, comps = [], []
    desc = match.inputs[0]
    taken = set(n.name for n in ctx.nnet.nodes)
    for i, sub in enumerate(subs):
        last = i == len(subs) - 1
        name = root if last else f"{root}.part{i}"
        if not last and name in taken:
            return f"node name {name!r} is taken"
        sub_name = f"{cname}.part{i}"
        comps.append(NewComponent(sub_name, sub.copy(), key=("shatter", cname, i)))
        nodes.append(Node("component-node", name, component=sub_name, descriptor=desc))
        desc = Descriptor((NodeRef(name),))
    return Replacement(nodes, comps, note=f"{len(subs)} parts")


def _could_fold(match: Match, subs: list, ctx: RewriteContext) -> bool:
    """Whether shattering may let something fold away (a cheap first test): an identity part, or an
    elementwise part with a linear neighbour (a neighbouring part, the node the
    composite reads plainly, or a node that reads the composite)."""
    keep = ctx.keep_derivatives
    is_linear = [c.type_name in LINEAR_TYPES for c in subs]
    desc = match.inputs[0]
    producer_linear = False
    if len(desc.parts) == 1 and isinstance(desc.parts[0], NodeRef):
        p = ctx.nnet.node(desc.parts[0].node)
        producer_linear = (p.kind == "component-node" and
                           ctx.nnet.components[p.component].type_name in LINEAR_TYPES)
    consumer_linear = any(
        n.kind == "component-node" and match.root in n.inputs()
        and ctx.nnet.components[n.component].type_name in LINEAR_TYPES
        for n in ctx.nnet.nodes)
    for i, c in enumerate(subs):
        if identity_scale(c, keep) is not None:
            return True
        if elementwise(c, keep) is None:
            continue
        before = is_linear[i - 1] if i > 0 else producer_linear
        after = is_linear[i + 1] if i + 1 < len(subs) else consumer_linear
        if before or after:
            return True
    return False


def split_recurrent_affine(match: Match, ctx: RewriteContext) -> Replacement | str:
    root = match.root
    comp = match.components[0]
    graph = ctx.graph
    cycle = graph.scc_of(root)
    if len(cycle) == 1:
        return f"{root!r} is not in a recurrence"
    desc = match.inputs[0]
    recurrent = [bool(set(_nodes(p)) & cycle) for p in desc.parts]
    if all(recurrent) or not any(recurrent):
        return ("its input has no " + ("non-recurrent" if all(recurrent) else "recurrent")
                + " part to split off")
    w, b = linear_params(comp)
    dims = desc.part_dims(ctx.nnet.node_dim)
    cols = np.concatenate([[0], np.cumsum(dims)])
    pick = {flag: [i for i, r in enumerate(recurrent) if r == flag] for flag in (False, True)}
    take = {flag: np.concatenate([np.arange(cols[i], cols[i + 1]) for i in idx])
            for flag, idx in pick.items()}
    cname = ctx.nnet.node(root).component
    outer = with_linear_params(comp, w[:, take[False]], b if has_bias(comp) else None)
    inner = _bias_free(comp, w[:, take[True]])
    names = {flag: f"{root}.{'recurrent' if flag else 'nonrecurrent'}" for flag in (False, True)}
    taken = {n.name for n in ctx.nnet.nodes}
    if taken & set(names.values()):
        return f"node names {sorted(names.values())} are taken"
    nodes = [Node("component-node", names[False], component=f"{cname}.nonrecurrent",
                  descriptor=Descriptor(tuple(desc.parts[i] for i in pick[False]))),
             Node("component-node", names[True], component=f"{cname}.recurrent",
                  descriptor=Descriptor(tuple(desc.parts[i] for i in pick[True]))),
             Node("component-node", root, component=f"{cname}.sum",
                  descriptor=Descriptor((SumOf(NodeRef(names[False]), NodeRef(names[True])),)))]
    layout = (tuple(recurrent), tuple(dims))  # equal halves only for equal layouts
    return Replacement(nodes, [
        NewComponent(f"{cname}.nonrecurrent", outer, key=("split", cname, False, layout)),
        NewComponent(f"{cname}.recurrent", inner, key=("split", cname, True, layout)),
        NewComponent(f"{cname}.sum", NoOpComponent(comp.output_dim),
                     key=("split", cname, comp.output_dim))],
        note=f"{len(pick[False])} non-recurrent and {len(pick[True])} recurrent parts")


def _nodes(part) -> list[str]:
    return Descriptor((part,)).node_names()


def _bias_free(comp, w: np.ndarray):
    """A bias-free linear map of ``comp``'s kind: Linear (FixedAffine stays fixed)."""
    if comp.type_name == "FixedAffineComponent":
        return FixedAffineComponent(w.astype(np.float32), np.zeros(w.shape[0], np.float32))
    out = LinearComponent(w.astype(np.float32))
    for attr in ("learning_rate", "learning_rate_factor", "max_change", "l2_regularize"):
        setattr(out, attr, getattr(comp, attr))
    return out


register_rule("shatter", Rule(
    "split-recurrent-affine", Pattern("recurrent-affine", entries=(AFFINE_TYPES,)),
    split_recurrent_affine, enabled_by_default=False,
    description="an affine layer in a recurrence split into its non-recurrent part (one "
                "GEMM over all frames) and its recurrent part (per step); off by default "
                "(tdnn_lstm: no faster at decode shapes, more commands)"))

register_rule("shatter", Rule(
    "shatter-composite", Pattern("composite", entries=("CompositeComponent",)),
    shatter_composite, description="a CompositeComponent as a chain of its parts"))
