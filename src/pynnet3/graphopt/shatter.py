"""Shatter rules (the ``shatter`` registry): one node split into several so that
other rules can see its parts.

``shatter-composite``: a CompositeComponent node becomes a chain of nodes, one
per sub-component (the last keeps the node's name), so a BatchNorm or a
FixedScale inside it can fold into a neighbouring affine. It declines when no
part could fold away (shattering alone only adds nodes).
"""

from __future__ import annotations

from ..descriptor import Descriptor, NodeRef
from ..nnet import Node
from ..rewrite.pattern import Match, Pattern
from ..rewrite.rules import NewComponent, Replacement, RewriteContext, Rule, register_rule
from .linear import elementwise, identity_scale


def shatter_composite(match: Match, ctx: RewriteContext) -> Replacement | str:
    root = match.root
    comp = match.components[0]
    subs = comp.sub_components()
    if len(subs) < 2:
        return "a composite of one component gains nothing from shattering"
    if not any(elementwise(c, ctx.keep_derivatives) is not None
               or identity_scale(c, ctx.keep_derivatives) is not None for c in subs):
        return "no part is an elementwise map or an identity that could fold away"
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


register_rule("shatter", Rule(
    "shatter-composite", Pattern("composite", entries=("CompositeComponent",)),
    shatter_composite, description="a CompositeComponent as a chain of its parts"))
