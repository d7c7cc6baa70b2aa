"""The read-only graph view: edges with parts, offsets, scales and wrappers, consumers,
labels, the reverse topological order."""

from __future__ import annotations

import pytest

import pynnet3
from pynnet3.rewrite import Edge, NetworkGraph

CONFIG = """
input-node name=input dim=4
component name=a type=AffineComponent input-dim=8 output-dim=5
component-node name=a component=a input=Append(Offset(input, -1), input)
dim-range-node name=dr input-node=a dim-offset=1 dim=4
component name=t type=TanhComponent dim=4
component-node name=b component=t input=Sum(Scale(0.5, dr), IfDefined(Offset(input, 2)))
component-node name=c component=t input=Offset(b, 0, 1)
output-node name=output input=Append(b, Round(c, 2))
"""


@pytest.fixture(scope="module")
def graph() -> NetworkGraph:
    return NetworkGraph(pynnet3.Nnet.from_config(CONFIG.strip()))


def test_edges_carry_parts_offsets_scales_wrappers(graph):
    a_in = graph["a"].inputs
    assert [(e.src, e.ref.part, e.t_offset, e.scale) for e in a_in] == \
        [("input", 0, -1, 1.0), ("input", 1, 0, 1.0)]
    b_in = graph["b"].inputs
    assert [(e.src, e.t_offset, e.scale, e.ref.wrappers) for e in b_in] == \
        [("dr", 0, 0.5, ("Sum",)), ("input", 2, 1.0, ("Sum", "IfDefined", "Offset"))]
    assert graph["c"].inputs[0].ref.x_offset == 1
    assert graph["dr"].inputs == [Edge("a", "dr")]
    assert graph["input"].inputs == []


def test_labels(graph):
    assert [e.label() for e in graph["a"].inputs] == ["t-1", ""]
    assert [e.label() for e in graph["b"].inputs] == ["*0.5 Sum", "t+2 Sum IfDefined"]
    assert graph["dr"].inputs[0].label() == "dim-range"
    assert [e.label() for e in graph["output"].inputs] == ["", "Round"]


def test_labels_tell_scale_from_x_offset():
    nnet = pynnet3.Nnet.from_config("""
input-node name=input dim=4
component name=t type=TanhComponent dim=4
component-node name=p component=t input=Scale(-1, input)
component-node name=q component=t input=Offset(input, 0, -1)
output-node name=output input=Append(p, q)
""".strip())
    g = NetworkGraph(nnet)
    assert g["p"].inputs[0].label() != g["q"].inputs[0].label()


def test_consumers(graph):
    # two edges from input to a, one name; network order of first reference
    assert graph["input"].consumer_names == ["a", "b"]
    assert len(graph["input"].consumers) == 3
    assert graph["a"].consumer_names == ["dr"]
    assert graph["dr"].consumer_names == ["b"]
    assert graph["b"].consumer_names == ["c", "output"]
    assert graph["output"].consumer_names == []
    assert graph["b"].source_names == ["dr", "input"]
    assert graph.feeds_output("b") and graph.feeds_output("c")
    assert not graph.feeds_output("a") and not graph.feeds_output("dr")


def test_components_and_users(graph):
    assert graph.component("a").type_name == "AffineComponent"
    assert graph.component("dr") is None and graph.component("input") is None
    assert graph.component_users() == {"a": ["a"], "t": ["b", "c"]}
    assert "dr" in graph and "nothing" not in graph
    assert [gn.name for gn in graph] == ["input", "a", "dr", "b", "c", "output"]
    assert graph["c"].kind == "component-node" and graph["c"].position == 4


def test_reverse_topological(graph):
    order = graph.reverse_topological()
    assert sorted(order) == sorted(gn.name for gn in graph)
    pos = {n: i for i, n in enumerate(order)}
    for gn in graph:
        for e in gn.inputs:
            assert pos[e.dst] < pos[e.src], (e.src, e.dst, order)


def test_reverse_topological_with_recurrence():
    nnet = pynnet3.Nnet.from_config("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=7 output-dim=3
component-node name=a component=a input=Append(input, IfDefined(Offset(h, -1)))
component name=h type=TanhComponent dim=3
component-node name=h component=h input=a
component name=o type=AffineComponent input-dim=3 output-dim=2
component-node name=o component=o input=h
output-node name=output input=o
""".strip())
    order = NetworkGraph(nnet).reverse_topological()
    assert sorted(order) == sorted(n.name for n in nnet.nodes) and len(set(order)) == len(order)
    # outside the loop the order holds
    assert order.index("output") < order.index("o") < order.index("h")
    assert order.index("a") < order.index("input")


def test_describe(graph):
    lines = graph.describe().splitlines()
    assert lines[1] == "component-node a [AffineComponent] <- input(t-1), input -> dr"
    assert lines[2] == "dim-range-node dr <- a(dim-range) -> b"
    assert lines[0] == "input-node input <- - -> a, b"


def test_view_does_not_mutate():
    nnet = pynnet3.Nnet.from_config(CONFIG.strip())
    before = nnet.to_bytes()
    g = NetworkGraph(nnet)
    g.reverse_topological()
    g.describe()
    assert nnet.to_bytes() == before
