"""Configs: integers are range-checked where they are parsed and sizes are checked
against pynnet3.limits before anything is allocated; each failure is a ConfigError
naming the line. Cases marked "fuzz" are findings of pynnet3.testing.fuzz."""

from __future__ import annotations

import tracemalloc

import pytest

from pynnet3 import Nnet, limits
from pynnet3.config import ConfigLine
from pynnet3.errors import ConfigError, GraphError

FF = """input-node name=input dim=4
component name=a type=AffineComponent input-dim=4 output-dim=3
component-node name=a component=a input=input
output-node name=output input=a
"""


def _reject(text: str, *fragments: str, error=ConfigError) -> str:
    """The message of the error ``text`` raises; it must be fast and small (checked
    before allocating)."""
    tracemalloc.start()
    try:
        with pytest.raises(error) as ei:
            Nnet.from_config(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20, peak
    msg = str(ei.value)
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


@pytest.mark.parametrize("value", ["2147483648", "9223372036854775808", "1" + "0" * 30,
                                   "-2147483649"])
def test_integers_beyond_int32(value):  # fuzz: OverflowError / TypeError (sqrt of a huge int)
    _reject(FF.replace("output-dim=3", f"output-dim={value}"), "line 2", "output-dim",
            "int32")


def test_integer_lists_beyond_int32():  # fuzz: OverflowError when writing the model
    _reject("component name=t type=TdnnComponent input-dim=2 output-dim=2 "
            "time-offsets=-5,4294967296\n", "line 1", "time-offsets = 4294967296 is out of the "
            "int32 range")


def test_dimension_blow_up_names_the_limit():  # fuzz: MemoryError (a 2^31-wide matrix)
    msg = _reject(FF.replace("output-dim=3", "output-dim=1073741824"), "line 2",
                  "output-dim = 1073741824 exceeds the limit max_dim", "PYNNET3_MAX_DIM")
    assert "component name=a" in msg  # the line itself


def test_parameter_count_is_checked_before_drawing():  # fuzz: MemoryError (dims each legal)
    text = FF.replace("input-dim=4", "input-dim=1048576").replace(
        "output-dim=3", "output-dim=1048576").replace("dim=4", "dim=1048576")
    _reject(text, "line 2", "initial parameter values (shape 1048576x1048576)", "max_params")
    with limits.override(max_params=11):  # 3x4 = 12 values
        _reject(FF, "line 2", "shape 3x4) = 12 exceeds the limit max_params = 11")
    with limits.override(max_params=12):
        Nnet.from_config(FF)


@pytest.mark.parametrize("line", [
    "component name=s type=StatisticsExtractionComponent input-dim=4 input-period=1 "
    "output-period=100000000",  # fuzz: a 384 GiB allocation inside compilation
    "component name=s type=StatisticsPoolingComponent input-dim=5 input-period=1 "
    "left-context=100000000 right-context=0",
    "component name=s type=TdnnComponent input-dim=4 output-dim=4 "
    "time-offsets=-1,100000000",
    "component name=s type=NoOpComponent dim=100000000",
])
def test_periods_contexts_and_dims_are_limited(line):
    _reject(line + "\n", "line 1", "exceeds the limit")


def test_int_list_length_is_limited():
    with limits.override(max_dim=3):
        _reject("component name=t type=TdnnComponent input-dim=2 output-dim=2 "
                "time-offsets=-1,0,1,2\n", "number of values in time-offsets= = 4")


def test_config_line_getters():
    cl = ConfigLine("component name=x dim=12 time-offsets=-3,0,3 update-period=2147483647")
    assert cl.get_int("dim") == 12 and cl.get_int_list("time-offsets") == [-3, 0, 3]
    assert cl.get_int("update-period") == 2**31 - 1  # no limit, int32 is enough
    with limits.override(max_dim=11):
        with pytest.raises(ConfigError, match="dim = 12 exceeds the limit max_dim = 11"):
            cl.get_int("dim")


@pytest.mark.parametrize("text", ["", "\n\n", "# a comment\n   # another\n"])
def test_empty_config_is_an_error(text):
    with pytest.raises(ConfigError, match="empty config"):
        Nnet.from_config(text)


def test_node_reading_a_later_node_with_an_unknown_component():  # fuzz: KeyError
    text = """input-node name=input dim=4
component name=c type=NoOpComponent dim=4
component-node name=a component=c input=b
component-node name=b component=missing input=input
output-node name=output input=a
"""
    with pytest.raises(GraphError, match="node 'b' uses unknown component 'missing'"):
        Nnet.from_config(text)


def test_modulus_is_limited_and_exact():  # LCM beyond int64 wrapped around in numpy
    text = "input-node name=input dim=1\noutput-node name=output input=Append({})\n"
    moduli = [1021, 1019, 1013, 1009, 997, 991, 983]  # LCM ~ 1e21 > 2**63
    with limits.override(max_modulus=2**70):
        assert Nnet.from_config(text.format(", ".join(f"Round(input, {m})" for m in moduli)),
                                ).modulus() == 1021 * 1019 * 1013 * 1009 * 997 * 991 * 983
    with pytest.raises(GraphError, match="modulus .* = 1040399 exceeds the limit "
                                         "max_modulus = 1024"):
        Nnet.from_config(text.format("Round(input, 1021), Round(input, 1019)"))
    nnet = Nnet.from_config(text.format("Round(input, 6), Round(input, 4)"))
    assert nnet.modulus() == 12
