"""Descriptor arguments are range-checked where they are parsed and nesting is
bounded, so a descriptor is a DescriptorError naming the argument, never an
OverflowError or a RecursionError. Cases marked "fuzz" are findings of
pynnet3.testing.fuzz."""

from __future__ import annotations

import pytest

from pynnet3 import Nnet, limits
from pynnet3.descriptor import MAX_DEPTH, parse_descriptor
from pynnet3.errors import DescriptorError

NAMES = {"x", "y"}


@pytest.mark.parametrize("text,fragment", [
    ("Offset(x, 9223372036854775808)", "Offset() t-offset = 9223372036854775808 exceeds"),  # fuzz
    ("Offset(x, -1" + "0" * 30 + ")", "t-offset = -1000000000000000000000000000000"),  # fuzz
    ("Offset(x, 1, 100000)", "Offset() x-offset = 100000 is outside [-8192, 8192]"),
    ("Round(x, 4294967296)", "Round() modulus = 4294967296 exceeds the limit max_modulus"),
    # fuzz (default limits): the context search tries every shift below the modulus
    ("Round(x, 9216)", "Round() modulus = 9216 exceeds the limit max_modulus = 1024"),
    ("ReplaceIndex(x, t, 100000000)", "ReplaceIndex() t value = 100000000 exceeds"),
    ("ReplaceIndex(x, x, -9000)", "ReplaceIndex() x value = -9000 is outside"),
    ("Const(0.5, 2147483648)", "Const() dimension = 2147483648 exceeds the limit max_dim"),
    ("Scale(1e39, x)", "expected a finite number"),
    ("Const(inf, 3)", "expected a number"),
])
def test_arguments_out_of_range(text, fragment):
    with pytest.raises(DescriptorError) as ei:
        parse_descriptor(text, NAMES)
    assert fragment in str(ei.value)


def test_arguments_within_limits_parse():
    d = parse_descriptor("Append(Offset(x, -1048576), Offset(y, 3, 8192), Round(x, 1024), "
                         "ReplaceIndex(x, t, 0), Const(0.5, 1048576), Scale(-3e38, y))", NAMES)
    assert str(d) == ("Append(Offset(x, -1048576), Offset(y, 3, 8192), Round(x, 1024), "
                      "ReplaceIndex(x, t, 0), Const(0.5, 1048576), Scale(-3e+38, y))")
    with limits.override(max_context=1000):
        with pytest.raises(DescriptorError, match="Offset.. t-offset = -1001 exceeds the limit "
                                                  "max_context = 1000"):
            parse_descriptor("Offset(x, -1001)", NAMES)


@pytest.mark.parametrize("fn", ["Append(", "IfDefined(", "Sum(", "Scale(2, ", "Offset("])
def test_nesting_is_bounded(fn):  # fuzz: RecursionError while parsing or printing
    tail = ", 1)" if fn == "Offset(" else ")"
    ok = fn * MAX_DEPTH + "x" + tail * MAX_DEPTH
    assert parse_descriptor(ok, NAMES) is not None
    deep = fn * 3000 + "x" + tail * 3000
    with pytest.raises(DescriptorError, match=f"nested more than {MAX_DEPTH} deep"):
        parse_descriptor(deep, NAMES)


def test_long_sums_are_bounded():  # Sum(a, b, c, ...) nests its terms
    assert parse_descriptor("Sum(" + ", ".join(["x"] * MAX_DEPTH) + ")", NAMES) is not None
    with pytest.raises(DescriptorError, match="Sum.. of 1000 terms nests more than"):
        parse_descriptor("Sum(" + ", ".join(["x"] * 1000) + ")", NAMES)
    wide = parse_descriptor("Append(" + ", ".join(["x"] * 1000) + ")", NAMES)  # flat: fine
    assert len(wide.parts) == 1000


def test_config_line_names_the_descriptor_error():
    text = ("input-node name=input dim=2\n"
            "output-node name=output input=Offset(input, 99999999999999999999)\n")
    with pytest.raises(DescriptorError, match="line 2") as ei:
        Nnet.from_config(text)
    assert "output-node name=output" in str(ei.value)
