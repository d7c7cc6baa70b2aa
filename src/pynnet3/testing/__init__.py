"""Test tooling shipped with pynnet3: random networks and differential checks of
the optimizer (:mod:`pynnet3.testing.random_nets`)."""

from .random_nets import (
    LAYERS,
    Finding,
    RandomCase,
    Variant,
    case_for_seed,
    default_variants,
    random_network,
    run_differential,
)

__all__ = ["LAYERS", "Finding", "RandomCase", "Variant", "case_for_seed", "default_variants",
           "random_network", "run_differential"]
