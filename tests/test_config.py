"""pynnet3.config: Kaldi config lines (ConfigLine::ParseLine semantics)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pynnet3.config import ConfigLine, is_valid_name, split_config_lines
from pynnet3.errors import ConfigError

from .reference import require_reference


def test_simple_key_values():
    cl = ConfigLine("component name=affine1 type=AffineComponent input-dim=10 output-dim=5")
    assert cl.first == "component"
    assert cl.values == {"name": "affine1", "type": "AffineComponent", "input-dim": "10",
                         "output-dim": "5"}


def test_descriptor_values_with_spaces():
    cl = ConfigLine("component-node name=x component=c input=Append(Offset(in, -1), in, "
                    "Offset(in, 1))   ")
    assert cl.values["input"] == "Append(Offset(in, -1), in, Offset(in, 1))"
    cl = ConfigLine("output-node name=o input=Sum(a, Scale(0.5, b)) objective=quadratic")
    assert cl.values == {"name": "o", "input": "Sum(a, Scale(0.5, b))",
                         "objective": "quadratic"}


def test_tabs_and_extra_whitespace():
    cl = ConfigLine("  input-node\tname=in \t dim=40\t")
    assert cl.first == "input-node"
    assert cl.values == {"name": "in", "dim": "40"}


@pytest.mark.parametrize("quote", ["'", '"'])
def test_quoted_values_keep_spaces_and_equals_and_drop_quotes(quote):
    q = quote
    cl = ConfigLine(f"component name=comp type=CompositeComponent num-components=2 "
                    f"component1={q}type=AffineComponent input-dim=6 output-dim=8{q} "
                    f"component2={q}type=RectifiedLinearComponent  dim=8{q}")
    assert cl.values["component1"] == "type=AffineComponent input-dim=6 output-dim=8"
    assert cl.values["component2"] == "type=RectifiedLinearComponent  dim=8"
    assert cl.values["num-components"] == "2"
    assert set(cl.values) == {"name", "type", "num-components", "component1", "component2"}


def test_quotes_of_the_other_kind_inside_and_value_after_quote():
    cl = ConfigLine("""x a="it's here" b='say "hi"' c=3""")
    assert cl.values == {"a": "it's here", "b": 'say "hi"', "c": "3"}
    cl = ConfigLine("x a='' b=1")
    assert cl.values == {"a": "", "b": "1"}


def test_unterminated_quote_is_an_error():
    with pytest.raises(ConfigError, match="no matching"):
        ConfigLine("x a='foo bar b=1", line_number=7)


def test_reference_composite_line_parses():
    path = require_reference() / "components" / "Composite_1" / "nnet.config"
    lines = split_config_lines(path.read_text(), str(path))
    comp = next(cl for cl in lines if cl.values.get("type") == "CompositeComponent")
    n = int(comp.values["num-components"])
    for i in range(1, n + 1):
        nested = comp.values[f"component{i}"]
        assert nested.startswith("type=") and "'" not in nested and '"' not in nested


def test_comments_are_dropped():
    cl = ConfigLine("input-node name=in dim=3  # the input; dim=4 ignored")
    assert cl.values == {"name": "in", "dim": "3"}
    lines = split_config_lines("# header\n\n   \ninput-node name=a dim=2 # c\n# x\n"
                               "output-node name=o input=a\n")
    assert [cl.first for cl in lines] == ["input-node", "output-node"]
    assert [cl.line_number for cl in lines] == [4, 6]


def test_duplicate_key_warning_names_it_the_file_and_the_line():
    with pytest.warns(UserWarning) as record:
        line = ConfigLine("input-node name=a dim=2 dim=3", line_number=5, source="my.config")
    msg = str(record[0].message)
    assert "'dim'" in msg and "line 5" in msg and "my.config" in msg
    assert line.get_int("dim") == 2


@pytest.mark.parametrize("text, what", [
    ("", "empty"),
    ("   # only a comment", "empty"),
    ("name=a dim=3", "start with a word"),
    ("input-node garbage dim=3", "garbage"),
    ("input-node name=a =3", "=3"),
    ("input-node name=a b/c=3", "b/c"),
])
def test_malformed_lines(text, what):
    with pytest.raises(ConfigError) as ei:
        ConfigLine(text, line_number=2)
    if what:
        assert what in str(ei.value)


def test_trailing_word_without_equals_joins_previous_value_like_kaldi():
    # Kaldi: a value runs up to the last whitespace before the next '=', so with no
    # later '=' the trailing words belong to the value.
    cl = ConfigLine("input-node name=a junk")
    assert cl.values == {"name": "a junk"}


def test_getters_convert_and_mark_used():
    cl = ConfigLine("c i=3 f=0.5 b=true b2=F l=1,2,3 fl=1.5:2 v=1,2 s=hello")
    assert cl.get_int("i") == 3
    assert cl.get_float("f") == 0.5
    assert cl.get_bool("b") is True
    assert cl.get_bool("b2") is False
    assert cl.get_int_list("l") == [1, 2, 3]
    assert cl.get_float_list("fl") == [1.5, 2.0]
    assert np.array_equal(cl.get_vector("v"), np.array([1, 2], dtype=np.float32))
    assert cl.unused() == ["s"]
    with pytest.raises(ConfigError, match="s="):
        cl.check_all_used()
    assert cl.get_str("s") == "hello"
    cl.check_all_used()


def test_getter_defaults_and_required():
    cl = ConfigLine("c a=1", line_number=9)
    assert cl.get_int("missing", 7) == 7
    assert cl.get_str("missing") is None
    assert cl.get_bool("missing", False) is False
    assert cl.get_int_list("missing", [4]) == [4]
    with pytest.raises(ConfigError, match=r"missing required option dim=") as ei:
        cl.get_int("dim", required=True)
    assert "line 9" in str(ei.value)


@pytest.mark.parametrize("getter, value", [
    ("get_int", "3.5"), ("get_int", "x"), ("get_int", ""),
    ("get_float", "abc"), ("get_bool", "maybe"), ("get_bool", "2"),
    ("get_int_list", "1,b,3"), ("get_float_list", "1,,x"),
])
def test_getter_errors_name_the_option_and_value(getter, value):
    cl = ConfigLine(f"c myopt={value}", line_number=3, source="f.config")
    with pytest.raises(ConfigError) as ei:
        getattr(cl, getter)("myopt")
    msg = str(ei.value)
    assert "myopt=" in msg and "line 3" in msg and "f.config" in msg


def test_is_valid_name():
    for good in ("a", "_a", "tdnn1.affine", "lstm-c_t", "A9"):
        assert is_valid_name(good)
    for bad in ("", "1a", "a b", "a(b)", "-a", "a=b", "a#"):
        assert not is_valid_name(bad)


def test_a_repeated_key_keeps_the_first_value_as_kaldi_does():
    """Kaldi's ParseLine inserts into a std::map, which keeps the first value; its own
    xconfig output-layer with bottleneck-dim writes max-change twice."""
    with pytest.warns(UserWarning, match=r"line 7: option 'max-change' given twice; "
                                         r"the first value '0.75'"):
        line = ConfigLine("component name=a max-change=0.75 max-change=1.5", 7)
    assert line.get_float("max-change") == 0.75
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same value again: nothing to say
        assert ConfigLine("a x=1 x=1").get_int("x") == 1
