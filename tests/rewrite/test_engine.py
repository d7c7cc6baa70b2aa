"""Rules, registries and the driver: match strategies, fixed point and step limit,
declined matches, why_not, and refusals that change nothing."""

from __future__ import annotations

import warnings

import pytest

import pynnet3
from pynnet3.graphopt.linear import ELEMENTWISE_TYPES
from pynnet3.nnet import Node
from pynnet3.rewrite import (
    REGISTRIES,
    MatchStrategy,
    NetworkRewriter,
    Pattern,
    Replacement,
    RewriteLog,
    RewriteRefused,
    Rule,
    RuleRegistry,
    find_rule,
    rewrite_to_fixed_point,
    why_not,
)
from pynnet3.rewrite.engine import apply_replacement, choose, find_matches

# input -> r1 -> r2 -> r3 -> t -> output: three ReLUs in a row
CHAIN = """
input-node name=input dim=4
component name=r type=RectifiedLinearComponent dim=4
component-node name=r1 component=r input=input
component-node name=r2 component=r input=r1
component-node name=r3 component=r input=r2
component name=t type=TanhComponent dim=4
component-node name=t component=t input=r3
output-node name=output input=t
"""


def chain() -> pynnet3.Nnet:
    return pynnet3.Nnet.from_config(CHAIN.strip())


def drop_inner(match, ctx) -> Replacement:
    """relu(relu(x)) = relu(x): the root reads the inner node's input."""
    root = ctx.nnet.node(match.root)
    return Replacement([Node("component-node", match.root, component=root.component,
                             descriptor=match.inputs[1])], note="idempotent")


def decline(match, ctx) -> str:
    return "never"


PAIR = Rule("pair", Pattern("relu-relu", entries=("RectifiedLinearComponent",) * 2),
            drop_inner)
SINGLE = Rule("single", Pattern("relu", entries=("RectifiedLinearComponent",)), decline)
SINGLE_HIGH = Rule("single-high", Pattern("relu", entries=("RectifiedLinearComponent",)),
                   decline, priority=5)


def test_largest_match_wins_over_rule_order():
    rw = NetworkRewriter(chain())
    matches = find_matches(rw, [SINGLE, PAIR])
    # consumers first: r3 before r2 before r1, per rule
    assert [(r.name, m.nodes) for r, m in matches] == [
        ("single", ("r3",)), ("single", ("r2",)), ("single", ("r1",)),
        ("pair", ("r3", "r2")), ("pair", ("r2", "r1"))]
    order = {n: i for i, n in enumerate(rw.graph.reverse_topological())}
    largest = choose(matches, MatchStrategy.LARGEST_MATCH, order)
    assert [(r.name, m.nodes) for r, m in largest] == [("pair", ("r3", "r2")),
                                                      ("single", ("r1",))]
    first = choose(matches, MatchStrategy.FIRST_MATCH, order)
    assert [(r.name, m.nodes) for r, m in first] == [
        ("single", ("r3",)), ("single", ("r2",)), ("single", ("r1",))]


def test_priority_breaks_ties_between_equal_sizes():
    rw = NetworkRewriter(chain())
    matches = find_matches(rw, [SINGLE, SINGLE_HIGH])
    order = {n: i for i, n in enumerate(rw.graph.reverse_topological())}
    picked = choose(matches, MatchStrategy.LARGEST_MATCH, order)
    assert [(r.name, m.root) for r, m in picked] == [
        ("single-high", "r3"), ("single-high", "r2"), ("single-high", "r1")]


def test_fixed_point():
    nnet = chain()
    rw = NetworkRewriter(nnet)
    log = rewrite_to_fixed_point(rw, [PAIR])
    # step 1: r3 absorbs r2 (r1 is then claimed... no: r2 is claimed, r1 is free but a
    # pair needs two); step 2: r3 absorbs r1; step 3 finds nothing
    assert [a.nodes for a in log.applied] == [("r3", "r2"), ("r3", "r1")]
    assert log.counts() == {"pair": 2} and log.steps == 2 and not log.hit_step_limit
    assert [n.name for n in nnet.nodes] == ["input", "r3", "t", "output"]
    assert str(nnet.node("r3").descriptor) == "input"
    assert rw.changes and all(c.op in ("replace-node", "remove-node") for c in rw.changes)


def test_declined_matches_are_logged_once():
    rw = NetworkRewriter(chain())
    before = rw.nnet.to_bytes()
    log = rewrite_to_fixed_point(rw, [SINGLE], max_steps=5)
    assert [(d.rule, d.nodes, d.declined) for d in log.declined] == [
        ("single", ("r3",), "never"), ("single", ("r2",), "never"),
        ("single", ("r1",), "never")]
    assert log.applied == [] and not log.hit_step_limit
    assert rw.nnet.to_bytes() == before and rw.changes == []


def test_a_step_that_only_declines_is_a_fixed_point():
    rw = NetworkRewriter(chain())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log = rewrite_to_fixed_point(rw, [SINGLE], max_steps=1)
    assert not log.hit_step_limit


def test_step_limit_warns():
    def renew(match, ctx):  # always a change: the root gets a fresh copy of its component
        from pynnet3.rewrite import NewComponent
        return Replacement([Node("component-node", match.root, component="fresh",
                                 descriptor=match.inputs[0])],
                           [NewComponent("fresh", match.components[0].copy())])

    rule = Rule("renew", Pattern("tanh", entries=("TanhComponent",)), renew)
    nnet = chain()
    rw = NetworkRewriter(nnet)
    with pytest.warns(RuntimeWarning, match="after 3 steps"):
        log = rewrite_to_fixed_point(rw, [rule], max_steps=3)
    assert log.hit_step_limit and log.steps == 3 and log.counts() == {"renew": 3}
    rw.validate()
    assert sorted(nnet.components) == ["fresh", "r"]  # older copies were orphans


def test_log_accumulates_across_runs():
    log = RewriteLog()
    rewrite_to_fixed_point(NetworkRewriter(chain()), [PAIR], log=log)
    rewrite_to_fixed_point(NetworkRewriter(chain()), [PAIR], log=log)
    assert log.counts() == {"pair": 4}
    assert rewrite_to_fixed_point(NetworkRewriter(chain()), []).steps == 0


def test_why_not():
    rw = NetworkRewriter(chain())
    assert why_not(rw, PAIR, "r3") == "matches"
    assert why_not(rw, PAIR, "r1") == (
        "relu-relu at r1: entry 1: 'input' is a input-node, not a component node")
    assert why_not(rw, SINGLE, "r2") == "single at r2: declined: never"
    assert why_not(rw, PAIR, "ghost") == "no node named 'ghost'"
    assert rw.changes == []  # asking changes nothing


def test_replacement_must_keep_the_root_name():
    def misnamed(match, ctx):
        return Replacement([Node("component-node", "elsewhere", component="t",
                                 descriptor=match.inputs[0])])

    rule = Rule("misnamed", Pattern("tanh", entries=("TanhComponent",)), misnamed)
    nnet = chain()
    before = nnet.to_bytes()
    rw = NetworkRewriter(nnet)
    with pytest.raises(RewriteRefused, match="must be named 't'"):
        rewrite_to_fixed_point(rw, [rule])
    assert nnet.to_bytes() == before and rw.changes == []
    match = find_matches(NetworkRewriter(chain()), [rule])[0][1]
    with pytest.raises(RewriteRefused):
        apply_replacement(rw, match, misnamed(match, None), "misnamed")


def test_registry():
    reg = RuleRegistry("mine")
    reg.register(SINGLE)
    reg.register(PAIR)
    assert reg.names() == ["single", "pair"] and len(reg) == 2
    assert "pair" in reg and reg["pair"] is PAIR and list(reg) == [SINGLE, PAIR]
    with pytest.raises(ValueError, match="already in the mine registry"):
        reg.register(PAIR)
    reg.register(Rule("pair", PAIR.pattern, decline), replace=True)
    assert reg["pair"].rewrite is decline and reg.names() == ["single", "pair"]
    reg.unregister("single")
    reg.unregister("not-there")
    assert reg.names() == ["pair"]


def test_built_in_registries():
    """The rules the optimizer is documented to have (more may be added)."""
    assert sorted(REGISTRIES) == ["fold", "fuse", "parameter", "shatter"]
    short = [t.removesuffix("Component").lower() for t in ELEMENTWISE_TYPES]
    want = {f"fold-{s}-into-{d}-linear" for s in short for d in ("next", "previous")}
    assert set(REGISTRIES["fold"].names()) >= want | {"merge-affine-into-affine"}
    assert "shatter-composite" in REGISTRIES["shatter"]
    assert "fuse-sibling-affines" in REGISTRIES["parameter"]
    assert find_rule("shatter-composite") is REGISTRIES["shatter"]["shatter-composite"]
    with pytest.raises(KeyError, match="no rule named"):
        find_rule("no-such-rule")


def _all_rules():
    from pynnet3.rewrite.rules import REGISTRIES

    return [r for reg in REGISTRIES.values() for r in reg]


def test_find_matches_is_every_match_of_every_rule_at_every_node():
    """find_matches skips roots of another type than a pattern's first entry: the
    same matches as trying each rule at each component node."""
    from pynnet3.rewrite.pattern import Match, match_pattern
    from tests.reference import REF, require_reference

    require_reference()
    rules = _all_rules()
    for net in ("tdnnf_chain", "tdnn_relu_bn", "tdnn_lstm"):
        nnet = pynnet3.read_nnet(REF / "realistic" / net / "model.txt")
        nnet.set_test_mode(True)
        rw = NetworkRewriter(nnet)
        g = rw.graph
        brute = []
        for rule in rules:
            for name in [n for n in g.reverse_topological() if g[n].kind == "component-node"]:
                m = match_pattern(g, name, rule.pattern, rw.preserve)
                if isinstance(m, Match):
                    brute.append((rule.name, m.nodes))
        found = [(r.name, m.nodes) for r, m in find_matches(rw, rules)]
        assert found == brute
        assert found  # (the realistic networks have something to rewrite)


def test_setting_lookup_is_component_config():
    from pynnet3.rewrite.pattern import _NO_SETTING, _setting, component_config
    from tests.reference import REF, require_reference

    require_reference()
    nnet = pynnet3.read_nnet(REF / "realistic" / "tdnnf_chain" / "model.txt")
    for comp in nnet.components.values():
        cfg = component_config(comp)
        for key in [*vars(comp), "type", "no_such_setting"]:
            got = _setting(comp, key)
            if key in cfg:
                assert got is cfg[key] or got == cfg[key]
            else:
                assert got is _NO_SETTING
