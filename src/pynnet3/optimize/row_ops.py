"""Row-operation passes: Kaldi's SnipRowOps, SplitRowOps and ReplaceRowWithMatrixOps.

Each pass rewrites the computation in place and returns a description of what it
changed (see :mod:`pynnet3.optimize.pipeline`). New submatrices and index tables
are appended; the old ones are left for :func:`~pynnet3.optimize.renumber.renumber`.

Invariant kept by all three: every matrix row holds, after each rewritten command,
exactly the value it held before. The one place this needs care is a row that a
``COPY_ROWS``/``COPY_ROWS_MULTI`` table marks -1: the runtime *zeroes* such a row
(as Kaldi's ``CopyRows`` does). Kaldi never snips copies for that reason, yet
turns ``[-1, 5, 6, -1]`` copies into a plain row-range copy, relying on the
destination having been zeroed. Here a copy's -1 rows are dropped only when
:func:`_rows_known_zero` proves they already hold zero.
"""

from __future__ import annotations

import numpy as np

from ..computation import SUBMATRIX_FIELDS, Command, NnetComputation
from ..computation import CommandType as CT
from ..index import unique_keys
from .options import OptimizeOptions

_ROWS = (CT.COPY_ROWS, CT.ADD_ROWS)
_MULTI = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI)
_TO_MULTI = (CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI)
_ZEROING = (CT.COPY_ROWS, CT.COPY_ROWS_MULTI)  # -1 rows are set to zero, not skipped
_DST_WRITERS = (CT.SET_CONST, CT.MATRIX_COPY, CT.MATRIX_ADD, CT.COPY_ROWS, CT.ADD_ROWS,
                CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.ADD_ROW_RANGES, CT.ACCEPT_INPUT)
_HARMLESS = (CT.PROVIDE_OUTPUT, CT.NO_OPERATION, CT.NO_OPERATION_PERMANENT,
             CT.NO_OPERATION_MARKER, CT.DEALLOC_MATRIX, CT.ALLOC_MATRIX)
_BACKPROPS = (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)
_LOOP = (CT.NO_OPERATION_LABEL, CT.GOTO_LABEL)
_SIZING = (CT.ALLOC_MATRIX, CT.DEALLOC_MATRIX, CT.SWAP_MATRIX, CT.COMPRESS_MATRIX,
           CT.DECOMPRESS_MATRIX)
# command types as module constants (an Enum class attribute lookup costs more)
_PROPAGATE, _SET_CONST = CT.PROPAGATE, CT.SET_CONST

# Kaldi's RowOpsSplitter refuses a split whose source rows span more than this
# many times the rows moved (it would touch mostly unused memory).
_MAX_SIZE_RATIO = 2


# -- helpers ------------------------------------------------------------------------------

def _row_sub(c: NnetComputation, s: int, row0: int, nrows: int) -> int:
    """Rows [row0, row0 + nrows) of submatrix ``s`` (all its columns), as a submatrix id."""
    sm = c.submatrices[s]
    if row0 == 0 and nrows == sm.num_rows:
        return s
    return c.new_submatrix(sm.matrix, sm.row_offset + row0, nrows, sm.col_offset, sm.num_cols)


def _ends(empty: np.ndarray) -> tuple[int, int] | None:
    """(leading, trailing) counts of True in ``empty``; None when all are True."""
    keep = np.flatnonzero(~empty)
    if not len(keep):
        return None
    return int(keep[0]), int(len(empty) - 1 - keep[-1])


def _written_subs(c: NnetComputation, cmd: Command) -> list[int] | None:
    """Submatrices ``cmd`` may write; None when it cannot be said (treat as 'anything')."""
    t = cmd.type
    if t in _DST_WRITERS:
        return [cmd.dst]
    if t is _PROPAGATE:
        return [cmd.out_value]
    if t in _BACKPROPS:
        if cmd.in_deriv:
            return [cmd.in_deriv]
        if cmd.deriv_table >= 0:  # input derivative added to column blocks
            return c.indexes_blocks[cmd.deriv_table].tolist()
        return []
    if t in _TO_MULTI:
        subs = c.indexes_multi[cmd.table][:, 0]
        return unique_keys(subs[subs > 0]).tolist()
    if t in _HARMLESS:
        return []
    return None


def _rows_known_zero(c: NnetComputation, k: int, s: int, row0: int, row1: int) -> bool:
    """True when rows [row0, row1) of submatrix ``s`` certainly hold zero just before
    command ``k``: scanning back, the latest command that may write any of them is a
    ``SET_CONST 0`` covering all of them. Allocation (undefined contents), swaps,
    compression and loops make the answer False."""
    if row1 <= row0:
        return True
    sm = c.submatrices[s]
    m = sm.matrix
    r0, r1 = sm.row_offset + row0, sm.row_offset + row1
    c0, c1 = sm.col_offset, sm.col_offset + sm.num_cols
    for j in range(k - 1, -1, -1):
        cmd = c.commands[j]
        t = cmd.type
        if t in _LOOP:
            return False
        if t in _SIZING:
            # sizing/compression name a matrix (compression may name it by submatrix)
            if m in (cmd.matrix, cmd.src_matrix) or (cmd.dst and
                                                     c.submatrices[cmd.dst].matrix == m):
                return False
            continue
        written = _written_subs(c, cmd)
        if written is None:
            written = [getattr(cmd, f) for f in SUBMATRIX_FIELDS if getattr(cmd, f)]
        for w in written:
            ws = c.submatrices[w]
            if ws.matrix != m:
                continue
            wr0, wr1 = ws.row_offset, ws.row_offset + ws.num_rows
            wc0, wc1 = ws.col_offset, ws.col_offset + ws.num_cols
            if wr1 <= r0 or r1 <= wr0 or wc1 <= c0 or c1 <= wc0:
                continue  # no overlap
            return (t is _SET_CONST and cmd.alpha == 0.0 and wr0 <= r0 and r1 <= wr1
                    and wc0 <= c0 and c1 <= wc1)
    return False


def _row_field(t: CT) -> str:
    """The field holding the submatrix a command's table is indexed by (row i of the
    table is row i of it): ``src`` for the ``*_TO_ROWS_MULTI`` scatters, else ``dst``."""
    return "src" if t in _TO_MULTI else "dst"


def _table_and_empty(c: NnetComputation, cmd: Command):
    """The command's index table and which of its rows do nothing (or, for copies,
    only zero the row); None for commands without a row table."""
    t = cmd.type
    if t in _ROWS:
        tab = c.indexes[cmd.table]
        return tab, tab < 0
    if t in _MULTI:
        tab = c.indexes_multi[cmd.table]
        return tab, tab[:, 0] < 0
    if t is CT.ADD_ROW_RANGES:
        tab = c.indexes_ranges[cmd.table]
        return tab, tab[:, 0] >= tab[:, 1]
    return None


def _set_table(c: NnetComputation, cmd: Command, tab: np.ndarray) -> None:
    """Point ``cmd`` at a new table of its kind (tables may be shared: never edit one)."""
    store = (c.indexes if cmd.type in _ROWS else
             c.indexes_multi if cmd.type in _MULTI else c.indexes_ranges)
    store.append(np.ascontiguousarray(tab, dtype=np.int64))
    cmd.table = len(store) - 1


# -- SnipRowOps ------------------------------------------------------------------------------

def snip_row_ops(c: NnetComputation, nnet, options: OptimizeOptions) -> str:
    """Drop the leading/trailing rows of row operations that do nothing there.

    ``ADD_ROWS`` (-1 entries), the ``*_MULTI`` forms ((-1, -1) pairs) and
    ``ADD_ROW_RANGES`` (empty ranges) get a shorter table and a row range of the
    submatrix the table is indexed by (``dst``; ``src`` for the ``*_TO_ROWS_MULTI``
    scatters). ``COPY_ROWS``/``COPY_ROWS_MULTI`` zero their -1
    rows, so they are snipped only where those rows are known to be zero already.
    A command whose whole table is empty becomes a no-op (a zeroing copy whose
    rows are not known zero becomes ``SET_CONST 0``)."""
    snipped = removed = 0
    for k, cmd in enumerate(c.commands):
        if cmd.table < 0:
            continue  # no index table (every row op of a valid computation has one)
        found = _table_and_empty(c, cmd)
        if found is None:
            continue
        tab, empty = found
        n = len(tab)
        if n == 0 or not (empty[0] or empty[-1]):
            continue
        ends = _ends(empty)
        zeroing = cmd.type in _ZEROING
        if ends is None:
            if zeroing and not _rows_known_zero(c, k, cmd.dst, 0, n):
                c.commands[k] = Command(CT.SET_CONST, dst=cmd.dst, alpha=0.0)
            else:
                cmd.type = CT.NO_OPERATION
            removed += 1
            continue
        lead, trail = ends
        if zeroing and not (_rows_known_zero(c, k, cmd.dst, 0, lead)
                            and _rows_known_zero(c, k, cmd.dst, n - trail, n)):
            continue
        _set_table(c, cmd, tab[lead:n - trail])
        f = _row_field(cmd.type)
        setattr(cmd, f, _row_sub(c, getattr(cmd, f), lead, n - lead - trail))
        snipped += 1
    parts = []
    if snipped:
        parts.append(f"snipped {snipped} row ops")
    if removed:
        parts.append(f"removed {removed} empty row ops")
    return ", ".join(parts)


# -- SplitRowOps -------------------------------------------------------------------------------

def _split_multi(c: NnetComputation, cmd: Command) -> list[Command] | None:
    """Kaldi's SplitRowOps for one ``*_MULTI`` command: when its table is one or two
    runs, each reading a single source submatrix (no (-1, -1) pairs), the commands
    that replace it (one per run); None when it cannot be split."""
    tab = c.indexes_multi[cmd.table]
    n = len(tab)
    if n == 0:
        return None
    subs, rows = tab[:, 0], tab[:, 1]
    if (subs < 0).any() or (rows < 0).any():
        return None
    cuts = np.flatnonzero(subs[1:] != subs[:-1]) + 1
    if len(cuts) > 1:
        return None
    bounds = [0, *cuts.tolist(), n]
    t = cmd.type
    plans = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        r = rows[a:b]
        lo, hi = int(r.min()), int(r.max()) + 1
        if hi - lo > _MAX_SIZE_RATIO * (b - a):
            return None
        consecutive = bool(np.array_equal(r, r[0] + np.arange(b - a)))
        if not consecutive and t in _TO_MULTI:
            if t is CT.COPY_TO_ROWS_MULTI:
                return None  # inverted as CopyRows, the unwritten rows would be zeroed
            if len(unique_keys(r)) != len(r):
                return None  # a row added to twice cannot be one AddRows entry
        plans.append((a, b, int(subs[a]), lo, hi, consecutive, r))
    out = []
    for a, b, s, lo, hi, consecutive, r in plans:
        row_side = _row_sub(c, getattr(cmd, _row_field(t)), a, b - a)
        other = _row_sub(c, s, lo, hi - lo)
        if consecutive:
            kind = CT.MATRIX_ADD if t in (CT.ADD_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI) \
                else CT.MATRIX_COPY
            if t in _TO_MULTI:
                out.append(Command(kind, dst=other, src=row_side, alpha=cmd.alpha))
            else:
                out.append(Command(kind, dst=row_side, src=other, alpha=cmd.alpha))
        elif t in (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI):
            c.indexes.append((r - lo).astype(np.int64))
            kind = CT.COPY_ROWS if t is CT.COPY_ROWS_MULTI else CT.ADD_ROWS
            out.append(Command(kind, dst=row_side, src=other, table=len(c.indexes) - 1,
                               alpha=cmd.alpha))
        else:  # ADD_TO_ROWS_MULTI: other[r[i] - lo] += row_side[i]  ->  AddRows, inverted
            inv = np.full(hi - lo, -1, dtype=np.int64)
            inv[r - lo] = np.arange(b - a)
            c.indexes.append(inv)
            out.append(Command(CT.ADD_ROWS, dst=other, src=row_side, table=len(c.indexes) - 1,
                               alpha=cmd.alpha))
    return out


def split_row_ops(c: NnetComputation, nnet, options: OptimizeOptions) -> str:
    """Replace ``*_MULTI`` row ops that read (or write) at most two source submatrices,
    each over one run of the table, by one plain op per run: a row-range matrix
    copy/add where the run's source rows are consecutive, else ``COPY_ROWS`` /
    ``ADD_ROWS`` on the covering row range of the source."""
    new_commands: list[Command] = []
    split = added = 0
    for cmd in c.commands:
        parts = _split_multi(c, cmd) if cmd.table >= 0 and cmd.type in _MULTI else None
        if parts is None:
            new_commands.append(cmd)
            continue
        split += 1
        added += len(parts)
        new_commands.extend(parts)
    if not split:
        return ""
    c.commands = new_commands
    return f"split {split} multi-row ops into {added} commands"


# -- ReplaceRowWithMatrixOps -----------------------------------------------------------------

def _ranges_as_rows(ranges: np.ndarray) -> np.ndarray | None:
    """An ``ADD_ROW_RANGES`` table whose ranges are all empty or single rows, as an
    ``ADD_ROWS`` table (-1 for empty); None otherwise."""
    length = ranges[:, 1] - ranges[:, 0]
    if (length > 1).any():
        return None
    return np.where(length == 1, ranges[:, 0], -1).astype(np.int64)


def replace_row_with_matrix_ops(c: NnetComputation, nnet, options: OptimizeOptions) -> str:
    """Turn row ops whose table is one run of consecutive source rows (possibly with
    -1 entries at the ends) into ``MATRIX_COPY``/``MATRIX_ADD`` on row ranges.

    ``ADD_ROW_RANGES`` whose ranges are all empty or one row long first becomes
    ``ADD_ROWS`` (kept as such when not consecutive: a gather is cheaper than range
    sums). Copies with -1 ends are converted only when those rows are known zero."""
    to_matrix = to_rows = 0
    RANGES = CT.ADD_ROW_RANGES
    for k, cmd in enumerate(c.commands):
        if cmd.table < 0:
            continue  # no index table (every row op of a valid computation has one)
        from_ranges = cmd.type is RANGES
        if from_ranges:
            tab = _ranges_as_rows(c.indexes_ranges[cmd.table])
            if tab is None or not (tab >= 0).any():
                continue
            cmd.type = CT.ADD_ROWS
            _set_table(c, cmd, tab)
        elif cmd.type not in _ROWS:
            continue
        tab = c.indexes[cmd.table]
        ends = _ends(tab < 0)
        if ends is None:
            continue
        lead, trail = ends
        n = len(tab)
        count = n - lead - trail
        first = int(tab[lead])
        if not np.array_equal(tab[lead:n - trail], first + np.arange(count)) or (
                cmd.type is CT.COPY_ROWS
                and not (_rows_known_zero(c, k, cmd.dst, 0, lead)
                         and _rows_known_zero(c, k, cmd.dst, n - trail, n))):
            to_rows += from_ranges
            continue
        cmd.type = CT.MATRIX_COPY if cmd.type is CT.COPY_ROWS else CT.MATRIX_ADD
        cmd.dst = _row_sub(c, cmd.dst, lead, count)
        cmd.src = _row_sub(c, cmd.src, first, count)
        cmd.table = -1
        to_matrix += 1
    parts = []
    if to_matrix:
        parts.append(f"replaced {to_matrix} row ops with matrix ops")
    if to_rows:
        parts.append(f"{to_rows} row-range ops became row ops")
    return ", ".join(parts)
