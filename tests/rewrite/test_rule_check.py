"""Rule.check: a further condition of a match. A failed check is a non-match (the
rule does not run and the log lists no decline; why_not gives the check's reason);
a rewrite that declines is a near miss the log keeps."""

from __future__ import annotations

from pynnet3.rewrite import NetworkRewriter, Pattern, Rule, rewrite_to_fixed_point, why_not
from tests.rewrite.test_engine import PAIR, chain, drop_inner


def _never(match, ctx):
    return f"{match.root} is not wanted"


def test_failed_check_is_a_silent_non_match():
    calls = []

    def rewrite(match, ctx):
        calls.append(match.root)
        return drop_inner(match, ctx)

    rule = Rule("checked", PAIR.pattern, rewrite, check=_never)
    rw = NetworkRewriter(chain())
    before = rw.nnet.to_bytes()
    log = rewrite_to_fixed_point(rw, [rule])
    assert calls == [] and log.applied == [] and log.declined == []
    assert rw.nnet.to_bytes() == before
    root = next(n.name for n in rw.nnet.nodes if n.kind == "component-node"
                and n.name != rw.nnet.nodes[1].name)
    text = why_not(rw, rule, root)
    assert text.endswith(f"{root} is not wanted") and "declined" not in text


def test_passing_check_lets_the_rule_run():
    rule = Rule("checked", PAIR.pattern, drop_inner, check=lambda m, ctx: None)
    rw = NetworkRewriter(chain())
    log = rewrite_to_fixed_point(rw, [rule])
    assert [a.rule for a in log.applied] and log.declined == []


def test_declines_are_still_logged():
    rule = Rule("declining", Pattern("relu", entries=("RectifiedLinearComponent",)),
                lambda m, ctx: "cost model says no", check=lambda m, ctx: None)
    log = rewrite_to_fixed_point(NetworkRewriter(chain()), [rule])
    assert log.declined and all(d.declined == "cost model says no" for d in log.declined)
