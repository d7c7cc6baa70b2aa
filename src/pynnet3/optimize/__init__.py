"""Command-level optimization of an NnetComputation (Kaldi's nnet-optimize).

The default pipeline below mirrors the order of Kaldi's ``Optimize()``; each
entry names the module and function holding the pass and the option that
switches it. See :mod:`pynnet3.optimize.pipeline` for the pass contract.
"""

from __future__ import annotations

import importlib

from .options import OptimizeOptions
from .pipeline import (
    PIPELINE,
    KeptReferences,
    OptimizationPass,
    OptimizeReport,
    PassReport,
    register_pass,
    run_pipeline,
)


def _lazy(target: str):
    """A pass function that imports ``module:function`` on first use."""
    module, _, name = target.partition(":")

    def call(computation, nnet, options):
        fn = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        return fn(computation, nnet, options)

    call.__name__ = name
    call.__qualname__ = f"{module}.{name}"
    return call


def _deriv_limited(o: OptimizeOptions) -> bool:
    return (o.min_deriv_time is not None or o.max_deriv_time is not None
            or o.max_deriv_time_relative is not None)


_ALWAYS = "not gated on options.optimize"

_DEFAULT = [
    ("limit_derivative_times", "deriv_time:limit_derivative_times", _deriv_limited),
    ("remove_dead_input_derivatives", "dead_derivs:remove_dead_input_derivatives",
     lambda o: o.remove_dead_input_derivatives),
    ("consolidate_model_update", "model_update:consolidate_model_update",
     lambda o: o.consolidate_model_update),
    ("convert_addition", "addition:convert_addition_to_assignment",
     lambda o: o.convert_addition),
    ("snip_row_ops", "row_ops:snip_row_ops", lambda o: o.snip_row_ops),
    ("split_row_ops", "row_ops:split_row_ops", lambda o: o.split_row_ops),
    ("replace_row_with_matrix_ops", "row_ops:replace_row_with_matrix_ops",
     lambda o: o.optimize_row_ops),
    # beyond Kaldi: before extension/merging, while spliced inputs are still plain
    # matrices filled by copies
    ("splice_free_affine", "splice:splice_free_affine",
     lambda o: o.splice_free_affine and not o.optimize_looped_computation),
    # beyond Kaldi: after splice_free_affine (whose in-place reads it must not undo),
    # before merging (which removes the assignment it leaves)
    ("hoist_output_permutations", "permute:hoist_output_permutations",
     lambda o: o.hoist_output_permutations and not o.optimize_looped_computation),
    # extension makes more merges possible, so it comes first
    ("extend_matrices", "extend:extend_matrices",
     lambda o: o.extend_matrices and not o.optimize_looped_computation),
    # beyond Kaldi: the assignments it makes are for merging to remove
    ("share_identical_gathers", "gathers:share_identical_gathers",
     lambda o: o.share_identical_gathers and not o.optimize_looped_computation),
    ("variable_merging", "merging:variable_merging",
     lambda o: o.remove_assignments or o.backprop_in_place or o.propagate_in_place),
    # merging turns some row ops into ones that can be snipped or made matrix ops
    ("snip_row_ops_again", "row_ops:snip_row_ops", lambda o: o.snip_row_ops),
    ("replace_row_with_matrix_ops_again", "row_ops:replace_row_with_matrix_ops",
     lambda o: o.optimize_row_ops),
    ("remove_unnecessary_zeroing", "zeroing:remove_unnecessary_zeroing",
     lambda o: o.initialize_undefined),
    # the looped optimization needs sizing commands next to their uses
    ("move_sizing_commands", "sizing:move_sizing_commands",
     lambda o: o.move_sizing_commands or o.optimize_looped_computation, _ALWAYS),
    ("optimize_looped_computation", "looped:optimize_looped_computation",
     lambda o: o.optimize_looped_computation, _ALWAYS),
    ("allocate_from_other", "sizing:remove_unnecessary_allocation",
     lambda o: o.allocate_from_other and not o.optimize_looped_computation),
    # needed for the computation to run, whatever the options
    ("consolidate_io", "io_ops:consolidate_io_operations", lambda o: True, _ALWAYS),
    ("fix_goto_label", "looped:fix_goto_label", lambda o: o.optimize_looped_computation,
     _ALWAYS),
    ("free_provided_outputs", "outputs:free_provided_outputs",
     lambda o: o.free_provided_outputs and not o.optimize_looped_computation),
    ("remove_needless_noops", "noops:remove_needless_noops",
     lambda o: o.remove_needless_noops and not o.optimize_looped_computation),
    # beyond Kaldi: on the final command order (it measures the peak), before
    # compression (which it takes into account)
    ("recompute_cheap_values", "recompute:recompute_cheap_values",
     lambda o: o.recompute_cheap_values and not o.optimize_looped_computation),
    ("memory_compression", "compression:optimize_memory_compression",
     lambda o: o.memory_compression_level > 0 and not o.optimize_looped_computation),
]

def _available(target: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(f"{__name__}.{target.partition(':')[0]}") is not None


def _gated(enabled):
    """Kaldi gates every pass on the master switch ``optimize``."""
    return lambda o: o.optimize and enabled(o)


for _name, _target, _enabled, *_flags in _DEFAULT:
    if _available(_target):
        register_pass(_name, _lazy(_target), _enabled if _flags else _gated(_enabled))


def optimize(computation, nnet, options: OptimizeOptions | None = None, *,
             report: OptimizeReport | None = None, check: bool = False):
    """Optimize ``computation`` in place with the registered passes that
    ``options`` enables, and return it. ``report`` (an :class:`OptimizeReport`)
    is filled pass by pass; ``check`` runs the checker after every pass."""
    options = options or OptimizeOptions()
    if not options.optimize and not options.optimize_looped_computation:
        return computation
    return run_pipeline(computation, nnet, options, report=report, check=check)


__all__ = ["PIPELINE", "KeptReferences", "OptimizationPass", "OptimizeOptions", "OptimizeReport",
           "PassReport", "optimize", "register_pass", "run_pipeline"]
