"""Review of TrainerOptions (issue 18): a non-finite value is a ConfigError naming the
option, whichever way it is given (NaN used to slip past the range checks, e.g.
``--l2-regularize-factor=nan`` or ``--momentum=inf`` trained silently)."""

from __future__ import annotations

import pytest

from pynnet3.errors import ConfigError
from pynnet3.train import TrainerOptions


@pytest.mark.parametrize("flag", ["momentum", "l2-regularize-factor", "max-param-change",
                                  "backstitch-training-scale", "batchnorm-stats-scale",
                                  "learning-rate"])
@pytest.mark.parametrize("value", ["nan", "inf", float("-inf")])
def test_non_finite_option_is_a_config_error(flag, value):
    with pytest.raises(ConfigError, match=flag):
        TrainerOptions.from_flags({flag: value})


def test_non_finite_dataclass_value_is_a_config_error():
    with pytest.raises(ConfigError, match="l2-regularize-factor must be finite"):
        TrainerOptions(l2_regularize_factor=float("nan")).validate()


def test_finite_values_still_accepted():
    opts = TrainerOptions.from_flags({"momentum": "0.5", "l2-regularize-factor": "2e-3",
                                      "max-param-change": 0})
    assert (opts.momentum, opts.l2_regularize_factor, opts.max_param_change) == (0.5, 2e-3, 0)
