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
    #: input where they are, instead of from a matrix they are first copied into, and
    #: its backprop adds its input derivative's blocks where they belong instead of
    #: into a spliced derivative matrix (bit-identical forward values, derivatives to
    #: float rounding; optimize/splice.py)
    splice_free_affine: bool = True
    #: forward-only: compute the values behind an output gathered into another row
    #: order (batched decoding's n-major outputs) in the output's order, so that the
    #: gathers filling them take permuted tables and the output's gather goes away
    #: (optimize/permute.py)
    hoist_output_permutations: bool = True
    #: a gather repeated with the same source rows and table (two layers reading one
    #: descriptor) becomes an assignment from the first, which merging then removes
    #: (optimize/gathers.py)
    share_identical_gathers: bool = True
    #: training: free cheap forward values (BatchNorm, NoOp, fixed scales... outputs
    #: whose input stays alive) between the passes and recompute them, bit for bit,
    #: just before the backward pass reads them, where that lowers the peak memory
    #: (optimize/recompute.py; the network optimizer's "memory" pass)
    recompute_cheap_values: bool = False

    @classmethod
    def help(cls, name: str) -> str:
        """One line saying what option ``name`` does (the command line's help)."""
        return OPTION_HELP[name]

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


#: What each option does, in one line (``pynnet3 show-computation --help`` shows these).
OPTION_HELP = {
    "optimize": "run the optimizer at all (false: every other option is ignored)",
    "consolidate_model_update": "merge the model updates of a component's backprops into "
                                "one command (recurrent networks)",
    "propagate_in_place": "let components that can work in place write over their input",
    "backprop_in_place": "let components that can backprop in place write over the output "
                         "derivative",
    "optimize_row_ops": "replace row gathers and scatters by simpler commands where the "
                        "rows allow it",
    "split_row_ops": "split a multi-source row copy or addition into at most two simpler "
                     "commands",
    "extend_matrices": "let a spliced copy take all of its source, growing the target by "
                       "a few rows, so variable merging can remove it (TDNNs)",
    "convert_addition": "turn an addition into a plain copy where the target holds nothing yet",
    "remove_assignments": "merge variables joined only by a copy, removing the copy",
    "allow_left_merge": "let remove-assignments merge a copy's source into its target",
    "allow_right_merge": "let remove-assignments merge a copy's target into its source",
    "initialize_undefined": "drop the zeroing of matrices that are wholly written before "
                            "being read",
    "move_sizing_commands": "allocate matrices as late and free them as early as possible",
    "allocate_from_other": "reuse the memory of a freed matrix of the same size instead of "
                           "allocating anew",
    "min_deriv_time": "compute no derivatives for times t below this (recurrent training)",
    "max_deriv_time": "compute no derivatives for times t above this (recurrent training)",
    "max_deriv_time_relative": "max-deriv-time as an offset from the largest output t of "
                               "the request",
    "snip_row_ops": "shrink row operations whose first or last rows do nothing",
    "memory_compression_level": "training only: 0 no compression, 1 keep only the sign of "
                                "ReLU outputs between the passes (exact), 2 also store "
                                "others as int16 (approximate)",
    "optimize_looped_computation": "turn a multi-chunk computation into a loop (looped, "
                                   "online decoding)",
    "allocate_from_other_peak_aware": "make allocate-from-other never raise the peak memory "
                                      "(beyond Kaldi)",
    "remove_needless_noops": "drop no-op commands nothing needs (beyond Kaldi)",
    "free_provided_outputs": "free an output matrix as soon as it is handed over (beyond Kaldi)",
    "remove_dead_input_derivatives": "drop input-derivative matrices nothing reads "
                                     "(beyond Kaldi)",
    "splice_free_affine": "let affine components read their spliced input, and add their "
                          "input derivative, in place instead of through a spliced copy "
                          "(beyond Kaldi)",
    "hoist_output_permutations": "forward-only: compute what an output reorders in the "
                                 "output's row order, so its final gather goes away "
                                 "(beyond Kaldi)",
    "share_identical_gathers": "make a repeated gather of the same rows an assignment "
                               "from the first (beyond Kaldi)",
    "recompute_cheap_values": "training: free cheap forward values (BatchNorm, NoOp, "
                              "scales) between the passes and recompute them exactly in "
                              "the backward pass, where that lowers the peak memory "
                              "(beyond Kaldi)",
}
