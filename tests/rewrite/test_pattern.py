"""Patterns as data and the matcher: what a match holds, and the reason a match fails
(which entry, which condition)."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.descriptor import parse_descriptor
from pynnet3.rewrite import (
    Match,
    MatchFailure,
    NetworkGraph,
    ParamPattern,
    Pattern,
    component_config,
    match_pattern,
)

CONFIG = """
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=4
component-node name=a component=a input=input
component name=bn type=BatchNormComponent dim=4 test-mode=true
component-node name=bn component=bn input=a
component name=relu type=RectifiedLinearComponent dim=4
component-node name=relu component=relu input=bn
component name=b type=AffineComponent input-dim=12 output-dim=4
component-node name=b component=b input=Append(Offset(relu, -1), relu, Offset(relu, 1))
component name=c type=LinearComponent input-dim=8 output-dim=4
component-node name=c component=c input=Append(Scale(2, b), input)
component name=t type=TanhComponent dim=4
component-node name=t component=t input=Sum(c, b)
output-node name=output input=t
output-node name=raw input=bn
"""


@pytest.fixture(scope="module")
def graph() -> NetworkGraph:
    return NetworkGraph(pynnet3.Nnet.from_config(CONFIG.strip()))


def fails(result, entry, *words) -> None:
    assert isinstance(result, MatchFailure) and not result, result
    assert result.entry == entry, result
    for w in words:
        assert w in result.reason, result


def test_pattern_validation():
    with pytest.raises(ValueError, match="no entries"):
        Pattern("empty", entries=())
    with pytest.raises(ValueError, match="edge 0 kind 'diagonal'"):
        Pattern("bad", entries=("A", "B"), edges=("diagonal",))
    p = Pattern("p", entries=("AffineComponent", ("A", "B")))
    assert p.entries == (("AffineComponent",), ("A", "B"))
    assert p.edge(0) == "plain" and p.config(3) == {} and p.params(1) == {}


def test_spliced_match(graph):
    p = Pattern("relu->affine", entries=("AffineComponent", "RectifiedLinearComponent"),
                edges=("spliced",))
    m = match_pattern(graph, "b", p)
    assert isinstance(m, Match) and m
    assert m.root == "b" and m.nodes == ("b", "relu") and m.size == 2
    assert [c.type_name for c in m.components] == ["AffineComponent",
                                                   "RectifiedLinearComponent"]
    assert [(r.node, r.t_offset) for r in m.links[0]] == [("relu", -1), ("relu", 0),
                                                         ("relu", 1)]
    assert [str(d) for d in m.inputs] == ["Append(Offset(relu, -1), relu, Offset(relu, 1))",
                                          "bn"]


def test_plain_edge_reasons(graph):
    p = Pattern("p", entries=("AffineComponent", "RectifiedLinearComponent"))
    fails(match_pattern(graph, "b", p), 0, "is not a single plain node")
    p = Pattern("p", entries=("RectifiedLinearComponent", "BatchNormComponent",
                              "AffineComponent"))
    m = match_pattern(graph, "relu", p)
    # bn also feeds the output 'raw': two consumers
    fails(m, 1, "'bn' has 2 consumers (relu, raw)")
    m = match_pattern(graph, "relu", Pattern("p", entries=p.entries, shared_inner=True))
    assert isinstance(m, Match) and m.nodes == ("relu", "bn", "a")


def test_type_and_kind_reasons(graph):
    p = Pattern("p", entries=("AffineComponent",))
    fails(match_pattern(graph, "t", p), 0, "'t' is TanhComponent, want AffineComponent")
    fails(match_pattern(graph, "input", p), 0, "'input' is a input-node")
    p = Pattern("p", entries=(("RectifiedLinearComponent",), ("LinearComponent",
                                                               "TdnnComponent")))
    fails(match_pattern(graph, "relu", p), 1, "'bn' is BatchNormComponent",
          "LinearComponent or TdnnComponent")


def test_columns_edge(graph):
    p = Pattern("p", entries=("LinearComponent", "AffineComponent"), edges=("columns",))
    # b is read by c and t: an inner node needs one consumer unless shared
    fails(match_pattern(graph, "c", p), 1, "'b' has 2 consumers (c, t)")
    p = Pattern("p", entries=p.entries, edges=p.edges, shared_inner=True)
    m = match_pattern(graph, "c", p)
    assert isinstance(m, Match) and m.nodes == ("c", "b")
    assert [(r.node, r.part, r.scale) for r in m.links[0]] == [("b", 0, 2.0)]
    p2 = Pattern("p", entries=("TanhComponent", "LinearComponent"), edges=("columns",))
    fails(match_pattern(graph, "t", p2), 0, "no node of Sum(c, b) is read only through")
    p3 = Pattern("p", entries=("LinearComponent", "BatchNormComponent"), edges=("columns",))
    fails(match_pattern(graph, "c", p3), 0, "no part of", "linear read of a BatchNormComponent")


def test_spliced_reason(graph):
    p = Pattern("p", entries=("LinearComponent", "AffineComponent"), edges=("spliced",))
    fails(match_pattern(graph, "c", p), 0, "is not one node at time offsets")


def test_config_patterns(graph):
    def positive(v):
        return v > 0

    p = Pattern("p", entries=("BatchNormComponent",), config_patterns=({"test_mode": True},))
    assert isinstance(match_pattern(graph, "bn", p), Match)
    p = Pattern("p", entries=("BatchNormComponent",),
                config_patterns=({"test_mode": False},))
    fails(match_pattern(graph, "bn", p), 0, "'bn' has test_mode=True, want False")
    p = Pattern("p", entries=("BatchNormComponent",), config_patterns=({"epsilon": positive},))
    assert isinstance(match_pattern(graph, "bn", p), Match)
    p = Pattern("p", entries=("BatchNormComponent",),
                config_patterns=({"epsilon": lambda v: v > 1},))
    fails(match_pattern(graph, "bn", p), 0, "epsilon=", "want <lambda>")
    p = Pattern("p", entries=("BatchNormComponent",), config_patterns=({"colour": 1},))
    fails(match_pattern(graph, "bn", p), 0, "BatchNormComponent has no setting 'colour'")


def test_component_config(graph):
    cfg = component_config(graph.component("bn"))
    assert cfg["type"] == "BatchNormComponent" and cfg["test_mode"] is True
    assert cfg["dim"] == 4
    assert not any(isinstance(v, np.ndarray) for v in cfg.values())
    assert not any(k.startswith("_") for k in cfg)


def test_param_patterns(graph):
    small = ParamPattern("all below 100", lambda w: bool(np.all(np.abs(w) < 100)))
    tiny = ParamPattern("all zero", lambda w: not w.any())
    p = Pattern("p", entries=("AffineComponent",), sub_patterns=({"linear_params": small},))
    assert isinstance(match_pattern(graph, "b", p), Match)
    p = Pattern("p", entries=("AffineComponent",), sub_patterns=({"bias_params": tiny},))
    fails(match_pattern(graph, "b", p), 0, "parameter bias_params: not all zero")
    p = Pattern("p", entries=("AffineComponent",), sub_patterns=({"nothing": tiny},))
    fails(match_pattern(graph, "b", p), 0, "has no parameter 'nothing'")


def test_is_output(graph):
    p = Pattern("p", entries=("TanhComponent",), is_output=True)
    assert isinstance(match_pattern(graph, "t", p), Match)
    p = Pattern("p", entries=("AffineComponent",), is_output=True)
    fail = match_pattern(graph, "b", p)
    fails(fail, None, "'b' does not feed an output node")
    assert str(fail) == "p at b: match: 'b' does not feed an output node"


def test_preserved_inner(graph):
    p = Pattern("p", entries=("BatchNormComponent", "AffineComponent"))
    assert isinstance(match_pattern(graph, "bn", p), Match)
    fails(match_pattern(graph, "bn", p, frozenset({"a"})), 1, "'a' is preserved")
    # a preserved root keeps its name and value: allowed
    assert isinstance(match_pattern(graph, "bn", p, frozenset({"bn"})), Match)


def test_cycle():
    """A loop of plain edges is a zero-delay loop (load refuses it); the matcher
    still stops at it when handed such a graph (made here by editing a node)."""
    nnet = pynnet3.Nnet.from_config("""
input-node name=input dim=3
component name=a type=AffineComponent input-dim=3 output-dim=3
component-node name=a component=a input=Offset(b, -1)
component name=b type=AffineComponent input-dim=3 output-dim=3
component-node name=b component=b input=a
output-node name=output input=Sum(a, input)
""".strip())
    nnet.node("a").descriptor = parse_descriptor("b")
    p = Pattern("p", entries=("AffineComponent",) * 3, shared_inner=True)
    fails(match_pattern(NetworkGraph(nnet), "a", p), 2, "'a' already in the match")
