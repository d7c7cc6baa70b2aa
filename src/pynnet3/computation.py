"""NnetComputation: the compiled program, as plain inspectable data.

* ``matrices[m]``: rows, cols and debug info (node, value/deriv, indexes). Index 0
  is reserved (no matrix).
* ``submatrices[s]``: (matrix, row offset, rows, column offset, columns). Index 0 is
  the empty submatrix, meaning "none".
* index tables referenced by commands: ``indexes`` (int row lists, -1 = none),
  ``indexes_multi`` ((k, 2) arrays of (submatrix, row), (-1, -1) = none),
  ``indexes_ranges`` ((k, 2) arrays of [begin, end) row ranges), ``indexes_blocks``
  (int64 arrays of submatrix ids: the column blocks a propagate or backprop reads as
  its input value, or those a backprop adds its input derivative's column blocks to).
* ``precomputed``: per-propagate objects from components (index 0 = None).
* ``commands``: a flat list of :class:`Command`. Commands before the first
  ``NO_OPERATION_MARKER`` are the forward pass; the rest the backward pass.

Semantics of each command type are documented on :class:`CommandType`.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .errors import PynnetError
from .index import unique_keys


class CommandType(enum.Enum):
    """Command kinds; values are Kaldi's CommandType enum names."""

    # Enum's __hash__ runs Python code on every dict/set lookup; members are
    # singletons compared by identity, so the object hash is equivalent and ~4x faster
    __hash__ = object.__hash__

    ALLOC_MATRIX = "kAllocMatrix"  # matrix allocated (contents undefined)
    DEALLOC_MATRIX = "kDeallocMatrix"
    SWAP_MATRIX = "kSwapMatrix"  # matrix takes over src_matrix's data (sizes equal)
    SET_CONST = "kSetConst"  # dst = alpha
    PROPAGATE = "kPropagate"  # with in_value == 0 and table >= 0 (beyond Kaldi): the
    # input is the column-wise concatenation of the submatrices indexes_blocks[table]
    # (in column order, each with out_value's rows, widths summing to the input dim),
    # passed to the component's ``propagate_blocks`` (optimize/splice.py)
    BACKPROP = "kBackprop"  # with model update (gradient accumulation); in_value == 0
    # and table >= 0: the input value as blocks, as for PROPAGATE (``backprop_blocks``);
    # in_deriv == 0 and deriv_table >= 0 (beyond Kaldi): column block j of the input
    # derivative is *added* to submatrix indexes_blocks[deriv_table][j] (blocks in
    # column order, each with out_deriv's rows; they may overlap one another, the
    # additions then run in block order), for components with ``deriv_blocks``
    BACKPROP_NO_MODEL_UPDATE = "kBackpropNoModelUpdate"
    MATRIX_COPY = "kMatrixCopy"  # dst = alpha * src
    MATRIX_ADD = "kMatrixAdd"  # dst += alpha * src
    COPY_ROWS = "kCopyRows"  # dst[i] = alpha * src[table[i]] (table[i] = -1: row set to 0)
    ADD_ROWS = "kAddRows"  # dst[i] += alpha * src[table[i]]
    COPY_ROWS_MULTI = "kCopyRowsMulti"  # dst[i] = alpha * sub[table[i]].row
    COPY_TO_ROWS_MULTI = "kCopyToRowsMulti"  # sub[table[i]].row = alpha * src[i]
    ADD_ROWS_MULTI = "kAddRowsMulti"
    ADD_TO_ROWS_MULTI = "kAddToRowsMulti"
    ADD_ROW_RANGES = "kAddRowRanges"  # dst[i] += alpha * sum(src[begin_i:end_i])
    COMPRESS_MATRIX = "kCompressMatrix"
    DECOMPRESS_MATRIX = "kDecompressMatrix"
    ACCEPT_INPUT = "kAcceptInput"  # dst (a whole matrix) = user input for node
    PROVIDE_OUTPUT = "kProvideOutput"  # src handed to the user for node (with
    # ``release``: a whole matrix handed over and gone afterwards, as Kaldi's
    # GetOutputDestructive; it counts as the matrix's deallocation)
    NO_OPERATION = "kNoOperation"
    NO_OPERATION_PERMANENT = "kNoOperationPermanent"
    NO_OPERATION_MARKER = "kNoOperationMarker"  # separates forward from backward
    NO_OPERATION_LABEL = "kNoOperationLabel"
    GOTO_LABEL = "kGotoLabel"


@dataclass
class Command:
    """One command. Fields that a type does not use stay at their defaults.

    ``dst``/``src``: submatrix ids; ``table``: id into the index table of the
    command's kind; ``matrix``/``src_matrix``: matrix ids (sizing commands);
    propagate/backprop use ``node`` (component-node name), ``precomputed``,
    ``in_value``, ``out_value``, ``out_deriv``, ``in_deriv`` (submatrix ids, 0 = none)
    and ``memo`` (0 = none). A propagate/backprop whose ``in_value`` is 0 and whose
    ``table`` is an id into ``indexes_blocks`` reads its input value as those
    column blocks; a backprop whose ``in_deriv`` is 0 and whose ``deriv_table`` is
    such an id adds its input derivative's column blocks to those submatrices.
    """

    type: CommandType
    dst: int = 0
    src: int = 0
    alpha: float = 1.0
    table: int = -1
    matrix: int = 0
    src_matrix: int = 0
    node: str = ""
    precomputed: int = 0
    in_value: int = 0
    out_value: int = 0
    out_deriv: int = 0
    in_deriv: int = 0
    memo: int = 0
    deriv_table: int = -1  # backprops: input-derivative blocks (see above)
    is_deriv: bool = False  # accept-input / provide-output of a derivative
    label: int = -1  # GOTO_LABEL: index of its NO_OPERATION_LABEL
    compress_kind: int = 0  # COMPRESS/DECOMPRESS_MATRIX: Kaldi's CuCompressedMatrixType
    release: bool = False  # PROVIDE_OUTPUT: the matrix is handed over (deallocated)


#: COMPRESS_MATRIX / DECOMPRESS_MATRIX kinds (``Command.compress_kind``): Kaldi's
#: CuCompressedMatrixType numbering (the runtime's codes: pynnet3.runtime.compression)
INT8, UINT8, INT16, UINT16 = 1, 2, 3, 4
_COMPRESSED_BYTES = {INT8: 1, UINT8: 1, INT16: 2, UINT16: 2}


def bytes_per_element(kind: int) -> int:
    """Storage of one compressed element (Kaldi's GetMaxMemoryUse accounting)."""
    try:
        return _COMPRESSED_BYTES[kind]
    except KeyError:
        raise PynnetError(f"unknown matrix compression kind {kind!r} "
                          f"(known: {sorted(_COMPRESSED_BYTES)})") from None


#: the Command fields that hold submatrix ids
SUBMATRIX_FIELDS = ("dst", "src", "in_value", "out_value", "out_deriv", "in_deriv")

_MULTI_TYPES = (CommandType.COPY_ROWS_MULTI, CommandType.ADD_ROWS_MULTI,
                CommandType.COPY_TO_ROWS_MULTI, CommandType.ADD_TO_ROWS_MULTI)
_BLOCK_TYPES = (CommandType.PROPAGATE, CommandType.BACKPROP,
                CommandType.BACKPROP_NO_MODEL_UPDATE)


def command_submatrices(c: NnetComputation, cmd: Command) -> list[int]:
    """Every submatrix id ``cmd`` names: its fields, then those inside its row
    table (``*_MULTI``) or block table (a block-reading propagate/backprop)."""
    out = [s for s in map(cmd.__getattribute__, SUBMATRIX_FIELDS) if s]
    if cmd.type in _MULTI_TYPES:
        subs = c.indexes_multi[cmd.table][:, 0]
        out += unique_keys(subs[subs > 0]).tolist()
    elif cmd.type in _BLOCK_TYPES:
        if cmd.table >= 0:
            out += c.indexes_blocks[cmd.table].tolist()
        if cmd.deriv_table >= 0:
            out += c.indexes_blocks[cmd.deriv_table].tolist()
    return out


@dataclass
class MatrixInfo:
    rows: int
    cols: int
    node: str = ""
    is_deriv: bool = False
    indexes: np.ndarray | None = None


class SubMatrix(NamedTuple):
    """Rows ``[row_offset, row_offset + num_rows)`` and columns ``[col_offset,
    col_offset + num_cols)`` of matrix ``matrix``. A tuple: immutable, so
    computations (and the cache's copies) share them, and cheap to make in the
    thousands (the compiler, renumbering, merging and expansion do)."""

    matrix: int
    row_offset: int
    num_rows: int
    col_offset: int
    num_cols: int


def rects_overlap(a: SubMatrix, b: SubMatrix) -> bool:
    """Whether the row/column rectangles of ``a`` and ``b`` intersect (their matrices
    not compared: the caller knows they are one)."""
    return (a.row_offset < b.row_offset + b.num_rows and b.row_offset < a.row_offset + a.num_rows
            and a.col_offset < b.col_offset + b.num_cols
            and b.col_offset < a.col_offset + a.num_cols)


_new_tuple = tuple.__new__


def make_submatrix(m: int, row_offset: int, num_rows: int, col_offset: int,
                   num_cols: int) -> SubMatrix:
    """``SubMatrix(...)`` without the Python-level ``__new__`` of a NamedTuple (the
    compiler, renumbering, merging and expansion make thousands)."""
    return _new_tuple(SubMatrix, (m, row_offset, num_rows, col_offset, num_cols))


@dataclass
class NnetComputation:
    matrices: list[MatrixInfo] = field(default_factory=lambda: [MatrixInfo(0, 0)])
    submatrices: list[SubMatrix] = field(default_factory=lambda: [SubMatrix(0, 0, 0, 0, 0)])
    indexes: list[np.ndarray] = field(default_factory=list)
    indexes_multi: list[np.ndarray] = field(default_factory=list)
    indexes_ranges: list[np.ndarray] = field(default_factory=list)
    indexes_blocks: list[np.ndarray] = field(default_factory=list)
    precomputed: list[object] = field(default_factory=lambda: [None])
    commands: list[Command] = field(default_factory=list)
    need_model_derivative: bool = False
    request: object = None
    _whole: dict = field(default_factory=dict, repr=False)

    # -- building helpers -----------------------------------------------------
    def new_matrix(self, rows: int, cols: int, node: str = "", is_deriv: bool = False,
                   indexes: np.ndarray | None = None) -> int:
        matrices, submatrices = self.matrices, self.submatrices
        m = len(matrices)
        matrices.append(MatrixInfo(rows, cols, node, is_deriv, indexes))
        self._whole[m] = len(submatrices)
        submatrices.append(make_submatrix(m, 0, rows, 0, cols))
        return m

    def whole(self, m: int) -> int:
        """The submatrix id covering all of matrix ``m``."""
        return self._whole[m]

    def is_whole(self, s: int) -> bool:
        """Whether submatrix ``s`` covers all of its matrix."""
        sm = self.submatrices[s]
        info = self.matrices[sm.matrix]
        return (sm.row_offset == 0 and sm.col_offset == 0 and sm.num_rows == info.rows
                and sm.num_cols == info.cols)

    def new_submatrix(self, m: int, row_offset: int, num_rows: int, col_offset: int,
                      num_cols: int) -> int:
        submatrices = self.submatrices
        submatrices.append(make_submatrix(m, row_offset, num_rows, col_offset, num_cols))
        return len(submatrices) - 1

    def add(self, cmd: Command) -> Command:
        self.commands.append(cmd)
        return cmd

    def copy(self) -> NnetComputation:
        """An independent copy (commands, matrices, tables) that passes may rewrite
        in place; computations handed out by a CachingCompiler share their command
        objects with the cache, so copy them before optimizing them further."""
        import copy as _copy

        return _copy.deepcopy(self)

    # -- inspection ------------------------------------------------------------
    def num_matrices(self) -> int:
        return len(self.matrices) - 1

    def peak_memory_floats(self) -> int:
        """Kaldi's GetMaxMemoryUse / 4: allocations and accepted inputs add,
        deallocations (and releasing provides) subtract; between COMPRESS_MATRIX and
        DECOMPRESS_MATRIX a matrix takes ``bytes_per_element(kind)`` bytes an element
        instead of 4; a propagate/backprop reading its input as blocks counts the
        temporary it gathers them into while it runs, and a backprop adding its
        input derivative to blocks the one it makes (``blas.column_block_temporary``).
        The accounting lives in :func:`pynnet3.analysis.memory.live_floats`."""
        from .analysis.memory import live_floats

        live, _ = live_floats(self)
        return int(live.max()) if len(live) else 0

    def gathered_floats(self, c: Command) -> int:
        """Size of the temporary a block-reading command gathers its input into."""
        blocks = self.indexes_blocks[c.table]
        subs = [self.submatrices[int(s)] for s in blocks]
        return subs[0].num_rows * sum(sm.num_cols for sm in subs)

    def stats(self) -> dict:
        hist = Counter(c.type.value for c in self.commands)
        return {
            "num_commands": len(self.commands),
            "command_types": dict(sorted(hist.items())),
            "num_matrices": self.num_matrices(),
            "num_submatrices": len(self.submatrices) - 1,
            "num_indexes": len(self.indexes),
            "num_indexes_multi": len(self.indexes_multi),
            "num_indexes_ranges": len(self.indexes_ranges),
            "num_indexes_blocks": len(self.indexes_blocks),
            "num_component_precomputed_indexes": sum(p is not None for p in self.precomputed),
            "total_matrix_floats": sum(m.rows * m.cols for m in self.matrices[1:]),
            "peak_memory_floats": self.peak_memory_floats(),
        }

    def __str__(self) -> str:
        from .compiler.printing import print_computation

        return print_computation(self)
