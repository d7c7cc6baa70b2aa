"""Constant folding rules (the ``fold`` registry): fixed per-element maps and
affine chains folded into the parameters of neighbouring linear components.

This covers Kaldi's CollapseModel with all four options (batchnorm, dropout,
affine, scale) and goes beyond it: any elementwise map (test-mode BatchNorm,
FixedScale, FixedBias, ScaleAndOffset, PerElementScale/Offset, test-mode Dropout)
folds into the *next* linear component (a TDNN layer too) when it reads the map
through plain offsets, scales and sums in any of its column blocks
(``fold-*-into-next-linear``; the map stays for other consumers, as Kaldi keeps a
BatchNorm read by a Sum), or into the *previous* one when it is that component's
only consumer and reads it once, at an offset or scaled or not
(``fold-*-into-previous-linear``; preferred when the map would stay for a
consumer that is not linear). Affine-after-affine merges, read at offsets with
any scales as Kaldi's collapsible form allows, whatever else reads the first
layer, only when the merged product costs no more multiply-adds per frame than
the two layers, or than the second one alone when the first stays for other
consumers (a TDNN-F bottleneck stays factored: ``merge-affine-into-affine``
declines and says why).

New components are named ``<a>.<b>`` after the two they replace, as Kaldi names
them; a merge used by several nodes is built once. A folded component keeps the
settings (learning rate, max-change, natural gradient, ...) of the linear layer
that survives, as Kaldi's CollapseModel keeps the affine component's; two affine
layers merged keep the second's (the consumer's: Kaldi's merge makes a default
AffineComponent instead). An orthonormal constraint follows the weights: see
:func:`~pynnet3.graphopt.linear.with_linear_params`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..nnet import Node
from ..rewrite.algebra import (
    SubstitutionError,
    part_is_linear_in,
    part_scale_sum,
    references,
    shifted_reads,
    substitute,
)
from ..rewrite.pattern import Match, Pattern, match_pattern
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
    ELEMENTWISE_TYPES,
    LINEAR_TYPES,
    elementwise,
    has_bias,
    linear_params,
    with_linear_params,
)
from .relu_fusion import absorbed_by_relu_fusion

_TEST_MODE_ONLY = {"BatchNormComponent": {"test_mode": True},
                   "DropoutComponent": {"test_mode": True}}


def _short(type_name: str) -> str:
    return type_name.removesuffix("Component").lower()


def _comp_name(ctx: RewriteContext, node: str) -> str:
    return ctx.nnet.node(node).component


def _mark_folded(comp, ew_comp, ew_name: str):
    """Record on ``comp`` a test-mode BatchNorm or Dropout folded into it (type and
    component name, in ``folded_test_mode``): the network no longer has it, and
    :meth:`~pynnet3.Nnet.set_test_mode` refuses to switch it back to training."""
    if ew_comp.type_name in _TEST_MODE_ONLY:
        comp.folded_test_mode = (*getattr(comp, "folded_test_mode", ()),
                                 (ew_comp.type_name, ew_name))
    return comp


def next_is_fixed_map(match: Match, ctx: RewriteContext) -> str | None:
    """The match holds when the inner node is a fixed elementwise map in its mode."""
    comp = match.components[1]
    if elementwise(comp, ctx.keep_derivatives) is None:
        return f"{match.nodes[1]!r} ({comp.type_name}) is not a fixed elementwise map in its mode"
    return None


def root_is_fixed_map(match: Match, ctx: RewriteContext) -> str | None:
    """The match holds when the root is a fixed elementwise map in its mode that
    reads the linear node once (a single part: plain, at an offset, scaled)."""
    comp = match.components[0]
    if elementwise(comp, ctx.keep_derivatives) is None:
        return f"{match.root!r} ({comp.type_name}) is not a fixed elementwise map in its mode"
    if len(match.inputs[0].parts) != 1:
        return f"{match.root!r} reads {match.nodes[1]!r} more than once"
    return None


def _removed_by_previous_fold(ctx: RewriteContext, node: str) -> str | None:
    """Why folding elementwise node ``node`` into one of its linear consumers gains
    nothing: it stays for a consumer that is not a linear layer (or it is
    preserved), and ``fold-*-into-previous-linear`` removes it instead (Kaldi's
    collapse-scale folds a FixedScale into the affine layer before it; folding it
    into a consumer first would give that layer a second consumer and keep the
    map); else None."""
    graph = ctx.graph
    comp = graph.component(node)
    others = [c for c in graph[node].consumer_names
              if graph[c].kind != "component-node"
              or graph.component(c).type_name not in LINEAR_TYPES]
    if not others and node not in ctx.preserve:
        return None
    name = f"fold-{_short(comp.type_name)}-into-previous-linear"
    if ctx.enabled_rules is not None and name not in ctx.enabled_rules:
        return None
    rule = REGISTRIES["fold"][name]
    m = match_pattern(graph, node, rule.pattern, ctx.preserve)
    if not isinstance(m, Match) or rule.check(m, ctx) is not None \
            or isinstance(rule.rewrite(m, ctx), str):
        return None
    stays = others[0] if others else "preserve"
    return f"{node!r} stays for {stays!r}: {name} removes it instead"


def _column_map(ctx: RewriteContext, desc, links, s: np.ndarray,
                o: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple]:
    """Per column of ``desc``: the scale and offset that the map ``y = x*s + o``
    puts on it, for the parts that read the map through ``links`` (a part that
    sums the map's reads with scales ``c_i`` gets ``s`` and ``(sum c_i) o``; other
    columns get 1 and 0), and the layout (parts, scale sums, part dims) that says
    which fold this is. A TDNN layer applies the same map to each of its time
    offsets' column blocks: Kaldi's GetDiagonallyPreModifiedComponentIndex repeats
    it over the whole input, whatever the descriptor's offsets."""
    dims = desc.part_dims(ctx.nnet.node_dim)
    starts = np.concatenate([[0], np.cumsum(dims)])
    col_scale, col_offset = np.ones(int(starts[-1])), np.zeros(int(starts[-1]))
    parts = sorted({r.part for r in links})
    sums = []
    for p in parts:
        cols = slice(int(starts[p]), int(starts[p + 1]))
        c = part_scale_sum(desc.parts[p])
        sums.append(c)
        col_scale[cols] = s
        col_offset[cols] = c * o
    return col_scale, col_offset, (tuple(parts), tuple(sums), tuple(dims))


def _components_added(ctx: RewriteContext, root: str, inner: str,
                      layout_of: Callable[[Node, str], object | None],
                      folds: Callable[[Node, str], bool]) -> int:
    """How many components rewriting ``root`` (reading ``inner``) adds in the end,
    when every node that uses ``root``'s component and reads a node of ``inner``'s
    component is rewritten alike: one copy per layout of those reads
    (``layout_of(user, node)``, None when it cannot take it: that user keeps the
    old component), less the old component when no node keeps it, less
    ``inner``'s component when every consumer of every node using it takes it
    (``folds(consumer, node)``) and none of those nodes is preserved. A positive
    count is a shared layer split in two for good: a component more than Kaldi's
    collapsed model, which makes such a copy only in its own patterns (and then
    has it too)."""
    nnet = ctx.nnet
    graph = ctx.graph
    users = graph.component_users()
    inner_users = users.get(nnet.node(inner).component, [])
    layouts = set()
    for u in users.get(nnet.node(root).component, []):
        found = [layout_of(nnet.node(u), x) for x in graph[u].source_names if x in inner_users]
        layouts.add(next((f for f in found if f is not None), None))
    added = len(layouts - {None}) - (0 if None in layouts else 1)
    if all(x not in ctx.preserve and all(folds(nnet.node(c), x)
                                         for c in graph[x].consumer_names)
           for x in inner_users):
        added -= 1
    return added


def _reads_linearly(user: Node, node: str) -> list | None:
    """The references through which ``user`` reads ``node`` when every part holding
    one is linear in it (sums of forwarding chains); None when it does not read it
    so (or at all)."""
    if user.kind != "component-node":
        return None
    links = [r for r in references(user.descriptor) if r.node == node]
    if not links or not all(part_is_linear_in(user.descriptor.parts[r.part], node)
                            for r in links):
        return None
    return links


def fold_into_next_linear(match: Match, ctx: RewriteContext) -> Replacement | str:
    """Root: a linear component reading an elementwise map ``y = x*s + o`` in some
    column blocks; the blocks' weights absorb ``s`` and the bias absorbs ``W o``."""
    root, inner = match.nodes
    lin, ew_comp = match.components
    ew = elementwise(ew_comp, ctx.keep_derivatives)
    if ew is None:
        return f"{inner!r} ({ew_comp.type_name}) is not a fixed elementwise map in its mode"
    absorbed = absorbed_by_relu_fusion(ctx, inner) or _removed_by_previous_fold(ctx, inner)
    if absorbed is not None:
        return absorbed
    s, o = ew
    desc = match.inputs[0]
    col_scale, col_offset, layout = _column_map(ctx, desc, match.links[0], s, o)

    def layout_of(user: Node, node: str) -> object | None:
        links = _reads_linearly(user, node)
        return None if links is None else _column_map(ctx, user.descriptor, links, s, o)[2]

    def folds_inner(user: Node, node: str) -> bool:
        return (_reads_linearly(user, node) is not None
                and ctx.nnet.components[user.component].type_name in LINEAR_TYPES)

    if _components_added(ctx, root, inner, layout_of, folds_inner) > 0:
        return (f"{root!r}'s component stays for another node and so does {inner!r}'s: "
                "a copy for this node would be a component more")
    w, b = linear_params(lin)
    if lin.type_name == "TdnnComponent":  # (one column block per time offset)
        col_scale = np.tile(col_scale, len(lin.time_offsets))
        col_offset = np.tile(col_offset, len(lin.time_offsets))
    b = b + w @ col_offset
    w = w * col_scale
    try:
        new_desc = substitute(desc, inner, match.inputs[1])
    except SubstitutionError as e:
        return f"cannot read {inner!r}'s input instead: {e}"
    bias = b if (has_bias(lin) or b.any()) else None
    lin_name, ew_name = _comp_name(ctx, root), _comp_name(ctx, inner)
    new_name = f"{ew_name}.{lin_name}"
    comp = _mark_folded(with_linear_params(lin, w, bias, scaled_by=col_scale), ew_comp,
                        ew_name)
    return Replacement(
        [Node("component-node", root, component=new_name, descriptor=new_desc)],
        [NewComponent(new_name, comp, key=("next", ew_name, lin_name, layout))],
        note=f"{ew_comp.type_name} {inner} folded into {lin.type_name}")


def fold_into_previous_linear(match: Match, ctx: RewriteContext) -> Replacement | str:
    """Root: an elementwise map reading a linear component that nothing else
    reads; its rows absorb ``s`` and its bias becomes ``s*b + o``.

    The map may read the linear node at an offset and with a scale ``a``
    (``Scale(a, Offset(lin, t))``, Kaldi's collapse-scale accepts any collapsible
    read): the new node reads the linear node's input through the same offset and
    scale, and the bias becomes ``s*a*b + o`` (the scale applied to the input
    scales only the weights' share)."""
    root, inner = match.nodes
    ew_comp, lin = match.components
    ew = elementwise(ew_comp, ctx.keep_derivatives)
    if ew is None:
        return f"{root!r} ({ew_comp.type_name}) is not a fixed elementwise map in its mode"
    found = shifted_reads(match.inputs[0])
    if found is None or len(found[1]) != 1:
        return f"{root!r} does not read {inner!r} once at an offset"
    t, x, a = found[1][0]
    if (t, x, a) == (0, 0, 1.0):
        new_desc = match.inputs[1]
    else:
        try:
            new_desc = substitute(match.inputs[0], inner, match.inputs[1])
        except SubstitutionError as e:
            return f"cannot read {inner!r}'s input instead: {e}"
    s, o = ew
    w, b = linear_params(lin)
    w = w * s[:, None]
    b = b * (s * a) + o
    bias = b if (has_bias(lin) or b.any()) else None
    lin_name, ew_name = _comp_name(ctx, inner), _comp_name(ctx, root)
    new_name = f"{lin_name}.{ew_name}"
    comp = _mark_folded(with_linear_params(lin, w, bias, scaled_by=s), ew_comp, ew_name)
    return Replacement(
        [Node("component-node", root, component=new_name, descriptor=new_desc)],
        [NewComponent(new_name, comp, key=("prev", lin_name, ew_name, a))],
        note=f"{ew_comp.type_name} {root} folded into {lin.type_name} {inner}")


def _stays_for_others(ctx: RewriteContext, inner: str, root: str) -> bool:
    """Whether node ``inner`` is still needed once ``root`` no longer reads it: it
    has another consumer (an output node too) or is preserved."""
    graph = ctx.graph
    return inner in ctx.preserve or any(c != root for c in graph[inner].consumer_names)


def merge_affine_into_affine(match: Match, ctx: RewriteContext) -> Replacement | str:
    """Root: an affine map reading another affine map (plain or at several time
    offsets, Kaldi's block-diagonal case, with any ``Scale``): one affine map of
    the first one's input, when that costs no more multiply-adds per output frame.

    When the first layer stays for another consumer, its cost is spent anyway: the
    merge must cost no more than the second layer alone, i.e. the first layer must
    not reduce the dimension (Kaldi's own condition, which merges whatever else
    reads the first layer). A read ``Scale(a, Offset(x, t))`` scales that block's
    share of the first layer's bias too (Kaldi's merge forgets that)."""
    root, inner = match.nodes
    l2, l1 = match.components
    found = shifted_reads(match.inputs[0])
    if found is None:
        return f"{root!r} does not read {inner!r} only at offsets"
    scales = [shift[2] for shift in found[1]]
    k = len(scales)
    in1, out1, out2 = l1.input_dim, l1.output_dim, l2.output_dim
    after = k * in1 * out2
    if _stays_for_others(ctx, inner, root):
        before = k * out1 * out2
        if after > before:
            return (f"{inner!r} stays for its other consumers and reduces the dimension "
                    f"({in1}->{out1}): merged, {root!r} would cost {after} multiply-adds "
                    f"per frame > {before}")
    else:
        before = in1 * out1 + k * out1 * out2
        if after > before:
            return (f"merged cost {after} multiply-adds per frame > {before} for the two "
                    f"layers ({in1}->{out1}, then {k}x{out1}->{out2}): the factored form "
                    "is cheaper")

    def layout_of(user: Node, node: str) -> object | None:
        found = shifted_reads(user.descriptor) if user.kind == "component-node" else None
        return None if found is None or found[0] != node else tuple(x[2] for x in found[1])

    def folds_inner(user: Node, node: str) -> bool:
        return (layout_of(user, node) is not None
                and ctx.nnet.components[user.component].type_name in AFFINE_TYPES)

    if _components_added(ctx, root, inner, layout_of, folds_inner) > 0:
        return (f"{root!r}'s component stays for another node and so does {inner!r}'s: "
                "a merged copy for this node would be a component more")
    w2, b2 = linear_params(l2)
    w1, b1 = linear_params(l1)
    blocks = [w2[:, j * out1:(j + 1) * out1] for j in range(k)]
    w = np.hstack([blk @ w1 for blk in blocks])
    b = b2 + sum(a * (blk @ b1) for a, blk in zip(scales, blocks, strict=True))
    try:
        new_desc = substitute(match.inputs[0], inner, match.inputs[1])
    except SubstitutionError as e:
        return f"cannot read {inner!r}'s input instead: {e}"
    bias = b if (has_bias(l1) or has_bias(l2) or b.any()) else None
    n1, n2 = _comp_name(ctx, inner), _comp_name(ctx, root)
    new_name = f"{n1}.{n2}"
    comp = with_linear_params(l2, w, bias, scaled_by=None)
    folded = (*getattr(l1, "folded_test_mode", ()), *getattr(l2, "folded_test_mode", ()))
    if folded:
        comp.folded_test_mode = folded
    return Replacement(
        [Node("component-node", root, component=new_name, descriptor=new_desc)],
        [NewComponent(new_name, comp, key=("affine", n1, n2, tuple(scales)))],
        note=f"{l1.type_name} {inner} merged into {l2.type_name} ({after} <= {before} "
             "multiply-adds per frame)")


MERGE_PATTERN = Pattern("affine->affine", entries=(AFFINE_TYPES, AFFINE_TYPES),
                        edges=("shifted",), shared_inner=True)


def _register() -> None:
    for t in ELEMENTWISE_TYPES:
        cfg = _TEST_MODE_ONLY.get(t, {})
        register_rule("fold", Rule(
            f"fold-{_short(t)}-into-next-linear",
            Pattern(f"{_short(t)}->linear", entries=(LINEAR_TYPES, t),
                    config_patterns=({}, cfg), edges=("columns",), shared_inner=True),
            fold_into_next_linear, priority=2, check=next_is_fixed_map,
            description=f"{t} folded into the linear component that reads it"))
        register_rule("fold", Rule(
            f"fold-{_short(t)}-into-previous-linear",
            Pattern(f"linear->{_short(t)}", entries=(t, LINEAR_TYPES),
                    config_patterns=(cfg, {}), edges=("shifted",)),
            fold_into_previous_linear, priority=1, check=root_is_fixed_map,
            description=f"{t} folded into the linear component it reads"))
    register_rule("fold", Rule(
        "merge-affine-into-affine", MERGE_PATTERN, merge_affine_into_affine, priority=0,
        description="two affine layers as one, when not more expensive (Kaldi's "
                    "collapse-affine, with a cost model)"))


_register()
