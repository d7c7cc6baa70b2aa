"""Applying rules: match everything, pick one match per node, rewrite, repeat.

One step matches every rule of a list at every component node, then the
strategy picks a set of matches no two of which share a node (LARGEST_MATCH:
more nodes first, then higher rule priority, then consumers before producers,
the reverse topological walk), and each picked match's rule builds its
replacement through the one :class:`NetworkRewriter`. Orphans are dropped
after each step. Steps repeat until a step applies nothing or ``max_steps`` is
reached (then a warning: the result is valid but maybe not a fixed point).
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass, field

from .pattern import Match, MatchFailure, match_pattern
from .rewriter import NetworkRewriter, RewriteRefused
from .rules import Replacement, RewriteContext, Rule


class MatchStrategy(enum.Enum):
    """How overlapping matches are resolved."""

    LARGEST_MATCH = "largest-match"
    FIRST_MATCH = "first-match"  # rule order, then consumers first


@dataclass
class Applied:
    """One rule application (or a declined match when ``declined`` is set)."""

    rule: str
    nodes: tuple[str, ...]
    note: str = ""
    declined: str = ""


@dataclass
class RewriteLog:
    """What a run of :func:`rewrite_to_fixed_point` did."""

    applied: list[Applied] = field(default_factory=list)
    declined: list[Applied] = field(default_factory=list)
    steps: int = 0
    hit_step_limit: bool = False

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.applied:
            out[a.rule] = out.get(a.rule, 0) + 1
        return out


def find_matches(rewriter: NetworkRewriter, rules: list[Rule]) -> list[tuple[Rule, Match]]:
    """Every (rule, match) in the current network, consumers first."""
    g = rewriter.graph
    order = [n for n in g.reverse_topological() if g[n].kind == "component-node"]
    types = [g.component(n).type_name for n in order]
    found = []
    for rule in rules:
        # (a root of another type fails the pattern's first test: not tried)
        roots = rule.pattern.entries[0]
        for name, type_name in zip(order, types, strict=True):
            if type_name not in roots:
                continue
            m = match_pattern(g, name, rule.pattern, rewriter.preserve)
            if isinstance(m, Match):
                found.append((rule, m))
    return found


def choose(matches: list[tuple[Rule, Match]], strategy: MatchStrategy,
           order: dict[str, int]) -> list[tuple[Rule, Match]]:
    """Non-overlapping matches by ``strategy`` (``order``: reverse-topological rank)."""
    if strategy is MatchStrategy.LARGEST_MATCH:
        ranked = sorted(matches, key=lambda rm: (-rm[1].size, -rm[0].priority,
                                                 order.get(rm[1].root, 0)))
    else:
        ranked = list(matches)
    claimed: set[str] = set()
    picked = []
    for rule, m in ranked:
        if claimed.isdisjoint(m.nodes):
            picked.append((rule, m))
            claimed.update(m.nodes)
    return picked


def apply_replacement(rewriter: NetworkRewriter, match: Match, rep: Replacement,
                      rule: str) -> None:
    """Put ``rep`` in place of the match's root through the rewriter."""
    root = match.root
    if not rep.nodes or rep.nodes[-1].name != root:
        raise RewriteRefused(f"rule {rule}: the replacement's last node must be named {root!r}")
    renamed: dict[str, str] = {}
    for nc in rep.components:
        renamed[nc.name] = rewriter.add_component(nc.name, nc.component, nc.key)
    for node in rep.nodes:
        if node.kind == "component-node" and node.component in renamed:
            node.component = renamed[node.component]
    for node in rep.nodes[:-1]:
        rewriter.insert_before(root, node, f"{rule}")
    rewriter.replace_node(root, rep.nodes[-1], f"{rule}: {rep.note}".rstrip(": "))
    for node in rep.replaces:
        rewriter.replace_node(node.name, node, f"{rule}")


def rewrite_to_fixed_point(rewriter: NetworkRewriter, rules: list[Rule], *,
                           max_steps: int = 20,
                           strategy: MatchStrategy = MatchStrategy.LARGEST_MATCH,
                           keep_derivatives: bool = False,
                           log: RewriteLog | None = None,
                           enabled_rules: frozenset[str] | None = None) -> RewriteLog:
    """Apply ``rules`` until nothing matches (or ``max_steps``); see module docstring.
    ``enabled_rules``: what :class:`RewriteContext` tells rules runs elsewhere."""
    log = log if log is not None else RewriteLog()
    rules = list(rules)
    if not rules:
        return log
    context = RewriteContext(rewriter.nnet, keep_derivatives, rewriter.preserve,
                             enabled_rules, rewriter)
    declined_seen: set[tuple[str, tuple[str, ...]]] = set()
    for _ in range(max_steps):
        matches = [(r, m) for r, m in find_matches(rewriter, rules)
                   if (r.name, m.nodes) not in declined_seen]
        if not matches:
            break
        g = rewriter.graph
        order = {n: i for i, n in enumerate(g.reverse_topological())}
        applied = 0
        for rule, m in choose(matches, strategy, order):
            if rule.check is not None and rule.check(m, context) is not None:
                declined_seen.add((rule.name, m.nodes))  # not a match after all
                continue
            rep = rule.rewrite(m, context)
            if isinstance(rep, str):
                declined_seen.add((rule.name, m.nodes))
                log.declined.append(Applied(rule.name, m.nodes, declined=rep))
                continue
            apply_replacement(rewriter, m, rep, rule.name)
            log.applied.append(Applied(rule.name, m.nodes, rep.note))
            applied += 1
        log.steps += 1
        if applied:
            rewriter.remove_orphans()
            rewriter.validate()
    else:
        # out of steps: a fixed point anyway when every remaining match was declined
        if any((r.name, m.nodes) not in declined_seen for r, m in find_matches(rewriter, rules)):
            log.hit_step_limit = True
            warnings.warn(f"rewriting stopped after {max_steps} steps before a fixed point",
                          RuntimeWarning, stacklevel=2)
    return log


def why_not(rewriter: NetworkRewriter, rule: Rule, node: str,
            keep_derivatives: bool = False) -> str:
    """Why ``rule`` does not fire at ``node`` (the matcher's or the rule's reason),
    or ``"matches"`` when it would."""
    if node not in rewriter.graph:
        return f"no node named {node!r}"
    m = match_pattern(rewriter.graph, node, rule.pattern, rewriter.preserve)
    if isinstance(m, MatchFailure):
        return str(m)
    context = RewriteContext(rewriter.nnet, keep_derivatives, rewriter.preserve,
                             rewriter=rewriter)
    if rule.check is not None:
        reason = rule.check(m, context)
        if reason is not None:
            return f"{rule.name} at {node}: {reason}"
    rep = rule.rewrite(m, context)
    if isinstance(rep, str):
        return f"{rule.name} at {node}: declined: {rep}"
    return "matches"
