"""DistributeComponent: splits each input row into blocks spread over the x index.

With ``num_blocks = input_dim / output_dim``, output index ``(n, t, x)`` is block
``b = x - num_blocks * floor(x / num_blocks)`` (columns ``b*output_dim ..
(b+1)*output_dim``) of input index ``(n, t, floor(x / num_blocks))``. Used to
share one set of parameters across blocks of a larger feature vector.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ComputeError
from ..index import KeySet, describe, pack
from .base import (
    Flags,
    InOutComponent,
    InputDeps,
    register,
    require,
)
from .fields import Field
from .precomputed import expect_fields, int_array, int_field, plain_indexes, same_rows
from .xp import namespace


@plain_indexes("DistributeComponent")
@dataclass
class DistributeIndexes:
    """Output row ``o`` is ``in[rows[o], offsets[o]:offsets[o] + output_dim]``."""

    rows: np.ndarray  # (rows_out,) int64
    offsets: np.ndarray  # (rows_out,) int64 column offsets (block * output_dim)
    num_input_rows: int

    # -- plain data (pynnet3.components.precomputed) -----------------------------------
    def to_data(self) -> dict:
        return {"rows": self.rows, "offsets": self.offsets,
                "num_input_rows": self.num_input_rows}

    @classmethod
    def from_data(cls, data: dict) -> DistributeIndexes:
        expect_fields(data, {"rows", "offsets", "num_input_rows"}, "DistributeIndexes")
        num_in = int_field(data, "num_input_rows")
        rows = int_array(data, "rows", (None,), 0, num_in)
        return cls(rows, int_array(data, "offsets", rows.shape, 0), num_in)

    def check_use(self, component, num_in: int | None, num_out: int) -> None:
        same_rows("DistributeIndexes input", self.num_input_rows, num_in)
        same_rows("DistributeIndexes output", len(self.rows), num_out)
        out_dim = component.output_dim
        if len(self.offsets) and (self.offsets.max() > component.input_dim - out_dim
                                  or (self.offsets % out_dim).any()):
            raise ValueError("DistributeIndexes: a column offset is not a block of the input")

    def places(self, output_dim: int) -> tuple[np.ndarray, np.ndarray]:
        """``(rows [rows_out, 1], columns [rows_out, output_dim])``: the input element
        of every output element, as a 2-D index pair. Host tables made once per
        object and output dim (``xp.index`` keeps one device copy of each)."""
        cache = self.__dict__.setdefault("_places", {})
        made = cache.get(output_dim)
        if made is None:  # (racing threads compute equal values)
            made = cache[output_dim] = (np.ascontiguousarray(self.rows[:, None]),
                                        self.offsets[:, None] + np.arange(output_dim))
        return made


def _dims_problem(tag: str, output_dim: int, comp) -> str | None:
    problem = comp._problem(comp._input_dim, output_dim)
    return None if problem is None else f"invalid {comp.type_name}: {problem}"


@register
class DistributeComponent(InOutComponent):
    """Invariant: input_dim > 0, output_dim > 0, input_dim % output_dim == 0."""

    type_name = "DistributeComponent"

    def __init__(self, input_dim: int, output_dim: int):
        self._input_dim = int(input_dim)
        self._output_dim = int(output_dim)

    @staticmethod
    def _problem(input_dim: int, output_dim: int) -> str | None:
        if input_dim <= 0 or output_dim <= 0:
            return f"input-dim and output-dim must be > 0, got {input_dim}, {output_dim}"
        if input_dim % output_dim:
            return f"input-dim={input_dim} must be a multiple of output-dim={output_dim}"
        return None

    @property
    def num_blocks(self) -> int:
        return self._input_dim // self._output_dim

    def properties(self) -> Flags:
        return Flags.NONE

    # -- construction and files ----------------------------------------------------
    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None):
        input_dim = cfg.get_int("input-dim", required=True)
        output_dim = cfg.get_int("output-dim", required=True)
        cfg.check_all_used()
        problem = cls._problem(input_dim, output_dim)
        require(problem is None, cfg, f"{cls.type_name}: {problem}")
        return cls(input_dim, output_dim)

    kaldi_fields = (
        Field("<InputDim>", "_input_dim", "int"),
        Field("<OutputDim>", "_output_dim", "int", check=_dims_problem),
    )

    @classmethod
    def empty_for_read(cls) -> DistributeComponent:
        return cls(0, 0)

    # -- indexes ---------------------------------------------------------------------
    def _source(self, output_indexes) -> tuple[np.ndarray, np.ndarray]:
        """(input index, block) of each output index (floor division, so negative
        x map like Kaldi's ComputeInputIndexAndBlock)."""
        out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
        src = out.copy()
        src[:, 2] = np.floor_divide(out[:, 2], self.num_blocks)
        return src, out[:, 2] - src[:, 2] * self.num_blocks

    def input_indexes(self, output_indexes: np.ndarray) -> InputDeps:
        """Exactly one required input per output: ``(n, t, floor(x / num_blocks))``."""
        src, _ = self._source(output_indexes)
        k = len(src)
        return InputDeps(np.arange(k, dtype=np.int64), src, np.ones(k, dtype=bool))

    def precompute_indexes(self, input_indexes, output_indexes, need_backprop: bool):
        src, block = self._source(output_indexes)
        inp = np.asarray(input_indexes, dtype=np.int64).reshape(-1, 3)
        rows = KeySet.from_indexes(inp).position(pack(src))
        if np.any(rows < 0):
            raise ComputeError(f"{self.type_name}: input indexes missing for outputs "
                               f"{describe(np.asarray(output_indexes)[rows < 0])}")
        return DistributeIndexes(rows, block * self._output_dim, len(inp))

    # -- math ------------------------------------------------------------------------
    def _places(self, indexes: DistributeIndexes, like):
        xp = namespace(like)
        rows, cols = indexes.places(self._output_dim)
        return xp.index(rows, like=like), xp.index(cols, like=like)

    def propagate(self, indexes: DistributeIndexes, in_value, out_value):
        out_value[...] = in_value[self._places(indexes, in_value)]
        return None

    def backprop(self, indexes: DistributeIndexes, in_value, out_value, out_deriv, memo,
                 grad, in_deriv) -> None:
        if in_deriv is None:
            return
        # Distinct outputs map to distinct (row, block) places, so assignment is
        # exact; places no output refers to get derivative 0 (Kaldi zeroes the
        # input derivative when there are such gaps).
        if len(out_deriv) != in_deriv.shape[0] * self.num_blocks:
            in_deriv[...] = 0
        in_deriv[self._places(indexes, in_deriv)] = out_deriv


__all__ = ["DistributeComponent", "DistributeIndexes"]
