"""pynnet3.descriptor: parsing, Kaldi normalization, printing and evaluation."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynnet3.config import ConfigLine
from pynnet3.descriptor import (
    ConstOf,
    Descriptor,
    FailoverOf,
    IfDefinedOf,
    NodeRef,
    OffsetOf,
    ReplaceIndexOf,
    RoundOf,
    SumOf,
    SwitchOf,
    descriptor_computable,
    parse_descriptor,
    part_computable,
    part_dim,
    resolve_part,
)
from pynnet3.errors import DescriptorError
from pynnet3.index import pack

from .reference import REF, ref_params


def _text_models() -> list[Path]:
    if not REF.is_dir():
        return []
    return (sorted(REF.rglob("model.txt")) + sorted(REF.glob("collapsed/*/collapsed_all.txt"))
            + sorted(REF.glob("training/*/*.txt.gz")))


def _node_lines(path: Path) -> list[str]:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    head = data.split(b"\n\n", 1)[0].decode()
    lines = head.split("\n")
    assert lines[0].strip() == "<Nnet3>"
    return lines[1:]


@pytest.mark.parametrize("path", ref_params(_text_models(), "text models"),
                         ids=lambda p: str(p.relative_to(REF)))
def test_every_reference_descriptor_round_trips_exactly(path):
    lines = [ConfigLine(t) for t in _node_lines(path)]
    names = {cl.values["name"] for cl in lines}
    n = 0
    for cl in lines:
        if cl.first in ("component-node", "output-node"):
            text = cl.values["input"]
            d = parse_descriptor(text, names)
            assert str(d) == text
            assert parse_descriptor(str(d), names) == d
            n += 1
    assert n > 0


# ----------------------------------------------------------------------------------
# Normalization (what Kaldi's GeneralDescriptor::Normalize does)
# ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, printed", [
    ("a", "a"),
    ("  a  ", "a"),
    ("Append(a)", "a"),
    ("Append(a, Append(b, c))", "Append(a, b, c)"),
    ("Scale(2, a)", "Scale(2, a)"),
    ("Scale(1.0, a)", "a"),
    ("Scale(0.5, Scale(4, a))", "Scale(2, a)"),
    ("Scale(2, Offset(a, -1))", "Offset(Scale(2, a), -1)"),
    ("Scale(2, Round(a, 3))", "Round(Scale(2, a), 3)"),
    ("Scale(2, ReplaceIndex(a, t, 0))", "ReplaceIndex(Scale(2, a), t, 0)"),
    ("Scale(0.4, ReplaceIndex(ivector, t, 0))", "ReplaceIndex(Scale(0.4, ivector), t, 0)"),
    ("Scale(2, Sum(a, b))", "Sum(Scale(2, a), Scale(2, b))"),
    ("Scale(3, Append(a, b))", "Append(Scale(3, a), Scale(3, b))"),
    ("Scale(-0.25, a)", "Scale(-0.25, a)"),
    ("Scale(1e-05, a)", "Scale(1e-05, a)"),
    ("Scale(0.1234567891, a)", "Scale(0.1234568, a)"),
    ("Offset(a, 0)", "a"),
    ("Offset(a, 0, 0)", "a"),
    ("Offset(a, 0, 1)", "Offset(a, 0, 1)"),
    ("Offset(a, 2, 0)", "Offset(a, 2)"),
    ("Offset(Offset(a, 1), 2)", "Offset(a, 3)"),
    ("Offset(Offset(a, 1, 2), -1, 3)", "Offset(a, 0, 5)"),
    ("Offset(Offset(a, 1), -1)", "a"),
    ("Offset(Offset(Offset(a, 1), 1), 1)", "Offset(a, 3)"),
    ("Offset(Round(Offset(a, 1), 2), 3)", "Offset(Round(Offset(a, 1), 2), 3)"),
    ("Offset(Append(a, b), 1)", "Append(Offset(a, 1), Offset(b, 1))"),
    ("Offset(Sum(a, b), -2)", "Sum(Offset(a, -2), Offset(b, -2))"),
    ("Offset(Failover(a, b), 1)", "Failover(Offset(a, 1), Offset(b, 1))"),
    ("Offset(IfDefined(a), 1)", "IfDefined(Offset(a, 1))"),
    ("Offset(IfDefined(Offset(a, -1)), 1)", "IfDefined(a)"),
    ("Round(Sum(a, b), 3)", "Sum(Round(a, 3), Round(b, 3))"),
    ("ReplaceIndex(Sum(a, b), x, 1)", "Sum(ReplaceIndex(a, x, 1), ReplaceIndex(b, x, 1))"),
    ("Sum(a)", "a"),
    ("Sum(a, b)", "Sum(a, b)"),
    ("Sum(a, b, c)", "Sum(a, Sum(b, c))"),
    ("Sum(a, b, c, d)", "Sum(a, Sum(b, Sum(c, d)))"),
    ("Sum(Sum(a, b), c)", "Sum(Sum(a, b), c)"),
    ("Sum(Append(a, b), Append(c, d))", "Append(Sum(a, c), Sum(b, d))"),
    ("Sum(Append(a, b), Append(c, d), Append(e, f))",
     "Append(Sum(a, Sum(c, e)), Sum(b, Sum(d, f)))"),
    ("Failover(Append(a, b), Append(c, d))", "Append(Failover(a, c), Failover(b, d))"),
    ("IfDefined(Append(a, Offset(b, 1)))", "Append(IfDefined(a), IfDefined(Offset(b, 1)))"),
    ("Const(1, 5)", "Const(1, 5)"),
    ("Const(0.5, 10)", "Const(0.5, 10)"),
    ("Const(-2.5e-3, 3)", "Const(-0.0025, 3)"),
    ("Sum(a, Const(1, 4))", "Sum(a, Const(1, 4))"),
    ("Append(a, Const(0, 2))", "Append(a, Const(0, 2))"),
    ("Switch(a, b)", "Switch(a, b)"),
    ("Switch(a, Offset(b, 1), c)", "Switch(a, Offset(b, 1), c)"),
    ("Offset(Switch(a, b), 1)", "Offset(Switch(a, b), 1)"),
    ("Switch(Append(a, b), Append(c, d))", "Append(Switch(a, c), Switch(b, d))"),
    ("Round(a, 3)", "Round(a, 3)"),
    ("Round(Offset(a, -1), 2)", "Round(Offset(a, -1), 2)"),
    ("ReplaceIndex(a, t, 0)", "ReplaceIndex(a, t, 0)"),
    ("ReplaceIndex(a, x, -3)", "ReplaceIndex(a, x, -3)"),
    ("Failover(Offset(a, -1), b)", "Failover(Offset(a, -1), b)"),
    ("IfDefined(Offset(a, -3))", "IfDefined(Offset(a, -3))"),
    ("Sum(IfDefined(Offset(c, -1)), b)", "Sum(IfDefined(Offset(c, -1)), b)"),
    ("Append(Offset(input,-1),input,Offset(input,1))",
     "Append(Offset(input, -1), input, Offset(input, 1))"),
    ("Sum(Offset(Append(a, b), 1), Append(c, Scale(2, d)))",
     "Append(Sum(Offset(a, 1), c), Sum(Offset(b, 1), Scale(2, d)))"),
])
def test_normalization_prints_like_kaldi(text, printed):
    d = parse_descriptor(text)
    assert str(d) == printed
    assert str(parse_descriptor(printed)) == printed  # printing is a fixed point


def test_normal_form_structure():
    assert parse_descriptor("Scale(2, Offset(a, 1))").parts == (OffsetOf(NodeRef("a", 2.0), 1),)
    assert parse_descriptor("Sum(a, b, c)").parts == (SumOf(NodeRef("a"), SumOf(NodeRef("b"),
                                                                                 NodeRef("c"))),)
    assert parse_descriptor("Append(a, Const(2, 3))").parts == (NodeRef("a"), ConstOf(2.0, 3))
    assert parse_descriptor("IfDefined(a)").parts == (IfDefinedOf(NodeRef("a")),)
    assert parse_descriptor("Failover(a, b)").parts == (FailoverOf(NodeRef("a"), NodeRef("b")),)
    assert parse_descriptor("Switch(a, b)").parts == (SwitchOf((NodeRef("a"), NodeRef("b"))),)
    assert parse_descriptor("Round(a, 2)").parts == (RoundOf(NodeRef("a"), 2),)
    assert parse_descriptor("ReplaceIndex(a, x, 1)").parts == (
        ReplaceIndexOf(NodeRef("a"), "x", 1),)


def test_node_names_dims_and_map_nodes():
    d = parse_descriptor("Append(Sum(a, Offset(b, 1)), IfDefined(c), Switch(a, d), Const(1, 7))")
    assert d.node_names() == ["a", "b", "c", "d"]
    dims = {"a": 3, "b": 3, "c": 5, "d": 3}
    assert d.part_dims(dims.__getitem__) == [3, 5, 3, 7]
    assert d.dim(dims.__getitem__) == 18
    renamed = d.map_nodes(lambda n: n.upper())
    assert str(renamed) == "Append(Sum(A, Offset(B, 1)), IfDefined(C), Switch(A, D), Const(1, 7))"


@pytest.mark.parametrize("text", ["Sum(a, c)", "Failover(a, c)", "Switch(a, c)"])
def test_dim_mismatch_is_descriptor_error(text):
    dims = {"a": 3, "c": 5}
    with pytest.raises(DescriptorError, match="different dims"):
        parse_descriptor(text).dim(dims.__getitem__)


# ----------------------------------------------------------------------------------
# Malformed descriptors
# ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, fragments", [
    ("", ["empty"]),
    ("   ", ["empty"]),
    ("Append(a, b", ["expected )", "end of input"]),
    ("Append(a, b))", ["trailing", "')'", "column 13"]),
    ("Sum((a, b)", ["'('", "column 5"]),
    ("Foo(a)", ["unknown descriptor function", "'Foo'", "column 1"]),
    ("Append(a, Bar(b))", ["unknown descriptor function", "'Bar'", "column 11"]),
    ("Offset(a)", ["expected ,", "')'"]),
    ("Offset(a, b)", ["integer", "'b'", "column 11"]),
    ("Offset(a, 1.5)", ["integer", "'1.5'"]),
    ("Offset(a, 1, 2, 3)", ["expected )", "','"]),
    ("Round(a, 0)", ["modulus", "'0'", "column 10"]),
    ("Round(a, -2)", ["modulus", "'-2'"]),
    ("Round(a)", ["expected ,"]),
    ("ReplaceIndex(a, n, 0)", ["t or x", "'n'", "column 17"]),
    ("ReplaceIndex(a, t)", ["expected ,"]),
    ("ReplaceIndex(a, t, 0.5)", ["integer", "'0.5'"]),
    ("Scale(a, b)", ["number", "'a'"]),
    ("Const(1)", ["expected ,"]),
    ("Const(1, 0)", ["dimension", "'0'"]),
    ("Const(x, 3)", ["number", "'x'"]),
    ("Failover(a)", ["expected ,"]),
    ("Failover(a, b, c)", ["expected )", "','"]),
    ("IfDefined(a, b)", ["expected )"]),
    ("Sum(Append(a, b), c)", ["different numbers of terms"]),
    ("Switch(Sum(a, b), c)", ["Switch"]),
    ("a b", ["trailing", "'b'", "column 3"]),
    ("a,", ["trailing", "','"]),
    ("(a)", ["'('", "column 1"]),
    ("Append(a, @)", ["'@'", "column 11"]),
    ("Append()", ["')'", "column 8"]),
])
def test_malformed_descriptors_name_position_and_token(text, fragments):
    with pytest.raises(DescriptorError) as ei:
        parse_descriptor(text)
    msg = str(ei.value)
    for f in fragments:
        assert f in msg, (f, msg)


def test_unknown_node_when_names_given():
    with pytest.raises(DescriptorError) as ei:
        parse_descriptor("Append(a, Offset(zz, 1))", {"a", "b"})
    msg = str(ei.value)
    assert "unknown node 'zz'" in msg and "column 18" in msg
    # Without node names any name is accepted.
    assert str(parse_descriptor("Append(a, Offset(zz, 1))")) == "Append(a, Offset(zz, 1))"


def test_node_named_like_a_function_is_a_node():
    assert parse_descriptor("Sum", {"Sum"}).parts == (NodeRef("Sum"),)


# ----------------------------------------------------------------------------------
# Evaluation: dependencies, computability, terms
# ----------------------------------------------------------------------------------

def _idx(ts, n=0, x=0):
    return np.array([[n, t, x] for t in ts], dtype=np.int64)


def _oracle(avail: dict[str, list[tuple[int, int, int]]]):
    """available(node, indexes) from explicit sets; records every query."""
    sets = {k: set(map(tuple, v)) for k, v in avail.items()}
    calls = []

    def available(node, indexes):
        calls.append((node, np.array(indexes)))
        s = sets.get(node, set())
        return np.array([tuple(r) in s for r in np.asarray(indexes).tolist()], dtype=bool)

    available.calls = calls
    return available


def _terms_by_row(terms):
    """{row: sorted [(node, scale, (n,t,x) or value)]}"""
    out: dict[int, list] = {}
    for term in terms:
        for k, r in enumerate(term.rows.tolist()):
            what = (tuple(term.indexes[k].tolist()) if term.node is not None else term.value)
            out.setdefault(r, []).append((term.node, term.scale, what))
    return {r: sorted(v, key=repr) for r, v in out.items()}


def _avail_t(node, ts, n=0, x=0):
    return {node: [(n, t, x) for t in ts]}


def test_offset_dependencies_and_x_offset():
    d = parse_descriptor("Append(Offset(a, -2), Offset(a, 1, 3))")
    deps = d.dependencies(_idx([0, 5]))
    assert [(dp.node, dp.indexes.tolist(), dp.rows.tolist(), dp.required) for dp in deps] == [
        ("a", [[0, -2, 0], [0, 3, 0]], [0, 1], True),
        ("a", [[0, 1, 3], [0, 6, 3]], [0, 1], True)]


def test_ifdefined_uses_input_only_where_available():
    part = parse_descriptor("IfDefined(Offset(a, -1))").parts[0]
    avail = _oracle(_avail_t("a", range(0, 3)))
    comp, terms = resolve_part(part, _idx(range(0, 5)), avail)
    assert comp.tolist() == [True] * 5
    assert _terms_by_row(terms) == {1: [("a", 1.0, (0, 0, 0))], 2: [("a", 1.0, (0, 1, 0))],
                                    3: [("a", 1.0, (0, 2, 0))]}
    deps = parse_descriptor("IfDefined(Offset(a, -1))").dependencies(_idx([0]))
    assert [dp.required for dp in deps] == [False]
    # IfDefined never asks for availability when only computability is wanted.
    assert part_computable(part, _idx([0, 1]), avail).tolist() == [True, True]


def test_failover_chooses_first_where_computable():
    part = parse_descriptor("Failover(Offset(a, -1), Scale(2, b))").parts[0]
    avail = _oracle({"a": [(0, t, 0) for t in (0, 1)], "b": [(0, t, 0) for t in (0, 3)]})
    comp, terms = resolve_part(part, _idx(range(4)), avail)
    # t=0: a@-1 missing -> b@0; t=1,2: a; t=3: a@2 missing -> b@3.
    assert comp.tolist() == [True, True, True, True]
    assert _terms_by_row(terms) == {0: [("b", 2.0, (0, 0, 0))], 1: [("a", 1.0, (0, 0, 0))],
                                    2: [("a", 1.0, (0, 1, 0))], 3: [("b", 2.0, (0, 3, 0))]}
    avail2 = _oracle({"a": [(0, 0, 0)]})
    assert part_computable(part, _idx([0, 1, 5]), avail2).tolist() == [False, True, False]
    deps = parse_descriptor("Failover(a, b)").dependencies(_idx([0]))
    assert [(dp.node, dp.required) for dp in deps] == [("a", False), ("b", False)]


def test_sum_needs_both_and_terms_cover_only_computable_rows():
    part = parse_descriptor("Sum(a, Offset(b, 1))").parts[0]
    avail = _oracle({"a": [(0, t, 0) for t in range(4)], "b": [(0, t, 0) for t in (1, 2)]})
    comp, terms = resolve_part(part, _idx(range(4)), avail)
    assert comp.tolist() == [True, True, False, False]
    assert _terms_by_row(terms) == {
        0: [("a", 1.0, (0, 0, 0)), ("b", 1.0, (0, 1, 0))],
        1: [("a", 1.0, (0, 1, 0)), ("b", 1.0, (0, 2, 0))]}
    assert part_computable(part, _idx(range(4)), avail).tolist() == [True, True, False, False]
    deps = parse_descriptor("Sum(a, Offset(b, 1))").dependencies(_idx([0]))
    assert [(dp.node, dp.indexes.tolist(), dp.required) for dp in deps] == [
        ("a", [[0, 0, 0]], True), ("b", [[0, 1, 0]], True)]


def test_sum_with_ifdefined_side():
    part = parse_descriptor("Sum(a, IfDefined(Offset(a, -1)))").parts[0]
    avail = _oracle({"a": [(0, t, 0) for t in range(3)]})
    comp, terms = resolve_part(part, _idx(range(4)), avail)
    assert comp.tolist() == [True, True, True, False]
    by_row = _terms_by_row(terms)
    assert by_row[0] == [("a", 1.0, (0, 0, 0))]
    assert by_row[2] == [("a", 1.0, (0, 1, 0)), ("a", 1.0, (0, 2, 0))]
    assert 3 not in by_row


def test_switch_picks_t_mod_n_including_negative_t():
    d = parse_descriptor("Switch(a, b, c)")
    ts = [-4, -3, -2, -1, 0, 1, 2, 3, 4, 5]
    deps = d.dependencies(_idx(ts))
    got = {}
    for dp in deps:
        for r, row in zip(dp.rows.tolist(), dp.indexes.tolist(), strict=True):
            got[ts[r]] = (dp.node, row[1])
    assert got == {t: ("abc"[t % 3], t) for t in ts}
    assert got[-1] == ("c", -1) and got[-4] == ("c", -4) and got[-3] == ("a", -3)
    avail = _oracle({"a": [(0, t, 0) for t in ts], "c": [(0, -1, 0)]})
    comp, _ = resolve_part(d.parts[0], _idx(ts), avail)
    assert [t for t, ok in zip(ts, comp.tolist(), strict=True) if ok] == [-3, -1, 0, 3]


def test_round_floors_toward_minus_infinity():
    d = parse_descriptor("Round(a, 3)")
    ts = [-7, -6, -4, -3, -2, -1, 0, 1, 2, 3, 5, 6]
    (dp,) = d.dependencies(_idx(ts))
    assert dp.indexes[:, 1].tolist() == [-9, -6, -6, -3, -3, -3, 0, 0, 0, 3, 3, 6]
    (dp,) = parse_descriptor("Round(Offset(a, 1), 2)").dependencies(_idx([-2, -1, 0]))
    assert dp.indexes[:, 1].tolist() == [-1, -1, 1]  # Round first, then Offset


def test_replace_index_t_and_x():
    (dp,) = parse_descriptor("ReplaceIndex(a, t, 0)").dependencies(
        np.array([[0, 5, 1], [2, -3, 0]]))
    assert dp.indexes.tolist() == [[0, 0, 1], [2, 0, 0]]
    (dp,) = parse_descriptor("ReplaceIndex(Offset(a, 1), x, 7)").dependencies(
        np.array([[0, 5, 1], [2, -3, 0]]))
    assert dp.indexes.tolist() == [[0, 6, 7], [2, -2, 7]]


def test_const_is_always_computable_and_has_no_dependencies():
    d = parse_descriptor("Const(0.5, 4)")
    assert d.dependencies(_idx([0, 1])) == []
    comp, terms = resolve_part(d.parts[0], _idx([0, 1]), _oracle({}))
    assert comp.tolist() == [True, True]
    assert len(terms) == 1 and terms[0].node is None and terms[0].value == 0.5
    assert terms[0].rows.tolist() == [0, 1]
    assert part_dim(d.parts[0], lambda n: 0) == 4


def test_descriptor_computable_ands_the_parts():
    d = parse_descriptor("Append(Offset(a, -1), IfDefined(b), Offset(a, 1))")
    avail = _oracle({"a": [(0, t, 0) for t in range(5)]})
    assert descriptor_computable(d, _idx(range(5)), avail).tolist() == [
        False, True, True, True, False]


def test_part_computable_is_lazy():
    part = parse_descriptor("Sum(a, b)").parts[0]
    avail = _oracle({"a": [(0, 1, 0)], "b": [(0, t, 0) for t in range(3)]})
    assert part_computable(part, _idx(range(3)), avail).tolist() == [False, True, False]
    b_calls = [idx for node, idx in avail.calls if node == "b"]
    assert len(b_calls) == 1 and b_calls[0].tolist() == [[0, 1, 0]]
    part = parse_descriptor("Failover(a, b)").parts[0]
    avail = _oracle({"a": [(0, 1, 0)], "b": [(0, t, 0) for t in range(3)]})
    assert part_computable(part, _idx(range(3)), avail).tolist() == [True, True, True]
    b_calls = [idx for node, idx in avail.calls if node == "b"]
    assert len(b_calls) == 1 and b_calls[0][:, 1].tolist() == [0, 2]


def test_empty_batch():
    d = parse_descriptor("Append(Sum(a, b), IfDefined(c), Const(1, 2))")
    empty = np.zeros((0, 3), dtype=np.int64)
    assert descriptor_computable(d, empty, _oracle({})).tolist() == []
    for p in d.parts:
        comp, terms = resolve_part(p, empty, _oracle({}))
        assert comp.tolist() == []
        assert all(len(t.rows) == 0 for t in terms)


# ----------------------------------------------------------------------------------
# Property tests on random normal-form descriptors
# ----------------------------------------------------------------------------------

NODES = ["a", "b", "c", "tdnn1.affine", "lstm-c_t"]
# Values as the parser stores them (float32) with <= 7 significant digits, so that
# printing them with Kaldi's precision 7 reads back to the same float.
_nice_floats = st.sampled_from([0.5, 2.0, -1.0, 0.25, 1.5, -0.125, 3.0, 1e-05, 0.4, 0.1, 0.0,
                                -7.25e-3, 123456.0]).map(lambda v: float(np.float32(v)))


def _forwarding(depth: int):
    leaf = st.builds(NodeRef, st.sampled_from(NODES),
                     st.one_of(st.just(1.0), _nice_floats.filter(lambda s: s != 1.0)))
    if depth == 0:
        return leaf
    sub = _forwarding(depth - 1)
    offset = st.builds(OffsetOf, sub.filter(lambda e: not isinstance(e, OffsetOf)),
                       st.integers(-5, 5), st.integers(-2, 2)).filter(
        lambda e: (e.t_offset, e.x_offset) != (0, 0))
    return st.one_of(
        leaf, offset,
        st.builds(RoundOf, sub, st.integers(1, 4)),
        st.builds(ReplaceIndexOf, sub, st.sampled_from(["t", "x"]), st.integers(-3, 3)),
        st.builds(SwitchOf, st.lists(sub, min_size=1, max_size=3).map(tuple)),
    )


def _sum_expr(depth: int):
    fwd = _forwarding(2)
    if depth == 0:
        return st.one_of(fwd, st.builds(ConstOf, _nice_floats, st.integers(1, 9)))
    sub = _sum_expr(depth - 1)
    return st.one_of(fwd, st.builds(SumOf, sub, sub), st.builds(FailoverOf, sub, sub),
                     st.builds(IfDefinedOf, sub), st.builds(ConstOf, _nice_floats,
                                                            st.integers(1, 9)))


descriptors = st.lists(_sum_expr(2), min_size=1, max_size=4).map(
    lambda parts: Descriptor(tuple(parts)))


@given(descriptors)
@settings(max_examples=400, deadline=None)
def test_parse_of_str_is_identity(d):
    text = str(d)
    assert parse_descriptor(text, set(NODES)) == d
    assert str(parse_descriptor(text)) == text


@given(descriptors, st.integers(0, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_evaluation_invariants(d, seed):
    """computability from resolve_part == part_computable == descriptor_computable;
    terms only on computable rows, only on available cindexes, and only on
    cindexes that dependencies() lists."""
    rng = np.random.default_rng(seed)
    idx = np.stack([rng.integers(0, 2, 12), rng.integers(-6, 7, 12), rng.integers(-1, 2, 12)],
                   axis=1).astype(np.int64)

    def available(node, indexes):
        indexes = np.asarray(indexes)
        h = (pack(indexes) * 2654435761 + sum(node.encode()) + seed) % 7
        return h < 4

    total = np.ones(len(idx), dtype=bool)
    for part in d.parts:
        comp, terms = resolve_part(part, idx, available)
        assert np.array_equal(comp, part_computable(part, idx, available))
        total &= comp
        for term in terms:
            assert comp[term.rows].all()
            if term.node is not None:
                assert available(term.node, term.indexes).all()
    assert np.array_equal(total, descriptor_computable(d, idx, available))
    dep_keys = {(dp.node, r, tuple(i)) for dp in d.dependencies(idx)
                for r, i in zip(dp.rows.tolist(), dp.indexes.tolist(), strict=True)}
    for part in d.parts:
        _, terms = resolve_part(part, idx, available)
        for term in terms:
            if term.node is not None:
                for r, i in zip(term.rows.tolist(), term.indexes.tolist(), strict=True):
                    assert (term.node, r, tuple(i)) in dep_keys


def test_time_terms():
    """Every node term with the time offset it is read at and whether it is optional
    (inside IfDefined or Failover); under ReplaceIndex of t, an absolute time (None)."""
    from pynnet3.descriptor import parse_descriptor

    d = parse_descriptor("Append(Offset(a, -2), Sum(b, Offset(Round(c, 3), 4)), "
                         "IfDefined(Offset(r, -3)), Failover(Offset(d, 1), e), "
                         "ReplaceIndex(Offset(iv, 5), t, 0), Offset(Switch(f, g), 2))")
    assert d.time_terms() == [("a", -2, False), ("b", 0, False), ("c", 4, False),
                              ("r", -3, True), ("d", 1, True), ("e", 0, True),
                              ("iv", None, False), ("f", 2, False), ("g", 2, False)]
