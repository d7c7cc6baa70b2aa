"""Shatter rules (the ``shatter`` registry): one node split into several so that
other rules can see its parts.

``shatter-composite``: a CompositeComponent node becomes a chain of nodes, one
per sub-component (the last keeps the node's name), so a BatchNorm or a
FixedScale inside it can fold into a neighbouring affine. It declines unless a
part could then go away: an identity part, or an elementwise part next to a
linear layer (shattering alone only adds nodes).
"""

from __future__ import annotations

from ..descriptor import Descriptor, NodeRef
from ..nnet import Node
from ..rewrite.pattern import Match, Pattern
from ..rewrite.rules import NewComponent, Replacement, RewriteContext, Rule, register_rule
from .linear import LINEAR_TYPES, elementwise, identity_scale


def shatter_composite(match: Match, ctx: RewriteContext) -> Replacement | str:
    root = match.root
    comp = match.components[0]
    subs = comp.sub_components()
    if len(subs) < 2:
        return "a composite of one component gains nothing from shattering"
    if not _could_fold(match, subs, ctx):
        return ("no part is an identity, or an elementwise map next to a linear layer "
                "that could absorb it")
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
    """Whether shattering lets something fold away: an identity part, or an
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


register_rule("shatter", Rule(
    "shatter-composite", Pattern("composite", entries=("CompositeComponent",)),
    shatter_composite, description="a CompositeComponent as a chain of its parts"))
