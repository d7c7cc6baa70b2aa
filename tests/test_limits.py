"""pynnet3.limits: defaults, environment overrides, override(), option names."""

from __future__ import annotations

import pytest

from pynnet3 import limits
from pynnet3.limits import LIMITS, Limits, check_option, exceeded, option_limit


def test_defaults_and_environment():
    assert Limits.from_env({}) == Limits()
    got = Limits.from_env({"PYNNET3_MAX_DIM": "4194304", "PYNNET3_MAX_ROWS": "0x100"})
    assert got.max_dim == 4194304 and got.max_rows == 256
    assert got.max_params == Limits().max_params
    with pytest.raises(ValueError, match="PYNNET3_MAX_DIM"):
        Limits.from_env({"PYNNET3_MAX_DIM": "lots"})
    with pytest.raises(ValueError, match="positive"):
        Limits.from_env({"PYNNET3_MAX_CONTEXT": "-1"})


def test_override_restores_and_rejects_unknown_names():
    before = LIMITS.max_dim
    with limits.override(max_dim=7):
        assert LIMITS.max_dim == 7
        assert exceeded("max_dim", 8, "dim") is not None
        assert exceeded("max_dim", -7, "dim") is None
    assert LIMITS.max_dim == before
    with pytest.raises(AttributeError):
        with limits.override(max_width=3):
            pass
    assert LIMITS.max_dim == before


def test_message_says_what_the_limit_is_and_how_to_raise_it():
    msg = exceeded("max_context", -(2**21), "left-context")
    assert msg is not None
    for part in ("left-context = -2097152", "max_context = 1048576", "PYNNET3_MAX_CONTEXT",
                 "pynnet3.limits.LIMITS.max_context"):
        assert part in msg


@pytest.mark.parametrize("name,limit", [
    ("input-dim", "max_dim"), ("<InputDim>", "max_dim"), ("<FiltXDim>", "max_dim"),
    ("<NumFiltersIn>", "max_dim"), ("<RankInOut>", "max_dim"), ("time-offsets", "max_context"),
    ("<InputPeriod>", "max_context"), ("<NumLeftInputsRequired>", "max_context"),
    ("<NumElementsProcessed>", None), ("learning-rate", None)])
def test_option_limit(name, limit):
    assert option_limit(name) == limit


def test_check_option_int32_and_limits():
    assert check_option("update-period", 2**31 - 1) is None
    assert "int32" in check_option("update-period", 2**31)
    assert "max_dim" in check_option("dim", 2**20 + 1)
    assert check_option("dim", 2**20) is None
