"""Descriptor algebra: substitution in canonical form, reference analysis, Sum-term
merging and scaling. Expected forms are worked out by hand from the index maps
(an Offset of k maps t to t+k; a consumer's chain applies first, then the
substituted descriptor's)."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.descriptor import NodeRef, parse_descriptor
from pynnet3.rewrite import SubstitutionError, references, substitute
from pynnet3.rewrite.algebra import (
    Reference,
    merge_sum_terms,
    offsets_of_single_node,
    part_is_linear_in,
    part_scale_sum,
    scaled,
)


def P(text: str):
    return parse_descriptor(text)


def sub(desc: str, node: str, replacement: str) -> str:
    return str(substitute(P(desc), node, P(replacement)))


@pytest.mark.parametrize("desc,replacement,want", [
    # offsets compose: t -> t+1 -> (t+1)+2
    ("Offset(x, 1)", "Offset(y, 2)", "Offset(y, 3)"),
    ("Offset(x, 2)", "Offset(y, -2)", "y"),
    ("Offset(x, 1, 1)", "Offset(y, 0, 2)", "Offset(y, 1, 3)"),
    # every reference is replaced
    ("Append(Offset(x, -1), x, Offset(x, 1))", "Offset(y, 2)",
     "Append(Offset(y, 1), Offset(y, 2), Offset(y, 3))"),
    # scales multiply
    ("Scale(2, x)", "Scale(3, y)", "Scale(6, y)"),
    ("Scale(0.5, Offset(x, 1))", "Scale(-4, y)", "Offset(Scale(-2, y), 1)"),
    # offsets and scales go below Sum / IfDefined / Failover
    ("Offset(x, -1)", "Sum(a, b)", "Sum(Offset(a, -1), Offset(b, -1))"),
    ("Offset(x, 1)", "IfDefined(Offset(y, -1))", "IfDefined(y)"),
    ("Scale(2, x)", "Sum(a, IfDefined(b))", "Sum(Scale(2, a), IfDefined(Scale(2, b)))"),
    ("Offset(x, 3)", "Failover(a, b)", "Failover(Offset(a, 3), Offset(b, 3))"),
    ("IfDefined(Offset(x, -1))", "Sum(a, b)", "IfDefined(Sum(Offset(a, -1), Offset(b, -1)))"),
    # an Append replacement becomes several parts (only at the top)
    ("Append(z, Offset(x, 1))", "Append(a, b)", "Append(z, Offset(a, 1), Offset(b, 1))"),
    ("Scale(2, x)", "Append(a, Offset(b, 1))", "Append(Scale(2, a), Offset(Scale(2, b), 1))"),
    # the consumer's chain maps first (in Kaldi's text the outer function maps the
    # index first): Round(x, 3) with x := Offset(y, 1) reads y at round(t) + 1
    ("Round(x, 3)", "Offset(y, 1)", "Round(Offset(y, 1), 3)"),
    ("Offset(x, 1)", "Round(y, 3)", "Offset(Round(y, 3), 1)"),
    ("ReplaceIndex(x, t, 0)", "Offset(y, -2)", "ReplaceIndex(Offset(y, -2), t, 0)"),
    # untouched when the node is not read
    ("Sum(a, Offset(b, 1))", "Offset(y, 2)", "Sum(a, Offset(b, 1))"),
])
def test_substitute(desc, replacement, want):
    assert sub(desc, "x", replacement) == want


@pytest.mark.parametrize("desc,replacement,mapping", [
    # t -> round(t) -> +1
    ("Round(x, 3)", "Offset(y, 1)", {4: 4, 5: 4, 6: 7, -1: -2}),
    # t -> t+1 -> round
    ("Offset(x, 1)", "Round(y, 3)", {4: 3, 5: 6, 6: 6, -1: 0}),
    ("Offset(x, -1)", "Offset(y, 3)", {0: 2, 4: 6}),
])
def test_substitute_semantics(desc, replacement, mapping):
    """The composed descriptor reads y where the consumer, reading x at its own map,
    would read x's input: worked out by hand per output time."""
    got = substitute(P(desc), "x", P(replacement))
    ts = sorted(mapping)
    deps = got.dependencies(np.array([[0, t, 0] for t in ts]))
    assert [d.node for d in deps] == ["y"]
    rows, idx = np.asarray(deps[0].rows), np.asarray(deps[0].indexes)
    assert {ts[int(r)]: int(i[1]) for r, i in zip(rows, idx, strict=True)} == mapping


@pytest.mark.parametrize("desc,replacement,words", [
    ("Sum(x, z)", "Append(a, b)", "Sum"),
    ("Sum(Offset(x, 1), z)", "Append(a, b)", "Sum"),
    ("Failover(x, z)", "Append(a, b)", "Failover"),
    ("Switch(x, z)", "Sum(a, b)", "Switch"),
    ("Switch(x, z)", "IfDefined(a)", "Switch"),
])
def test_substitution_without_canonical_form(desc, replacement, words):
    with pytest.raises(SubstitutionError) as e:
        substitute(P(desc), "x", P(replacement))
    msg = str(e.value)
    assert words in msg and "x :=" in msg, msg


def test_references():
    refs = references(P("Append(Offset(x, -1), Sum(Scale(0.5, y), IfDefined(Offset(x, 2, 1))))"))
    assert refs == [
        Reference("x", 0, 1.0, -1, 0, ("Offset",)),
        Reference("y", 1, 0.5, 0, 0, ("Sum",)),
        Reference("x", 1, 1.0, 2, 1, ("Sum", "IfDefined", "Offset")),
    ]
    assert [r.is_offset_chain for r in refs] == [True, False, False]
    assert references(P("Round(Offset(x, 1), 2)"))[0].wrappers == ("Round", "Offset")


def test_part_linearity():
    part = P("Sum(Scale(2, x), Offset(Scale(-0.5, x), 1))").parts[0]
    assert part_is_linear_in(part, "x") and not part_is_linear_in(part, "y")
    assert part_scale_sum(part) == pytest.approx(1.5)
    assert part_is_linear_in(P("Round(Offset(x, 1), 2)").parts[0], "x")
    for text in ("Sum(x, y)", "IfDefined(x)", "Failover(x, y)", "Switch(x, x)",
                 "Sum(x, Const(1, 4))"):
        assert not part_is_linear_in(P(text).parts[0], "x"), text


def test_offsets_of_single_node():
    assert offsets_of_single_node(P("Append(Offset(x, -1), x, Offset(x, 1))")) == \
        ("x", [-1, 0, 1])
    assert offsets_of_single_node(P("x")) == ("x", [0])
    for text in ("Append(x, y)", "Scale(2, x)", "Offset(x, 0, 1)", "IfDefined(x)",
                 "Sum(x, x)"):
        assert offsets_of_single_node(P(text)) is None, text


def test_merge_sum_terms():
    def merged(text: str) -> str:
        from pynnet3.descriptor import Descriptor
        from pynnet3.rewrite.algebra import reparse
        return str(reparse(Descriptor((merge_sum_terms(P(text).parts[0]),))))

    assert merge_sum_terms(P("Sum(Scale(2, x), Scale(3, x))").parts[0]) == NodeRef("x", 5.0)
    assert merged("Sum(Offset(x, 1), Sum(y, Offset(x, 1)))") == \
        "Sum(Offset(Scale(2, x), 1), y)"
    assert merged("Sum(x, Scale(-1, x))") == "Scale(0, x)"
    assert merged("Sum(x, Sum(Scale(-0.5, x), Offset(x, 1)))") == \
        "Sum(Scale(0.5, x), Offset(x, 1))"
    # different chains, and terms that choose by availability, are not merged
    for text in ("Sum(x, Offset(x, 1))", "Sum(IfDefined(x), IfDefined(x))", "Sum(x, y)",
                 "Offset(x, 1)"):
        part = P(text).parts[0]
        assert merge_sum_terms(part) is part, text


def test_scaled():
    d = P("Append(a, Offset(b, 1))")
    assert scaled(d, 1.0) is d
    assert str(scaled(d, 0.5)) == "Append(Scale(0.5, a), Offset(Scale(0.5, b), 1))"
    assert str(scaled(P("Scale(4, a)"), 0.25)) == "a"
    assert str(scaled(P("Sum(a, IfDefined(b))"), -1.0)) == \
        "Sum(Scale(-1, a), IfDefined(Scale(-1, b)))"


def test_references_are_found_once_per_descriptor_and_handed_out_as_new_lists():
    d = parse_descriptor("Append(Offset(a, -1), Sum(b, Scale(2, a)))")
    first = references(d)
    first.append("not a reference")  # (a caller's list: the next call is unaffected)
    again = references(d)
    assert again == first[:-1] and again is not first
    assert [r.node for r in again] == ["a", "b", "a"]
    assert references(parse_descriptor("Append(Offset(a, -1), Sum(b, Scale(2, a)))")) == again
