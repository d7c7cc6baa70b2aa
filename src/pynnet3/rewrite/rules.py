"""Rules and their registries.

A :class:`Rule` is a pattern plus a function from a match to a
:class:`Replacement` (new components and the nodes that replace the match's
root), or to a string saying why it declines (a cost model, a shape it does not
handle). The replacement's last node takes the root's name, so consumers need
no rewiring; inner nodes the match no longer needs become orphans and are
dropped by the driver.

Registries are ordered and named: ``fold`` (constant folding), ``fuse``,
``shatter`` and ``parameter``. Users add their own rules with
:func:`register_rule` (or ``REGISTRIES[name].register``); higher ``priority``
wins ties between matches of equal size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..components.base import Component
from ..nnet import Nnet, Node
from .graph import NetworkGraph
from .pattern import Match, Pattern


@dataclass
class NewComponent:
    """A component a replacement adds. ``key`` lets the rewriter reuse an equal
    component made earlier under the same name (a merge built once)."""

    name: str
    component: Component
    key: object = None


@dataclass
class Replacement:
    """What a rule puts in place of a match's root: ``nodes`` in topological
    order, the last named as the root; ``components`` they use; ``replaces``:
    other existing nodes given a new definition under the same name (a
    parameter-fusion rule turns its siblings into dim ranges of the fused node)."""

    nodes: list[Node]
    components: list[NewComponent] = field(default_factory=list)
    replaces: list[Node] = field(default_factory=list)
    note: str = ""


@dataclass
class RewriteContext:
    """What rules may consult besides the match: the network being rewritten and
    whether input derivatives must stay exact (``keep_derivatives``; False means
    inference, where backprop-only behaviour may be dropped); ``enabled_rules``: the
    names of the rules this optimization runs in any pass (None: all), for a rule
    that leaves work to another one. ``rewriter``: the NetworkRewriter applying the
    rules, whose graph view of ``nnet`` :attr:`graph` reuses."""

    nnet: Nnet
    keep_derivatives: bool = False
    preserve: frozenset[str] = frozenset()
    enabled_rules: frozenset[str] | None = None
    rewriter: object | None = None

    @property
    def graph(self) -> NetworkGraph:
        """A graph view of the network as it is now: the rewriter's (kept until its
        next change) when there is one, else made for the call."""
        if self.rewriter is not None:
            return self.rewriter.graph
        return NetworkGraph(self.nnet)


RewriteFn = Callable[[Match, RewriteContext], "Replacement | str"]
CheckFn = Callable[[Match, RewriteContext], "str | None"]


@dataclass
class Rule:
    """A named rewrite: ``pattern`` finds candidates, ``rewrite(match, context)``
    builds the replacement or declines with a reason. ``check(match, context)``,
    when given, is a further condition of the match (a reason when it does not
    hold): a failed check is a non-match (not a decline the report lists), while
    ``rewrite`` declines are near misses worth reporting (a cost model said no).
    A rule that is not
    ``enabled_by_default`` runs only when asked for by name
    (``NetworkOptions(enable_rules=...)``)."""

    name: str
    pattern: Pattern
    rewrite: RewriteFn
    priority: int = 0
    description: str = ""
    enabled_by_default: bool = True
    check: CheckFn | None = None


class RuleRegistry:
    """Ordered rules by name; iteration follows registration order."""

    def __init__(self, name: str):
        self.name = name
        self._rules: dict[str, Rule] = {}

    def register(self, rule: Rule, *, replace: bool = False) -> Rule:
        if rule.name in self._rules and not replace:
            raise ValueError(f"rule {rule.name!r} already in the {self.name} registry")
        self._rules[rule.name] = rule
        return rule

    def unregister(self, name: str) -> None:
        self._rules.pop(name, None)

    def __iter__(self) -> Iterator[Rule]:
        return iter(list(self._rules.values()))

    def __len__(self) -> int:
        return len(self._rules)

    def __contains__(self, name: str) -> bool:
        return name in self._rules

    def __getitem__(self, name: str) -> Rule:
        return self._rules[name]

    def names(self) -> list[str]:
        return list(self._rules)


REGISTRIES: dict[str, RuleRegistry] = {
    name: RuleRegistry(name) for name in ("fold", "fuse", "shatter", "parameter")}


def register_rule(registry: str, rule: Rule, *, replace: bool = False) -> Rule:
    """Add ``rule`` to the named registry (``fold``, ``fuse``, ``shatter``,
    ``parameter``)."""
    if registry not in REGISTRIES:
        raise KeyError(f"no rule registry {registry!r}; have {sorted(REGISTRIES)}")
    return REGISTRIES[registry].register(rule, replace=replace)


def find_rule(name: str) -> Rule:
    """A registered rule by name, from any registry."""
    for reg in REGISTRIES.values():
        if name in reg:
            return reg[name]
    raise KeyError(f"no rule named {name!r}")
