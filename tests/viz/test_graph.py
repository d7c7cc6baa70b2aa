"""The network drawing: well-formed DOT, every node and edge with its label,
recurrences marked, the side-by-side drawing marking what the optimizer did."""

from __future__ import annotations

import re
import shutil
from importlib import resources

import pytest

import pynnet3
from pynnet3.errors import DependencyError
from pynnet3.viz import network_graph, render_dot
from pynnet3.viz.graph import quote

_CONFIG = """\
input-node name=input dim=4
input-node name=ivector dim=2
component name=affine-1.a type=NaturalGradientAffineComponent input-dim=14 output-dim=6
component-node name=affine-1.a component=affine-1.a input={append}
component name=rec type=AffineComponent input-dim=6 output-dim=6
component-node name=rec component=rec input=Sum(affine-1.a, IfDefined(Offset(rec.relu, -1)))
component name=rec.relu type=RectifiedLinearComponent dim=6
component-node name=rec.relu component=rec.relu input=rec
dim-range-node name=half input-node=rec.relu dim-offset=3 dim=3
component name=final type=AffineComponent input-dim=3 output-dim=5
component-node name=final component=final input=Failover(Offset(half, 1), half)
output-node name=output input=final objective=linear
""".format(append="Append(Offset(input, -1), input, Scale(0.66, Offset(input, 2)), "
                  "ReplaceIndex(ivector, t, 0))")

# DOT statements: a node statement, an edge statement (quoted ids, bracketed attributes)
_ID = r'"(?:[^"\\]|\\.)*"'
_NODE = re.compile(rf"^\s*({_ID}) \[(.*)\];$", re.M)
_EDGE = re.compile(rf"^\s*({_ID}) -> ({_ID}) \[(.*)\];$", re.M)


def _unquote(s: str) -> str:
    return s[1:-1].replace('\\"', '"').replace("\\\\", "\\")


def _label(attrs: str) -> str:
    return _unquote(re.search(rf"label=({_ID})", attrs).group(1))


def parse(dot: str) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """A small structural check of DOT text: braces balance (outside quoted
    strings), every line is a known statement; returns nodes -> attributes and
    edges (src, dst, attributes)."""
    depth = 0
    for ch in re.sub(_ID, '""', dot):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0
    assert dot.startswith("digraph ")
    known = re.compile(rf"^(digraph \w+ \{{|\s*\}}|\s*subgraph \w+ \{{|\s*\w+=\S.*;|"
                       rf"\s*(node|edge) \[.*\];|{_NODE.pattern[1:-1]}|{_EDGE.pattern[1:-1]})$")
    for line in dot.splitlines():
        assert known.match(line), line
    nodes = {_unquote(m.group(1)): m.group(2) for m in _NODE.finditer(dot)}
    edges = [(_unquote(m.group(1)), _unquote(m.group(2)), m.group(3))
             for m in _EDGE.finditer(dot)]
    for src, dst, _ in edges:
        assert src in nodes and dst in nodes, (src, dst)
    return nodes, edges


@pytest.fixture(scope="module")
def nnet():
    return pynnet3.Nnet.from_config(_CONFIG, seed=0)


def test_every_node_and_edge_with_its_label(nnet):
    nodes, edges = parse(network_graph(nnet))
    assert set(nodes) == {n.name for n in nnet.nodes}
    got = sorted((s, d, _label(a)) for s, d, a in edges)
    assert got == sorted([
        ("input", "affine-1.a", "part 0 t-1"),
        ("input", "affine-1.a", "part 1"),
        ("input", "affine-1.a", "part 2 t+2 *0.66"),
        ("ivector", "affine-1.a", "part 3 ReplaceIndex"),
        ("affine-1.a", "rec", "Sum"),
        ("rec.relu", "rec", "t-1 Sum IfDefined"),
        ("rec", "rec.relu", ""),
        ("rec.relu", "half", "cols 3:6"),
        ("half", "final", "t+1 Failover"),
        ("half", "final", "Failover"),
        ("final", "output", ""),
    ])
    assert "NaturalGradientAffineComponent" in _label(nodes["affine-1.a"])
    assert "14 -> 6, 90 params" in _label(nodes["affine-1.a"])
    assert "input, dim 4" in _label(nodes["input"])
    assert "dim-range 3:6 of rec.relu" in _label(nodes["half"])


def test_recurrence_edges_are_marked(nnet):
    _, edges = parse(network_graph(nnet))
    red = {(s, d) for s, d, a in edges if 'color="#d62828"' in a}
    assert red == {("rec.relu", "rec"), ("rec", "rec.relu")}
    back = {(s, d) for s, d, a in edges if "style=dashed, constraint=false" in a}
    assert back == {("rec.relu", "rec")}


def test_components_are_coloured_by_type(nnet):
    nodes, _ = parse(network_graph(nnet))
    fill = {n: re.search(r'fillcolor="([^"]+)"', a).group(1) for n, a in nodes.items()
            if n in ("rec", "final", "rec.relu")}
    assert fill["rec"] == fill["final"]  # both AffineComponent
    assert fill["rec"] != fill["rec.relu"]


def test_names_are_quoted():
    assert quote('a.b-c"d\\e') == '"a.b-c\\"d\\\\e"'


def _bundled():
    cfg = resources.files("pynnet3").joinpath("examples/tdnnf.config").read_text()
    nnet = pynnet3.Nnet.from_config(cfg, seed=0)
    nnet.set_test_mode(True)
    return nnet


def test_side_by_side_marks_what_the_optimizer_did():
    nnet = _bundled()
    opt = pynnet3.optimize_network(nnet)
    dot = network_graph(nnet, opt)
    nodes, edges = parse(dot)
    assert "subgraph cluster_original {" in dot and "subgraph cluster_optimized {" in dot
    before = {n.name for n in nnet.nodes}
    after = {n.name for n in opt.nodes}
    assert {n for n in nodes if n.startswith("original/")} == {"original/" + n for n in before}
    assert {n for n in nodes if n.startswith("optimized/")} == {"optimized/" + n for n in after}
    removed = {n.removeprefix("original/") for n, a in nodes.items()
               if _label(a).endswith("(removed)")}
    assert removed == before - after and removed
    new = {n.removeprefix("optimized/") for n, a in nodes.items()
           if _label(a).endswith("(new)")}
    assert new == after - before
    changed = {n for n, a in nodes.items() if _label(a).endswith("(changed)")}
    assert changed  # batchnorms folded into the affine layers
    for s, d, _ in edges:  # no edge crosses the clusters
        assert s.split("/")[0] == d.split("/")[0]


def test_random_networks_draw():
    from pynnet3.testing.random_nets import case_for_seed

    for seed in range(6):
        nnet = case_for_seed(seed).build_nnet()
        nodes, edges = parse(network_graph(nnet))
        assert set(nodes) == {n.name for n in nnet.nodes}
        assert len(edges) == sum(len(n.inputs) for n in pynnet3.rewrite.graph.NetworkGraph(nnet))


def test_render_without_graphviz_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(DependencyError, match="install Graphviz"):
        render_dot("digraph g {}", "svg")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
@pytest.mark.parametrize("fmt,head", [("svg", b"<svg"), ("png", b"\x89PNG\r\n\x1a\n"),
                                      ("pdf", b"%PDF")])
def test_render_with_graphviz(nnet, fmt, head):
    data = render_dot(network_graph(nnet, nnet), fmt)
    assert data[:2048].find(head) >= 0
