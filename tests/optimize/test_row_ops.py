"""The row-operation passes (snip_row_ops, split_row_ops, replace_row_with_matrix_ops).

Two kinds of evidence: reference cases run unoptimized vs. with the pass alone
(same inputs, same output derivatives), and small hand-built computations
executed by a deliberately naive row-by-row interpreter written here from the
command semantics (so a pass that changes meaning, e.g. forgets that a CopyRows
-1 zeroes its row, shows up as a different matrix)."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.computation import Command, NnetComputation
from pynnet3.computation import CommandType as CT
from pynnet3.optimize import OptimizeOptions
from pynnet3.optimize.row_ops import replace_row_with_matrix_ops, snip_row_ops, split_row_ops
from tests.optimize.single_pass import compare_pass, histogram, load_reference

OPTS = OptimizeOptions()
MULTI = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI)


# -- a naive interpreter of data-movement commands ------------------------------------------

def execute(c: NnetComputation, init: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Run ``c`` on matrices ``init`` (copied) one row at a time. Allocation gives
    NaN (undefined contents), so any read of undefined data poisons the result."""
    mats = {m: a.astype(np.float64, copy=True) for m, a in init.items()}

    def view(s):
        sm = c.submatrices[s]
        return mats[sm.matrix][sm.row_offset:sm.row_offset + sm.num_rows,
                               sm.col_offset:sm.col_offset + sm.num_cols]

    for cmd in c.commands:
        t, a = cmd.type, cmd.alpha
        if t is CT.ALLOC_MATRIX:
            info = c.matrices[cmd.matrix]
            mats[cmd.matrix] = np.full((info.rows, info.cols), np.nan)
        elif t is CT.SET_CONST:
            view(cmd.dst)[:] = a
        elif t is CT.MATRIX_COPY:
            view(cmd.dst)[:] = a * view(cmd.src).copy()
        elif t is CT.MATRIX_ADD:
            view(cmd.dst)[:] += a * view(cmd.src)
        elif t in (CT.COPY_ROWS, CT.ADD_ROWS):
            d, s = view(cmd.dst), view(cmd.src)
            for i, r in enumerate(c.indexes[cmd.table].tolist()):
                if t is CT.COPY_ROWS:
                    d[i] = a * s[r] if r >= 0 else 0.0
                elif r >= 0:
                    d[i] += a * s[r]
        elif t in (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI):
            d = view(cmd.dst)
            for i, (s, r) in enumerate(c.indexes_multi[cmd.table].tolist()):
                if t is CT.COPY_ROWS_MULTI:
                    d[i] = a * view(s)[r] if s >= 0 else 0.0
                elif s >= 0:
                    d[i] += a * view(s)[r]
        elif t in (CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI):
            src = view(cmd.src)
            for i, (s, r) in enumerate(c.indexes_multi[cmd.table].tolist()):
                if s >= 0:
                    if t is CT.COPY_TO_ROWS_MULTI:
                        view(s)[r] = a * src[i]
                    else:
                        view(s)[r] += a * src[i]
        elif t is CT.ADD_ROW_RANGES:
            d, s = view(cmd.dst), view(cmd.src)
            for i, (b, e) in enumerate(c.indexes_ranges[cmd.table].tolist()):
                d[i] += a * s[b:e].sum(axis=0)
        elif t is not CT.NO_OPERATION:
            raise AssertionError(f"interpreter: unexpected {t}")
    return mats


def build(shapes: list[tuple[int, int]]) -> NnetComputation:
    c = NnetComputation()
    for rows, cols in shapes:
        c.new_matrix(rows, cols)
    return c


def random_init(c: NnetComputation, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {m: rng.standard_normal((info.rows, info.cols))
            for m, info in enumerate(c.matrices) if m}


def rows_op(c, kind, dst, src, table, alpha=1.0):
    c.indexes.append(np.asarray(table, dtype=np.int64))
    c.commands.append(Command(kind, dst=dst, src=src, table=len(c.indexes) - 1, alpha=alpha))


def multi_op(c, kind, main, table, alpha=1.0):
    c.indexes_multi.append(np.asarray(table, dtype=np.int64).reshape(-1, 2))
    field = "src" if kind in (CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI) else "dst"
    c.commands.append(Command(kind, table=len(c.indexes_multi) - 1, alpha=alpha,
                              **{field: main}))


def ranges_op(c, dst, src, ranges, alpha=1.0):
    c.indexes_ranges.append(np.asarray(ranges, dtype=np.int64).reshape(-1, 2))
    c.commands.append(Command(CT.ADD_ROW_RANGES, dst=dst, src=src,
                              table=len(c.indexes_ranges) - 1, alpha=alpha))


def rewrite(c, *passes) -> list[str]:
    """Apply ``passes`` in order and return their descriptions; the interpreter's
    matrices before and after must be identical. (No renumbering here: it would
    renumber the matrices being compared; the no-ops it drops are skipped.)"""
    init = random_init(c)
    want = execute(c, init)
    descs = [fn(c, None, OPTS) for fn in passes]
    got = execute(c, init)
    for m in want:
        np.testing.assert_allclose(got[m], want[m], rtol=1e-12, atol=1e-12,
                                   err_msg=f"matrix m{m} after {descs}")
    return descs


def types(c) -> list[CT]:
    return [cmd.type for cmd in c.commands if cmd.type is not CT.NO_OPERATION]


# -- snip + replace -------------------------------------------------------------------------------

def test_add_rows_with_negative_ends_becomes_a_row_range_add():
    c = build([(6, 3), (5, 3)])
    rows_op(c, CT.ADD_ROWS, c.whole(2), c.whole(1), [-1, 2, 3, 4, -1], alpha=0.5)
    snip, replace = rewrite(c, snip_row_ops, replace_row_with_matrix_ops)
    assert snip == "snipped 1 row ops" and replace
    assert types(c) == [CT.MATRIX_ADD]
    d, s = c.submatrices[c.commands[0].dst], c.submatrices[c.commands[0].src]
    assert (d.row_offset, d.num_rows, s.row_offset, s.num_rows) == (1, 3, 2, 3)


def test_snip_keeps_the_middle_of_a_non_contiguous_table():
    c = build([(6, 3), (7, 3)])
    rows_op(c, CT.ADD_ROWS, c.whole(2), c.whole(1), [-1, -1, 5, 0, -1, 3, -1])
    rewrite(c, snip_row_ops)
    assert types(c) == [CT.ADD_ROWS]
    assert c.indexes[c.commands[0].table].tolist() == [5, 0, -1, 3]
    assert c.submatrices[c.commands[0].dst].row_offset == 2


def test_copy_rows_minus_one_rows_are_kept_when_not_known_zero():
    # dst holds data (a copy wrote it): dropping the -1 rows would leave that data
    # where CopyRows writes zeros.
    c = build([(6, 3), (5, 3), (5, 3)])
    c.commands.append(Command(CT.MATRIX_COPY, dst=c.whole(2), src=c.whole(3)))
    rows_op(c, CT.COPY_ROWS, c.whole(2), c.whole(1), [-1, 2, 3, 4, -1])
    assert rewrite(c, snip_row_ops, replace_row_with_matrix_ops) == ["", ""]
    assert types(c) == [CT.MATRIX_COPY, CT.COPY_ROWS]


@pytest.mark.parametrize("zero_cols", [3, 2])
def test_copy_rows_on_a_zeroed_matrix(zero_cols):
    c = build([(6, 3), (5, 3)])
    c.commands.append(Command(CT.ALLOC_MATRIX, matrix=2))
    c.commands.append(Command(CT.SET_CONST, dst=c.new_submatrix(2, 0, 5, 0, zero_cols),
                              alpha=0.0))
    if zero_cols < 3:  # the rest is defined, but not zero
        c.commands.append(Command(CT.SET_CONST, dst=c.new_submatrix(2, 0, 5, zero_cols,
                                                                     3 - zero_cols), alpha=1.0))
    rows_op(c, CT.COPY_ROWS, c.whole(2), c.whole(1), [-1, 2, 3, 4, -1])
    descs = rewrite(c, replace_row_with_matrix_ops)
    if zero_cols == 3:
        assert descs == ["replaced 1 row ops with matrix ops"] and types(c)[-1] is CT.MATRIX_COPY
    else:
        assert descs == [""] and types(c)[-1] is CT.COPY_ROWS


def test_all_negative_tables():
    c = build([(6, 3), (4, 3), (4, 3), (4, 3)])
    rows_op(c, CT.ADD_ROWS, c.whole(2), c.whole(1), [-1] * 4)
    rows_op(c, CT.COPY_ROWS, c.whole(3), c.whole(1), [-1] * 4)  # data there: must zero it
    c.commands.append(Command(CT.SET_CONST, dst=c.whole(4), alpha=0.0))
    rows_op(c, CT.COPY_ROWS, c.whole(4), c.whole(1), [-1] * 4)  # already zero
    assert rewrite(c, snip_row_ops) == ["removed 3 empty row ops"]
    assert types(c) == [CT.SET_CONST, CT.SET_CONST]


def test_multi_and_range_snipping():
    c = build([(6, 3), (6, 3), (7, 3), (5, 3)])
    s1, s2 = c.whole(1), c.whole(2)
    multi_op(c, CT.ADD_ROWS_MULTI, c.whole(3),
             [-1, -1, s1, 3, s2, 0, -1, -1, s1, 1, -1, -1, -1, -1])
    multi_op(c, CT.ADD_TO_ROWS_MULTI, c.whole(4), [-1, -1, s1, 4, s2, 5, -1, -1, -1, -1])
    ranges_op(c, c.whole(4), c.whole(1), [[2, 2], [0, 3], [1, 1], [4, 6], [5, 5]])
    assert rewrite(c, snip_row_ops) == ["snipped 3 row ops"]
    lens = [len(c.indexes_multi[c.commands[0].table]), len(c.indexes_multi[c.commands[1].table]),
            len(c.indexes_ranges[c.commands[2].table])]
    assert lens == [4, 2, 3]
    assert c.submatrices[c.commands[1].src].row_offset == 1  # the scatter's row side


def test_row_ranges_of_single_rows():
    c = build([(6, 3), (5, 3), (3, 3)])
    ranges_op(c, c.whole(2), c.whole(1), [[0, 0], [2, 3], [3, 4], [4, 5], [1, 1]], alpha=2.0)
    ranges_op(c, c.whole(3), c.whole(1), [[5, 6], [0, 0], [1, 2]])
    rewrite(c, snip_row_ops, replace_row_with_matrix_ops)
    assert types(c) == [CT.MATRIX_ADD, CT.ADD_ROWS]
    assert c.indexes[c.commands[1].table].tolist() == [5, -1, 1]


# -- split ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,expect", [
    (CT.ADD_ROWS_MULTI, [CT.MATRIX_ADD, CT.ADD_ROWS]),
    (CT.COPY_ROWS_MULTI, [CT.MATRIX_COPY, CT.COPY_ROWS]),
    (CT.ADD_TO_ROWS_MULTI, [CT.MATRIX_ADD, CT.ADD_ROWS]),
])
def test_split_two_runs(kind, expect):
    c = build([(6, 3), (7, 3), (6, 3)])
    s1, s2 = c.new_submatrix(1, 1, 5, 0, 3), c.whole(2)
    # run 1: s1 rows 0,1,2 (consecutive); run 2: s2 rows 4,2,0 (spread 5 <= 2 * 3)
    multi_op(c, kind, c.whole(3), [s1, 0, s1, 1, s1, 2, s2, 4, s2, 2, s2, 0], alpha=0.5)
    assert rewrite(c, split_row_ops) == ["split 1 multi-row ops into 2 commands"]
    assert types(c) == expect


def test_split_copy_to_rows_needs_consecutive_rows():
    c = build([(6, 3), (7, 3), (4, 3)])
    s1, s2 = c.whole(1), c.whole(2)
    multi_op(c, CT.COPY_TO_ROWS_MULTI, c.whole(3), [s1, 3, s1, 4, s2, 2, s2, 3])
    multi_op(c, CT.COPY_TO_ROWS_MULTI, c.whole(3), [s1, 3, s1, 1, s2, 2, s2, 3])
    assert rewrite(c, split_row_ops) == ["split 1 multi-row ops into 2 commands"]
    assert types(c) == [CT.MATRIX_COPY, CT.MATRIX_COPY, CT.COPY_TO_ROWS_MULTI]


@pytest.mark.parametrize("table", [
    [1, 0, 2, 0, 1, 1],          # three runs
    [1, 0, -1, -1, 1, 1],        # a (-1, -1) pair
    [1, 0, 1, 5],                # source rows spread 6 > 2 * 2
])
def test_split_refuses(table):
    c = build([(6, 3), (6, 3), (len(table) // 2, 3)])
    multi_op(c, CT.ADD_ROWS_MULTI, c.whole(3), table)
    assert rewrite(c, split_row_ops) == [""]
    assert types(c) == [CT.ADD_ROWS_MULTI]


# -- reference cases ----------------------------------------------------------------------------

def _case(name):
    return load_reference(name)


@pytest.mark.parametrize("name", ["generated/case_10", "generated/case_23", "generated/case_28",
                                  "generated/case_34", "generated/case_37"])
def test_snip_on_reference_cases(name):
    nnet, req, inputs, derivs = _case(name)
    before, after, desc = compare_pass(snip_row_ops, nnet, req, inputs, derivs)
    assert desc.startswith("snipped")

    def ends(c):
        n = 0
        for cmd in c.commands:
            if cmd.type is CT.ADD_ROWS:
                tab = c.indexes[cmd.table]
                n += int(tab[0] < 0 or tab[-1] < 0)
            elif cmd.type in (CT.ADD_ROWS_MULTI,):
                tab = c.indexes_multi[cmd.table][:, 0]
                n += int(tab[0] < 0 or tab[-1] < 0)
        return n

    assert ends(after) < ends(before) or ends(before) == 0
    def table_rows(c):
        return sum(c.submatrices[cmd.dst].num_rows for cmd in c.commands
                   if cmd.type in (CT.ADD_ROWS, CT.COPY_ROWS, *MULTI, CT.ADD_ROW_RANGES))

    assert table_rows(after) < table_rows(before)


def test_split_on_a_reference_case():
    nnet, req, inputs, derivs = _case("generated/case_37")
    before, after, desc = compare_pass(split_row_ops, nnet, req, inputs, derivs)
    assert desc == "split 1 multi-row ops into 2 commands"
    nb, na = histogram(before), histogram(after)
    assert sum(na[t] for t in MULTI) == sum(nb[t] for t in MULTI) - 1


def test_replace_on_a_reference_case():
    nnet, req, inputs, derivs = _case("generated/case_23")
    before, after, desc = compare_pass(replace_row_with_matrix_ops, nnet, req, inputs, derivs)
    assert desc == "replaced 4 row ops with matrix ops"
    nb, na = histogram(before), histogram(after)
    assert na[CT.ADD_ROWS] + na[CT.COPY_ROWS] == nb[CT.ADD_ROWS] + nb[CT.COPY_ROWS] - 4
    assert na[CT.MATRIX_ADD] + na[CT.MATRIX_COPY] == nb[CT.MATRIX_ADD] + nb[CT.MATRIX_COPY] + 4


def test_passes_do_nothing_on_plain_matrix_copies():
    """The realistic TDNN compiles to whole-range copies only: nothing to do."""
    nnet, req, inputs, derivs = _case("realistic/tdnn_relu_bn/train")
    for fn in (snip_row_ops, split_row_ops, replace_row_with_matrix_ops):
        c = pynnet3.compile(nnet, req, optimize=False)
        n = len(c.commands)
        assert fn(c, nnet, OPTS) == "" and len(c.commands) == n
