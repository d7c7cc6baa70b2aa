"""NetworkRewriter, the one mutation path: what each edit does, what it records, and
that every refusal leaves the network exactly as it was."""

from __future__ import annotations

from dataclasses import replace

import pytest

import pynnet3
from pynnet3.components.nonlinear import TanhComponent
from pynnet3.descriptor import parse_descriptor
from pynnet3.errors import GraphError
from pynnet3.nnet import Node
from pynnet3.rewrite import NetworkRewriter, RewriteRefused

CONFIG = """
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=4
component-node name=a component=a input=input
component name=n type=NoOpComponent dim=4
component-node name=n component=n input=Sum(a, Offset(input, 1))
component name=m type=NoOpComponent dim=8
component-node name=m component=m input=Append(a, input)
component name=t type=TanhComponent dim=4
component-node name=c1 component=t input=Offset(n, -1)
component-node name=c2 component=t input=Sum(n, a)
component name=u type=TanhComponent dim=8
component-node name=c3 component=u input=Offset(m, 2)
component-node name=c4 component=t input=Sum(Offset(Scale(2, n), 1), IfDefined(Offset(n, -2)))
component name=r type=AffineComponent input-dim=8 output-dim=4
component-node name=rec component=r input=Append(input, IfDefined(Offset(rec, -1)))
dim-range-node name=full input-node=a dim-offset=0 dim=4
dim-range-node name=half input-node=n dim-offset=0 dim=2
output-node name=output input=Append(c1, c2, c3, c4, rec, full, half)
"""


def make(preserve=()) -> NetworkRewriter:
    return NetworkRewriter(pynnet3.Nnet.from_config(CONFIG.strip()), frozenset(preserve))


def assert_refused(rw: NetworkRewriter, fn, *args, match: str) -> None:
    before = rw.nnet.to_bytes()
    nodes = list(rw.nnet.nodes)
    with pytest.raises(RewriteRefused, match=match):
        fn(*args)
    assert rw.nnet.to_bytes() == before
    assert rw.nnet.nodes == nodes
    assert rw.changes == []


def test_network_is_valid():
    make().validate()


@pytest.mark.parametrize("name,preserve,why", [
    ("input", (), "preserved, an input or an output"),
    ("output", (), "preserved, an input or an output"),
    ("a", ("a",), "preserved, an input or an output"),
    ("rec", (), "reads itself"),
    # n's Sum cannot go where the dim-range node 'half' needs a node
    ("n", (), "dim-range node 'half'"),
])
def test_inline_refusals_change_nothing(name, preserve, why):
    rw = make(preserve)
    assert_refused(rw, rw.inline, name, match=why)


def test_inline_refusal_is_atomic():
    """m := Append(a, input) fits c3 (Offset(m, 2)) but not c5 (a Sum): the refusal
    comes before c3 is rewired."""
    nnet = pynnet3.Nnet.from_config("""
input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=2
component-node name=a component=a input=input
component name=m type=NoOpComponent dim=6
component-node name=m component=m input=Append(a, input)
component name=u type=TanhComponent dim=6
component-node name=c3 component=u input=Offset(m, 2)
component-node name=c5 component=u input=Sum(m, c3)
output-node name=output input=Append(c3, c5)
""".strip())
    rw = NetworkRewriter(nnet)
    assert_refused(rw, rw.inline, "m", match="cannot rewire 'c5'")


def test_inline_rewires_every_reader():
    rw = make()
    rw.inline("m")  # Append(a, input), read only by c3
    assert str(rw.nnet.node("c3").descriptor) == "Append(Offset(a, 2), Offset(input, 2))"
    assert [(c.op, c.name) for c in rw.changes] == [("set-input", "c3"), ("remove-node", "m")]
    rw.validate()
    rw.inline("full")  # a full-width dim range of a
    assert str(rw.nnet.node("output").descriptor).endswith(", a, half)")
    assert "full" not in rw.graph and "m" not in rw.graph  # the view is rebuilt


def test_inline_with_a_replacement():
    """A caller-proved replacement (a uniform scale) rewires readers through their
    chains, Sums and IfDefined; the dim-range reader 'half' must refuse."""
    rw = make()
    rw.nnet.nodes = [n for n in rw.nnet.nodes if n.name != "half"]
    rw.nnet.nodes = [replace(n, descriptor=parse_descriptor(
        "Append(c1, c2, c3, c4, rec, full)")) if n.name == "output" else n
        for n in rw.nnet.nodes]
    rw.inline("n", parse_descriptor("Scale(0.5, Sum(a, Offset(input, 1)))"))
    d = {name: str(rw.nnet.node(name).descriptor) for name in ("c1", "c2", "c4")}
    assert d["c1"] == "Sum(Offset(Scale(0.5, a), -1), Scale(0.5, input))"
    assert d["c2"] == "Sum(Sum(Scale(0.5, a), Offset(Scale(0.5, input), 1)), a)"
    # scales 2 * 0.5 = 1 in the first term
    assert d["c4"] == ("Sum(Sum(Offset(a, 1), Offset(input, 2)), IfDefined(Sum("
                       "Offset(Scale(0.5, a), -2), Offset(Scale(0.5, input), -1))))")
    rw.validate()


def test_replace_insert_set_input():
    rw = make()
    assert_refused(rw, rw.replace_node, "c1",
                   Node("component-node", "c2", component="t",
                        descriptor=parse_descriptor("a")), match="existing node 'c2'")
    assert_refused(rw, rw.insert_before, "c1",
                   Node("component-node", "a", component="t",
                        descriptor=parse_descriptor("a")), match="already exists")
    assert_refused(rw, rw.set_input, "input", parse_descriptor("a"), match="no input")
    assert_refused(rw, rw.remove_node, "a", match="still has consumers")
    assert_refused(rw, rw.replace_node, "nope", rw.nnet.node("a"), match="no node named")

    rw.insert_before("c1", Node("component-node", "new", component="t",
                                descriptor=parse_descriptor("Offset(a, 1)")))
    names = [n.name for n in rw.nnet.nodes]
    assert names.index("new") == names.index("c1") - 1
    assert rw.graph["a"].consumer_names[-1] == "new" or "new" in rw.graph["a"].consumer_names
    rw.set_input("c1", parse_descriptor("new"))
    assert rw.graph["new"].consumer_names == ["c1"]
    assert [c.op for c in rw.changes] == ["insert-node", "set-input"]
    rw.validate()


def test_unique_node_name():
    rw = make()
    assert rw.unique_node_name("fresh") == "fresh"
    assert rw.unique_node_name("a") == "a.2"


def test_add_component_names_and_reuse():
    rw = make()
    assert rw.add_component("x", TanhComponent(4)) == "x"
    assert rw.add_component("t", TanhComponent(4)) == "t.2"  # clash with an existing one
    assert rw.add_component("k", TanhComponent(4), key=("k", 1)) == "k"
    assert rw.add_component("k", TanhComponent(4), key=("k", 1)) == "k"  # built once
    assert rw.add_component("k", TanhComponent(4), key=("k", 2)) == "k.2"
    assert [c.op for c in rw.changes] == ["add-component"] * 4


def test_add_component_reuses_suffixed_names():
    """An equal key made under a suffixed name ('k.2') is found there (was built
    again as 'k.3' before 699f978)."""
    rw = make()
    rw.add_component("k", TanhComponent(4), key=1)
    assert rw.add_component("k", TanhComponent(4), key=2) == "k.2"
    assert rw.add_component("k", TanhComponent(4), key=2) == "k.2"


def test_remove_orphans():
    nnet = pynnet3.Nnet.from_config("""
input-node name=input dim=4
input-node name=extra dim=4
component name=a type=AffineComponent input-dim=4 output-dim=4
component-node name=a component=a input=input
component name=t type=TanhComponent dim=4
component-node name=dead1 component=t input=a
component-node name=dead2 component=t input=dead1
component-node name=kept component=t input=extra
component name=spare type=SigmoidComponent dim=4
output-node name=output input=a
""".strip())
    rw = NetworkRewriter(nnet, frozenset({"kept"}))
    assert rw.remove_orphans() == 3  # dead1, dead2, spare (t is still used by 'kept')
    assert [n.name for n in nnet.nodes] == ["input", "extra", "a", "kept", "output"]
    assert sorted(nnet.components) == ["a", "t"]
    assert sorted((c.op, c.name) for c in rw.changes) == [
        ("remove-component", "spare"), ("remove-node", "dead1"), ("remove-node", "dead2")]
    assert rw.remove_orphans() == 0


def test_validate_names_the_problem():
    rw = make()
    rw.nnet.nodes = [replace(n, descriptor=parse_descriptor("ghost")) if n.name == "c1"
                     else n for n in rw.nnet.nodes]
    with pytest.raises(GraphError, match="ghost"):
        rw.validate()


def test_protection():
    rw = make(("c1",))
    assert rw.is_protected("input") and rw.is_protected("output") and rw.is_protected("c1")
    assert not rw.is_protected("c2") and not rw.is_protected("full")


def test_validate_checks_again_only_after_a_change(monkeypatch):
    rw = make()
    calls = []
    real = pynnet3.Nnet.validate
    monkeypatch.setattr(pynnet3.Nnet, "validate",
                        lambda self, source="config": (calls.append(1), real(self, source)))
    rw.validate()
    rw.validate()
    assert len(calls) == 1
    # a change that leaves the network invalid (a node reading one of another dim)
    rw.insert_before("c1", Node("component-node", "new", component="t",
                                descriptor=parse_descriptor("Append(a, a)")))
    with pytest.raises(pynnet3.errors.PynnetError):
        rw.validate()
    assert len(calls) == 2
