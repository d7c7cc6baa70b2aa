"""OptimizeOptions: the switches of the command-level optimizer (Kaldi's NnetOptimizeOptions)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class OptimizeOptions:
    """One field per Kaldi ``NnetOptimizeOptions`` option (snake_case), with Kaldi's
    defaults. Options of passes that go beyond Kaldi are added after Kaldi's and
    default to on only when they are exact rewrites."""

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
    # -- beyond Kaldi (exact rewrites) --
    #: allocate_from_other never raises the peak (Kaldi's pairing sometimes does)
    allocate_from_other_peak_aware: bool = True
    #: drop no-ops nothing needs (permanent no-ops outside looped computations, a
    #: trailing forward/backward marker of a forward-only computation)
    remove_needless_noops: bool = True
    #: deallocate an output matrix once it has been handed over (the runtime copies
    #: it out), instead of keeping it to the end as Kaldi does
    free_provided_outputs: bool = True
    #: drop input-derivative matrices that nothing reads (the first step of a
    #: recurrence fed by derivative-free inputs), and backprops left with nothing to do
    remove_dead_input_derivatives: bool = True
    #: an affine-like propagate (and backprop) reads the column blocks of its spliced
    #: input where they are, instead of from a matrix they are first copied into
    #: (bit-identical results; optimize/splice.py)
    splice_free_affine: bool = True

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def without(self, name: str) -> OptimizeOptions:
        """A copy with option ``name`` switched off (``memory_compression_level`` -> 0)."""
        from dataclasses import replace

        if name not in self.field_names():
            raise ValueError(f"unknown optimize option {name!r}")
        off = 0 if name == "memory_compression_level" else (
            None if name.endswith("deriv_time") or name == "max_deriv_time_relative" else False)
        return replace(self, **{name: off})
