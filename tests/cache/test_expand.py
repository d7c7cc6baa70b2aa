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


# -- row maps of precomputed objects stretched along n ---------------------------------


def _pairs_layout(pairs: np.ndarray, stride: int, rng) -> np.ndarray:
    """The (t, x) ``pairs`` in a random order, as ``(O, 2, S)`` rows with n = 0, 1."""
    pairs = pairs[rng.permutation(len(pairs))]
    out = np.empty((len(pairs) // stride, 2, stride, 3), dtype=np.int64)
    out[..., 0] = np.arange(2)[:, None]
    out[..., 1:] = pairs.reshape(-1, 1, stride, 2)
    return out.reshape(-1, 3)


def _stretch_case(seed: int):
    """Random regular input and output index arrays of two sequences (own strides;
    for odd seeds, outputs partly beyond what the time offsets can read), the
    offsets and the arrays' RowMapStretch."""
    from pynnet3.cache.expand import RowMapStretch

    rng = np.random.default_rng(seed)
    offsets = rng.choice(np.arange(-3, 4), size=3, replace=False)
    t_in, x = int(rng.integers(8, 14)), int(rng.integers(1, 3))
    t_lo, t_hi = max(0, -offsets.min()), t_in - max(0, offsets.max())
    if seed % 2:
        t_lo, t_hi = t_lo + rng.integers(-3, 1), t_hi + rng.integers(0, 4)

    def grid(ts):
        return np.stack(np.meshgrid(ts, np.arange(x), indexing="ij"), -1).reshape(-1, 2)

    pairs_in, pairs_out = grid(np.arange(t_in)), grid(np.arange(t_lo, t_hi))
    s_in = int(rng.choice([d for d in (1, 2, 3, 4) if len(pairs_in) % d == 0]))
    s_out = int(rng.choice([d for d in (1, 2, 3, 4) if len(pairs_out) % d == 0]))
    inp, out = _pairs_layout(pairs_in, s_in, rng), _pairs_layout(pairs_out, s_out, rng)
    return inp, out, offsets, RowMapStretch(len(inp), s_in, len(out), s_out)


@pytest.mark.parametrize("seed", range(40))
def test_row_maps_stretch_like_recomputing_them(seed):
    """A time-offset gather map stretched along n equals the map computed from the
    expanded index arrays, -1 entries (absent inputs) included, for any strides."""
    from pynnet3.components.tdnn import time_offset_sources

    inp, out, offsets, stretch = _stretch_case(seed)
    mini = time_offset_sources(inp, out, offsets)
    strides = np.array([stretch.in_stride, stretch.out_stride])
    for num_n in (2, 3, 8):
        new_in, new_out = Stretcher([inp, out], strides).expand(num_n)
        got = stretch(mini, num_n)
        want = time_offset_sources(new_in, new_out, offsets)
        assert got.dtype == want.dtype and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(stretch(mini[0], num_n), want[0])  # one map alone


def test_row_map_cases_include_absent_inputs():
    from pynnet3.components.tdnn import time_offset_sources

    absent = [bool((time_offset_sources(inp, out, offsets) < 0).any())
              for inp, out, offsets, _ in map(_stretch_case, range(40))]
    assert any(absent) and not all(absent)


def test_row_maps_not_within_one_sequence_are_not_stretched():
    """Maps that read across sequences, differ between the two sequences, leave the
    input or are of another length or type give None (the caller recomputes)."""
    from pynnet3.components.tdnn import time_offset_sources

    inp, out, _, stretch = _stretch_case(3)
    s_in, s_out = stretch.in_stride, stretch.out_stride
    mini = time_offset_sources(inp, out, [0])[0]
    assert stretch(mini, 4) is not None
    n0 = np.flatnonzero(out[:, 0] == 0)
    bad = []
    swapped = mini.copy()  # n = 0 rows read the n = 1 rows and the other way round
    swapped[n0], swapped[n0 + s_out] = mini[n0 + s_out], mini[n0]
    bad.append(swapped)
    shifted = mini.copy()  # one n = 1 row reads something else than its partner's partner
    j = n0[np.flatnonzero(mini[n0] >= 0)[0]] + s_out
    shifted[j] = -1
    bad.append(shifted)
    absent = mini.copy()  # an n = 0 row reads nothing, its partner something
    absent[j - s_out] = -1
    bad.append(absent)
    for value in (len(inp), -2):
        outside = mini.copy()
        outside[n0[0]] = value
        bad.append(outside)
    bad += [mini[:-1], mini.astype(np.int32), mini.tolist()]
    for rows in bad:
        fresh = type(stretch)(len(inp), s_in, len(out), s_out)
        assert fresh(rows, 4) is None


def test_stretched_precomputed_objects_equal_recomputed_ones():
    """In the expansions of random networks' mini computations, every object a
    component's hook stretches equals what precompute_indexes makes of the
    expanded indexes (same type, fields and array bytes)."""
    import dataclasses

    from pynnet3.components.statistics import RangeIndexes

    seen = runs = ranges = 0
    for plan, _ in _plans(range(300)):
        for num_n in (2, 5):
            expanded = plan.stretcher.expand(num_n)
            which = iter(plan.pre_array)
            for (p, comp, info), stretch in zip(plan.pre, plan.pre_stretch, strict=True):
                new_out = expanded[next(which)]
                new_in = expanded[next(which)] if len(info.input_indexes) else None
                if stretch is None:
                    continue
                got = comp.stretch_precomputed(plan.mini.precomputed[p], new_in, new_out,
                                               info.need_backprop, stretch.bind(num_n))
                assert got is not None
                want = comp.precompute_indexes(new_in, new_out, info.need_backprop)
                assert type(got) is type(want)
                if not dataclasses.is_dataclass(want):  # OffsetGather: compared by content
                    assert got == want
                    assert got.src.dtype == want.src.dtype
                    runs += got.starts is not None
                    seen += 1
                    continue
                ranges += isinstance(got, RangeIndexes)
                for f in dataclasses.fields(want):
                    a, b = getattr(got, f.name), getattr(want, f.name)
                    if isinstance(b, np.ndarray):
                        assert a.dtype == b.dtype and a.shape == b.shape
                        assert a.tobytes() == b.tobytes()
                    else:
                        assert a == b
                seen += 1
    assert seen > 0, "no component with the hook among the random networks"
    assert runs > 0, "no stretched object made from run starts alone"
    assert ranges > 0, "no statistics ranges stretched"


def test_statistics_ranges_not_sequence_major_or_across_sequences_are_not_stretched():
    """stretch_range_indexes takes only sequence-major rows whose windows stay in
    one sequence; anything else is left to precompute_indexes."""
    from pynnet3.cache.expand import RowMapStretch
    from pynnet3.components.statistics import RangeIndexes, stretch_range_indexes

    s_in = s_out = 3
    perm = np.arange(6, dtype=np.int64)
    lo = np.array([0, 0, 1, 3, 3, 4], dtype=np.int64)
    hi = lo + 2 - (np.arange(6) % 3 == 2)
    good = RangeIndexes(perm, lo, hi, 6)
    bound = RowMapStretch(6, s_in, 6, s_out).bind(4)
    got = stretch_range_indexes(good, bound)
    assert got is not None and got.num_input_rows == 12
    np.testing.assert_array_equal(got.perm, np.arange(12))
    np.testing.assert_array_equal(got.lo, np.concatenate([lo[:3] + 3 * k for k in range(4)]))
    np.testing.assert_array_equal(got.hi, np.concatenate([hi[:3] + 3 * k for k in range(4)]))
    across = RangeIndexes(perm, lo, np.where(np.arange(6) == 2, 4, hi), 6)  # n=0 window into n=1
    assert stretch_range_indexes(across, bound) is None
    interleaved = RowMapStretch(6, 1, 6, 1).bind(4)  # (3, 2, 1) layouts: n innermost
    assert stretch_range_indexes(good, interleaved) is None
