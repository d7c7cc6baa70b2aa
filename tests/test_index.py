"""pynnet3.index: packed keys, KeySet lookups and Kaldi's (t, x, n) order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynnet3.index import Index, KeySet, as_indexes, describe, pack, sort_order_txn, unpack

# The packed-key budget: n 20 bits, t 27 bits, x 16 bits (signed ranges).
N_RANGE = (-(1 << 19), (1 << 19) - 1)
T_RANGE = (-(1 << 26), (1 << 26) - 1)
X_RANGE = (-(1 << 15), (1 << 15) - 1)

index_triples = st.tuples(st.integers(*N_RANGE), st.integers(*T_RANGE), st.integers(*X_RANGE))


def test_pack_unpack_round_trip_including_negatives_and_extremes():
    idx = np.array([[0, 0, 0], [0, -1, 0], [0, 0, -1], [-1, -5, -7], [3, 1000, 2],
                    [N_RANGE[0], T_RANGE[0], X_RANGE[0]], [N_RANGE[1], T_RANGE[1], X_RANGE[1]]])
    assert np.array_equal(unpack(pack(idx)), idx)


@given(st.lists(index_triples, min_size=1, max_size=50))
@settings(max_examples=200, deadline=None)
def test_pack_unpack_round_trip_property(triples):
    idx = np.array(triples, dtype=np.int64)
    assert np.array_equal(unpack(pack(idx)), idx)


@given(index_triples, index_triples)
@settings(max_examples=300, deadline=None)
def test_pack_order_is_lexicographic_n_t_x(a, b):
    ka, kb = pack(np.array([a, b]))
    assert (ka < kb) == (a < b)
    assert (ka == kb) == (a == b)


def test_keyset_position_in_original_order_and_absent():
    idx = np.array([[0, 5, 0], [0, -2, 0], [1, 0, 0], [0, 0, 3]])
    ks = KeySet.from_indexes(idx)
    assert len(ks) == 4
    query = np.array([[1, 0, 0], [0, -2, 0], [0, 5, 0], [0, 0, 3], [0, 0, 0], [2, 0, 0],
                      [0, 5, 1]])
    assert ks.position(pack(query)).tolist() == [2, 1, 0, 3, -1, -1, -1]
    assert ks.contains(pack(query)).tolist() == [True, True, True, True, False, False, False]


def test_keyset_beyond_largest_key_and_empty():
    ks = KeySet.from_indexes(np.array([[0, 0, 0]]))
    assert ks.position(pack(np.array([[9, 9, 9], [-9, -9, -9]]))).tolist() == [-1, -1]
    empty = KeySet(np.zeros(0, dtype=np.int64))
    assert len(empty) == 0
    assert empty.position(pack(np.array([[0, 0, 0]]))).tolist() == [-1]
    assert empty.position(np.zeros(0, dtype=np.int64)).tolist() == []


def test_keyset_with_duplicates_finds_one_of_them():
    idx = np.array([[0, 1, 0], [0, 1, 0], [0, 2, 0]])
    pos = KeySet.from_indexes(idx).position(pack(np.array([[0, 1, 0]])))
    assert pos[0] in (0, 1)


@given(st.lists(index_triples, min_size=0, max_size=40, unique=True),
       st.lists(index_triples, min_size=0, max_size=20))
@settings(max_examples=150, deadline=None)
def test_keyset_position_property(present, queries):
    arr = np.array(present, dtype=np.int64).reshape(-1, 3)
    ks = KeySet.from_indexes(arr)
    q = np.array(queries + present, dtype=np.int64).reshape(-1, 3)
    got = ks.position(pack(q)).tolist()
    where = {tuple(p): i for i, p in enumerate(present)}
    assert got == [where.get(tuple(row), -1) for row in q.tolist()]


def test_sort_order_txn_is_t_then_x_then_n():
    idx = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0], [1, -1, 5], [2, 0, 0]])
    order = sort_order_txn(idx)
    got = [tuple(r) for r in idx[order].tolist()]
    assert got == sorted(got, key=lambda r: (r[1], r[2], r[0]))
    assert got == [(1, -1, 5), (0, 0, 0), (1, 0, 0), (2, 0, 0), (0, 0, 1), (0, 1, 0)]


@given(st.lists(index_triples, min_size=1, max_size=40))
@settings(max_examples=100, deadline=None)
def test_sort_order_txn_property(triples):
    idx = np.array(triples, dtype=np.int64)
    got = [tuple(r) for r in idx[sort_order_txn(idx)].tolist()]
    assert got == sorted(map(tuple, triples), key=lambda r: (r[1], r[2], r[0]))


def test_as_indexes_shapes():
    assert as_indexes([]).shape == (0, 3)
    assert as_indexes([[0, 1, 2]]).dtype == np.int64
    with pytest.raises(ValueError, match=r"\(k, 3\)"):
        as_indexes([[0, 1]])
    with pytest.raises(ValueError):
        as_indexes([0, 1, 2])


def test_index_defaults_and_describe():
    assert Index() == (0, 0, 0)
    assert Index(t=3) == (0, 3, 0)
    text = describe(np.array([[0, t, 0] for t in range(8)]), limit=2)
    assert text.startswith("(n=0, t=0, x=0), (n=0, t=1, x=0)")
    assert "8 in all" in text


def test_check_range_accepts_the_packable_range_and_rejects_beyond():
    from pynnet3.index import check_range

    check_range(np.array([[0, -(1 << 24), -100], [(1 << 18) - 1, (1 << 24), 100]]))
    for bad in ([[1 << 18, 0, 0]], [[0, -(1 << 25) - 1, 0]], [[0, 0, 1 << 14]]):
        with pytest.raises(ValueError, match="values must lie in"):
            check_range(np.array(bad))


def test_a_request_with_unpackable_indexes_is_rejected():
    from pynnet3 import IoSpecification
    from pynnet3.errors import ComputeError

    with pytest.raises(ComputeError, match="'input'.*t values"):
        IoSpecification("input", np.array([[0, 1 << 30, 0]]))


@given(st.lists(st.integers(-(2**62), 2**62), max_size=60))
def test_unique_keys_and_inverse_match_numpy_unique(values):
    """The sort-based uniques equal numpy's (sorted unique values; inverse maps
    each value to its position among them)."""
    from pynnet3.index import unique_inverse, unique_keys

    arr = np.array(values, dtype=np.int64)
    want, want_inv = np.unique(arr, return_inverse=True)
    assert np.array_equal(unique_keys(arr), want)
    got, inv = unique_inverse(arr)
    assert np.array_equal(got, want)
    assert np.array_equal(inv, want_inv.reshape(-1))
    assert np.array_equal(got[inv], arr)
