"""Review: TrainerOptions.from_flags against what nnet3-train registers (nnet3-train.cc,
NnetTrainerOptions::Register, NnetOptimizeOptions / CachingOptimizingCompilerOptions /
NnetComputeOptions under their prefixes, RegisterCuAllocatorOptions, ParseOptions'
own) and how Kaldi's ParseOptions reads names and booleans: NormalizeArgName reads
``_`` as ``-`` and lower-cases, ToBool takes "" (a bare ``--flag``) as true."""

from __future__ import annotations

import pytest

from pynnet3.errors import ConfigError
from pynnet3.train import TrainerOptions

# every option nnet3-train accepts, with a valid value
NNET3_TRAIN = {
    "srand": "3", "binary": "false", "use-gpu": "no",
    "store-component-stats": "false", "zero-component-stats": "false",
    "print-interval": "10", "max-param-change": "1.5", "momentum": "0.5",
    "l2-regularize-factor": "0.25", "batchnorm-stats-scale": "0.9",
    "backstitch-training-scale": "0.0", "backstitch-training-interval": "2",
    "read-cache": "c", "write-cache": "c", "binary-write-cache": "true",
    **{f"optimization.{k}": v for k, v in (
        ("optimize", "true"), ("consolidate-model-update", "true"),
        ("propagate-in-place", "true"), ("backprop-in-place", "true"),
        ("extend-matrices", "true"), ("optimize-row-ops", "true"),
        ("split-row-ops", "true"), ("convert-addition", "true"),
        ("remove-assignments", "true"), ("allow-left-merge", "true"),
        ("allow-right-merge", "true"), ("initialize-undefined", "true"),
        ("move-sizing-commands", "true"), ("allocate-from-other", "true"),
        ("min-deriv-time", "-5"), ("max-deriv-time", "5"),
        ("max-deriv-time-relative", "3"), ("snip-row-ops", "true"),
        ("memory-compression-level", "1"))},
    "compiler.use-shortcut": "true", "compiler.cache-capacity": "64",
    "computation.debug": "false",
    "cuda-memory-proportion": "0.5", "cuda-cache-memory": "true",
    "config": "x.conf", "print-args": "true", "help": "false", "verbose": "1",
}


def test_every_nnet3_train_option_is_accepted():
    o = TrainerOptions.from_flags(NNET3_TRAIN)
    assert (o.srand, o.store_component_stats, o.zero_component_stats, o.print_interval,
            o.max_param_change, o.momentum, o.l2_regularize_factor,
            o.batchnorm_stats_scale, o.backstitch_training_interval) == (
        3, False, False, 10, 1.5, 0.5, 0.25, 0.9, 2)


def test_names_are_normalized_as_kaldis_parse_options():
    o = TrainerOptions.from_flags({"--max_param_change": "0.5", "Momentum": 0.25,
                                   "--L2_Regularize_Factor": "2",
                                   "optimization.max_deriv_time": "5"})
    assert (o.max_param_change, o.momentum, o.l2_regularize_factor) == (0.5, 0.25, 2.0)


def test_a_bare_boolean_flag_is_true():
    o = TrainerOptions.from_flags({"zero-component-stats": "false",
                                   "store-component-stats": ""})
    assert o.store_component_stats and not o.zero_component_stats
    with pytest.raises(ConfigError, match="bad bool value"):
        TrainerOptions.from_flags({"store-component-stats": "yes"})
