"""Pieces of the expansion (pynnet3.cache.expand): stretching index arrays along n,
and sharing the work between equal arrays."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.cache.expand import ExpansionError, ExpansionPlan
from pynnet3.cache.stretch import Stretcher, distinct_arrays, n_strides


def _regular(outer: int, stride: int, num_n: int, seed: int) -> np.ndarray:
    """``(outer, num_n, stride)`` rows with n = 0 .. num_n - 1 and random (t, x)
    shared by the sequences."""
    rng = np.random.default_rng(seed)
    tx = rng.integers(-50, 50, size=(outer, 1, stride, 2))
    out = np.empty((outer, num_n, stride, 3), dtype=np.int64)
    out[..., 0] = np.arange(num_n)[:, None]
    out[..., 1:] = tx
    return out.reshape(-1, 3)


def _naive(mini: np.ndarray, stride: int, num_n: int) -> np.ndarray:
    rows = []
    for block in mini.reshape(-1, 2, stride, 3):
        for n in range(num_n):
            for n_tx in block[0]:
                rows.append((n, n_tx[1], n_tx[2]))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


@pytest.mark.parametrize("num_n", [2, 3, 7])
def test_stretcher_matches_a_row_by_row_expansion(num_n):
    shapes = [(5, 1), (1, 4), (3, 2), (2, 1), (1, 1), (4, 3)]
    arrays = [_regular(o, s, 2, seed) for seed, (o, s) in enumerate(shapes)]
    stride, outer = n_strides(arrays)
    assert stride.tolist() == [s for _, s in shapes]
    assert outer.tolist() == [o for o, _ in shapes]
    out = Stretcher(arrays, stride).expand(num_n)
    for a, s, new in zip(arrays, stride.tolist(), out, strict=True):
        assert new.dtype == np.int64 and new.flags.c_contiguous
        np.testing.assert_array_equal(new, _naive(a, s, num_n))


def test_distinct_arrays_by_content():
    a = _regular(3, 1, 2, 0)
    b = a.copy()
    c = _regular(3, 1, 2, 1)
    unique, which = distinct_arrays([a, b, c, a, c[:2]])
    assert which == [0, 0, 1, 0, 2]
    assert unique[0] is a and unique[1] is c and len(unique) == 3


def _plans(seeds):
    """Expansion plans of the mini computations of some random networks' requests."""
    import warnings

    import pynnet3
    from pynnet3.cache import CachingCompiler
    from pynnet3.cache.expand import ExpansionPlan
    from pynnet3.testing.random_nets import case_for_seed

    for seed in seeds:
        case = case_for_seed(seed)
        nnet = pynnet3.Nnet.from_config(case.config, seed=case.nnet_seed)
        cc = CachingCompiler(nnet)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cc.compile(case.request)
        for entry in list(cc._entries.values()):
            mini = entry.value
            if hasattr(mini, "snapshot") and not mini.failed:
                yield ExpansionPlan(mini.computation, mini.snapshot, nnet), mini.snapshot


def test_tables_laid_out_as_blocks_expand_like_the_general_scatter():
    """A table whose n = 0 entries cover their submatrix block by block is expanded
    by reordering its values; the result must equal the general scatter's."""
    seen = set()
    for plan, _ in _plans(range(60)):
        for num_n in (3, 5):
            rows = plan.sub_new_rows(num_n).tolist()
            for table in plan.tables:
                fast = plan._table(table, rows[table.sub], num_n)
                grid, table.grid = table.grid, False
                try:
                    general = plan._table(table, rows[table.sub], num_n)
                finally:
                    table.grid = grid
                np.testing.assert_array_equal(fast, general)
                seen.add((table.kind, grid))
    assert {("rows", True), ("rows", False), ("multi", True)} <= seen


@pytest.mark.parametrize("kind", ["rows", "multi"])
def test_irregular_index_tables_are_rejected(kind):
    """An n = 1 entry of a table that does not read like its n = 0 partner (one
    source stride further) makes the mini computation unexpandable."""
    for plan, snapshot in _plans(range(60)):
        for k, plan_id in plan.table_of:
            table = plan.tables[plan_id]
            if table.kind != kind or not len(table.pos_o):
                continue
            comp = plan.mini.copy()
            cmd = comp.commands[k]
            s = table.pos_s
            row = int(table.pos_o[0]) * 2 * s + int(table.pos_w[0])  # an n = 0 entry
            if kind == "rows":
                comp.indexes[cmd.table][row + s] = -1  # its n = 1 partner reads nothing
            else:
                comp.indexes_multi[cmd.table][row + s, 1] += 1  # ... or another row
            ExpansionPlan(plan.mini, snapshot, plan.nnet)  # (the original is fine)
            with pytest.raises(ExpansionError, match="not regular in n"):
                ExpansionPlan(comp, snapshot, plan.nnet)
            return
    pytest.fail(f"no {kind} table among the random networks")


def test_submatrices_with_new_rows_equal_constructed_ones():
    from pynnet3.cache.expand import _with_rows
    from pynnet3.computation import SubMatrix

    subs = [SubMatrix(1, 0, 4, 0, 3), SubMatrix(2, 2, 6, 1, 2)]
    fast = _with_rows(subs, [5, 7], [8, 9])
    assert fast == [SubMatrix(1, 5, 8, 0, 3), SubMatrix(2, 7, 9, 1, 2)]
    assert fast[1] == SubMatrix(2, 7, 9, 1, 2) and hash(fast[1]) == hash(SubMatrix(2, 7, 9, 1, 2))
    assert subs[1] == SubMatrix(2, 2, 6, 1, 2)  # the originals are untouched


def test_component_rows_in_another_n_order_are_rejected():
    """The snapshot's indexes of a component and the rows the optimized computation
    gives it must agree in n (both expand to one row order)."""
    import dataclasses

    for plan, snapshot in _plans(range(300)):
        for p, _, info in plan.pre:
            out = info.output_indexes
            by_n = out[np.argsort(out[:, 0], kind="stable")]  # sequence after sequence
            if np.array_equal(by_n, out):
                continue
            changed = dict(snapshot)
            changed[p] = dataclasses.replace(info, output_indexes=by_n)
            with pytest.raises(ExpansionError, match="reordered"):
                ExpansionPlan(plan.mini, changed, plan.nnet)
            return
    pytest.skip("no component with n-interleaved rows among the random networks")
