"""The network rewrite engine: a graph view of an Nnet, one rewriter for every
mutation, patterns as data with a matcher that explains failures, rule
registries, and a driver that applies rules to a fixed point (seed 004's
design on nnet3 networks). The passes built on it live in :mod:`pynnet3.graphopt`.
"""

from .algebra import SubstitutionError, references, substitute
from .engine import Applied, MatchStrategy, RewriteLog, rewrite_to_fixed_point, why_not
from .graph import Edge, GraphNode, NetworkGraph
from .pattern import Match, MatchFailure, ParamPattern, Pattern, component_config, match_pattern
from .rewriter import Change, NetworkRewriter, RewriteRefused
from .rules import (
    REGISTRIES,
    NewComponent,
    Replacement,
    RewriteContext,
    Rule,
    RuleRegistry,
    find_rule,
    register_rule,
)

__all__ = [
    "REGISTRIES", "Applied", "Change", "Edge", "GraphNode", "Match", "MatchFailure",
    "MatchStrategy", "NetworkGraph", "NetworkRewriter", "NewComponent", "ParamPattern",
    "Pattern", "Replacement", "RewriteContext", "RewriteLog", "RewriteRefused", "Rule",
    "RuleRegistry",
    "SubstitutionError", "component_config", "find_rule", "match_pattern", "references",
    "register_rule", "rewrite_to_fixed_point", "substitute", "why_not",
]
