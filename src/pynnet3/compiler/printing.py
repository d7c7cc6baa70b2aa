"""A text listing of an NnetComputation in the spirit of Kaldi's NnetComputation::Print."""

from __future__ import annotations

import numpy as np

from ..computation import CommandType as CT
from ..computation import NnetComputation


def _compress_indexes(idx: np.ndarray | None, limit: int = 6) -> str:
    """``(n, tfirst:tlast)`` runs, like Kaldi's listing."""
    if idx is None or len(idx) == 0:
        return ""
    out = []
    start = 0
    rows = idx.tolist()
    for i in range(1, len(rows) + 1):
        if i < len(rows) and rows[i][0] == rows[i - 1][0] and rows[i][2] == rows[i - 1][2] \
                and rows[i][1] == rows[i - 1][1] + 1:
            continue
        n, t0, x = rows[start]
        t1 = rows[i - 1][1]
        tt = f"{t0}" if t0 == t1 else f"{t0}:{t1}"
        out.append(f"({n},{tt}{',' + str(x) if x else ''})")
        start = i
        if len(out) >= limit:
            if i < len(rows):
                out.append("...")
            break
    return ", ".join(out)


def sub_name(c: NnetComputation, s: int) -> str:
    if s == 0:
        return "[]"
    sm = c.submatrices[s]
    m = c.matrices[sm.matrix]
    if sm.row_offset == 0 and sm.num_rows == m.rows and sm.col_offset == 0 \
            and sm.num_cols == m.cols:
        return f"m{sm.matrix}"
    return (f"m{sm.matrix}({sm.row_offset}:{sm.row_offset + sm.num_rows - 1}, "
            f"{sm.col_offset}:{sm.col_offset + sm.num_cols - 1})")


def _input(c: NnetComputation, cmd) -> str:
    """A component command's input value: a submatrix, or its column blocks."""
    if cmd.in_value == 0 and 0 <= cmd.table < len(c.indexes_blocks):
        blocks = ", ".join(sub_name(c, s) for s in c.indexes_blocks[cmd.table].tolist())
        return f"blocks[{blocks}]"
    return sub_name(c, cmd.in_value)


def _in_deriv(c: NnetComputation, cmd) -> str:
    """A backprop's input derivative: a submatrix, or the column blocks it adds to."""
    if cmd.in_deriv == 0 and 0 <= cmd.deriv_table < len(c.indexes_blocks):
        blocks = ", ".join(sub_name(c, s) for s in c.indexes_blocks[cmd.deriv_table].tolist())
        return f"+=blocks[{blocks}]"
    return f"&{sub_name(c, cmd.in_deriv)}"


def command_text(c: NnetComputation, cmd) -> str:
    t = cmd.type
    a = "" if cmd.alpha == 1.0 else f"{cmd.alpha:g} * "
    d, s = sub_name(c, cmd.dst), sub_name(c, cmd.src)
    if t is CT.ALLOC_MATRIX:
        m = c.matrices[cmd.matrix]
        return f"m{cmd.matrix} = undefined({m.rows},{m.cols})"
    if t is CT.DEALLOC_MATRIX:
        return f"m{cmd.matrix} = []"
    if t is CT.SWAP_MATRIX:
        return f"m{cmd.matrix}.swap(m{cmd.src_matrix})"
    if t is CT.SET_CONST:
        return f"{d}.Set({cmd.alpha:g})"
    if t in (CT.PROPAGATE,):
        stats = " [store-stats]" if cmd.alpha == 2.0 else ""
        memo = f" [memo {cmd.memo}]" if cmd.memo else ""
        return (f"{cmd.node}.Propagate(pre{cmd.precomputed}, {_input(c, cmd)}, "
                f"&{sub_name(c, cmd.out_value)}){memo}{stats}")
    if t in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE):
        upd = "" if t is CT.BACKPROP else " [no model update]"
        return (f"{cmd.node}.Backprop(pre{cmd.precomputed}, {_input(c, cmd)}, "
                f"{sub_name(c, cmd.out_value)}, {sub_name(c, cmd.out_deriv)}, "
                f"{_in_deriv(c, cmd)}){upd}")
    if t is CT.MATRIX_COPY:
        return f"{d} = {a}{s}"
    if t is CT.MATRIX_ADD:
        return f"{d} += {a}{s}"
    if t in (CT.COPY_ROWS, CT.ADD_ROWS):
        op = "CopyRows" if t is CT.COPY_ROWS else "AddRows"
        tab = c.indexes[cmd.table]
        return f"{d}.{op}({a}{s}[{_list(tab)}])"
    if t in (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI):
        tab = c.indexes_multi[cmd.table]
        pairs = ", ".join(f"m{c.submatrices[p].matrix if p > 0 else -1}:{r}"
                          for p, r in tab[:8].tolist())
        more = ", ..." if len(tab) > 8 else ""
        op = t.value[1:]
        return f"{d}.{op}({a}[{pairs}{more}])"
    if t is CT.ADD_ROW_RANGES:
        tab = c.indexes_ranges[cmd.table]
        pairs = ", ".join(f"{b}:{e - 1}" if e > b else "null" for b, e in tab[:8].tolist())
        more = ", ..." if len(tab) > 8 else ""
        return f"{d}.AddRowRanges({a}{s}, [{pairs}{more}])"
    if t is CT.ACCEPT_INPUT:
        what = "user derivative" if cmd.is_deriv else "user input"
        return f"{d} = {what} [for node: '{cmd.node}']"
    if t is CT.PROVIDE_OUTPUT:
        what = "derivative" if cmd.is_deriv else "output"
        gone = " (handed over)" if cmd.release else ""
        return f"{what} {s} to user [for node: '{cmd.node}']{gone}"
    if t is CT.NO_OPERATION_MARKER:
        return "# computation segment separator [e.g., begin backward commands]"
    if t is CT.NO_OPERATION_PERMANENT:
        return "[no-op-permanent]"
    if t is CT.NO_OPERATION_LABEL:
        return "[label for goto statement]"
    if t is CT.GOTO_LABEL:
        return f"goto c{cmd.label}"
    if t in (CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX):
        m = f"m{c.submatrices[cmd.dst].matrix}" if cmd.dst else f"m{cmd.matrix}"
        if t is CT.DECOMPRESS_MATRIX:
            return f"DecompressMatrix({m})"
        kind = {1: "int8", 2: "uint8", 3: "int16", 4: "uint16"}.get(cmd.compress_kind,
                                                                    cmd.compress_kind)
        return f"CompressMatrix({m}, {cmd.alpha:g}, {kind}, true)"
    return t.value


def _list(tab: np.ndarray, limit: int = 12) -> str:
    vals = tab[:limit].tolist()
    s = ", ".join(str(v) for v in vals)
    return s + (", ..." if len(tab) > limit else "")


def print_computation(c: NnetComputation) -> str:
    lines = []
    mats = ", ".join(f"m{i}({m.rows}, {m.cols})" for i, m in enumerate(c.matrices) if i)
    lines.append(f"matrix {mats}")
    lines.append("# matrix = node.[value|deriv][cindexes]")
    for i, m in enumerate(c.matrices):
        if i:
            kind = "deriv" if m.is_deriv else "value"
            lines.append(f"m{i} == {kind}: {m.node}[{_compress_indexes(m.indexes)}]")
    lines.append("# begin forward commands")
    for k, cmd in enumerate(c.commands):
        lines.append(f"c{k}: {command_text(c, cmd)}")
    return "\n".join(lines) + "\n"
