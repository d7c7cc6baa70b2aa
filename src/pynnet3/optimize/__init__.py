"""Command-level optimization of an NnetComputation (Kaldi's nnet-optimize)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OptimizeOptions:
    """One field per Kaldi ``NnetOptimizeOptions`` option, with Kaldi's defaults."""

    optimize: bool = True
    consolidate_model_update: bool = True
    propagate_in_place: bool = True
    backprop_in_place: bool = True
    optimize_row_ops: bool = True
    split_row_ops: bool = True
    extend_matrices: bool = True
    convert_addition: bool = True
    remove_assignments: bool = True
    allow_left_merge: bool = True
    allow_right_merge: bool = True
    initialize_undefined: bool = True
    move_sizing_commands: bool = True
    allocate_from_other: bool = True
    min_deriv_time: int | None = None
    max_deriv_time: int | None = None
    max_deriv_time_relative: int | None = None
    snip_row_ops: bool = True
    memory_compression_level: int = 1
    optimize_looped_computation: bool = False


def optimize(computation, nnet, options: OptimizeOptions):
    """Run the enabled passes. No passes exist yet: the computation is returned as is."""
    return computation
