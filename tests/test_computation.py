"""NnetComputation's memory accounting follows Kaldi's GetMaxMemoryUse."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.computation import Command, NnetComputation, command_submatrices
from pynnet3.computation import CommandType as CT
from pynnet3.runtime.compression import UINT8


def test_peak_memory_counts_compression_and_swaps():
    c = NnetComputation()
    a = c.new_matrix(10, 10)
    b = c.new_matrix(5, 4)
    d = c.new_matrix(10, 10)
    c.add(Command(CT.ALLOC_MATRIX, matrix=a))            # 100 floats
    c.add(Command(CT.COMPRESS_MATRIX, dst=c.whole(a), compress_kind=UINT8))  # 25
    c.add(Command(CT.ALLOC_MATRIX, matrix=b))            # 45
    c.add(Command(CT.DEALLOC_MATRIX, matrix=b))          # 25
    c.add(Command(CT.DECOMPRESS_MATRIX, dst=c.whole(a), compress_kind=UINT8))  # 100
    c.add(Command(CT.SWAP_MATRIX, matrix=d, src_matrix=a))  # swaps cost nothing: 100
    c.add(Command(CT.DEALLOC_MATRIX, matrix=d))          # 0
    assert c.peak_memory_floats() == 100
    c.commands.insert(4, Command(CT.ALLOC_MATRIX, matrix=b))  # 25 + 20 = 45 while packed
    c.commands.insert(6, Command(CT.DEALLOC_MATRIX, matrix=b))  # after decompress: 120
    assert c.peak_memory_floats() == 120


def test_copy_is_independent():
    c = NnetComputation()
    a = c.new_matrix(3, 2)
    c.add(Command(CT.ALLOC_MATRIX, matrix=a))
    c.add(Command(CT.SET_CONST, dst=c.whole(a), alpha=0.0))
    c.add(Command(CT.DEALLOC_MATRIX, matrix=a))
    d = c.copy()
    d.commands[1].alpha = 5.0
    d.commands.pop()
    d.matrices[a].rows = 7
    assert c.commands[1].alpha == 0.0 and len(c.commands) == 3 and c.matrices[a].rows == 3
    assert d.whole(a) == c.whole(a)


def test_command_submatrices_includes_tables():
    c = NnetComputation()
    a, b = c.new_matrix(4, 2), c.new_matrix(4, 2)
    c.indexes_multi.append(np.array([[c.whole(b), 0], [-1, -1], [c.whole(b), 3], [-1, -1]]))
    cmd = Command(CT.ADD_ROWS_MULTI, dst=c.whole(a), table=0)
    assert command_submatrices(c, cmd) == [c.whole(a), c.whole(b)]
    c.indexes_blocks.append(np.array([c.whole(a), c.whole(b)]))
    prop = Command(CT.PROPAGATE, out_value=c.whole(b), table=0)
    assert command_submatrices(c, prop) == [c.whole(b), c.whole(a), c.whole(b)]


def test_submatrix_is_an_immutable_named_tuple():
    """Made by the compiler's fast constructor or by name, a SubMatrix reads its
    fields by name and position, compares and hashes by value, and cannot change."""
    from pynnet3.computation import SubMatrix, make_submatrix

    sm = SubMatrix(1, 2, 3, 4, 5)
    fast = make_submatrix(1, 2, 3, 4, 5)
    assert type(fast) is SubMatrix and fast == sm and hash(fast) == hash(sm)
    assert (sm.matrix, sm.row_offset, sm.num_rows, sm.col_offset, sm.num_cols) == tuple(sm)
    assert sm._replace(row_offset=6) == SubMatrix(1, 6, 3, 4, 5)
    with pytest.raises(AttributeError):
        sm.num_rows = 9
