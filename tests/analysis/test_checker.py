"""The checker accepts every compiled computation and rejects broken ones, naming
the command and variable at fault."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import pynnet3
from pynnet3.analysis import AccessType, Analyzer, check_computation
from pynnet3.computation import Command
from pynnet3.computation import CommandType as CT
from pynnet3.errors import CheckError
from tests.compiler import nets
from tests.reference import REF, require_reference


def _tdnn():
    nnet = pynnet3.Nnet.from_config(nets.TDNN, seed=1)
    req = nets.request({"input": nets.frames(-4, 8, n=2)}, {"output": nets.frames(0, 4, n=2)},
                       input_deriv=True, output_deriv=True, model=True)
    return nnet, pynnet3.compile(nnet, req, optimize=False)


@pytest.fixture()
def tdnn():
    return _tdnn()


def _first(c, t, pred=lambda cmd: True):
    return next(i for i, cmd in enumerate(c.commands) if cmd.type is t and pred(cmd))


def test_accepts_compiled(tdnn):
    nnet, c = tdnn
    check_computation(c, nnet)
    pynnet3.check(c, nnet)


def test_accepts_reference_cases():
    require_reference()
    cases = sorted(p.parent for p in (REF / "realistic").rglob("request.json"))
    assert cases
    for case in cases:
        nnet = pynnet3.read_nnet(str(case.parent / "model.txt"))
        req = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
        check_computation(pynnet3.compile(nnet, req, optimize=False), nnet, context=str(case))


def test_read_of_undefined_data(tdnn):
    nnet, c = tdnn
    # drop the zeroing of a matrix that is then added to: the addition reads undefined data
    a = Analyzer(c, nnet)
    z = next(acc[0][0] for acc in (ma.accesses for ma in a.matrix_accesses[1:])
             if len(acc) > 1 and c.commands[acc[0][0]].type is CT.SET_CONST
             and acc[1][1] & AccessType.READ)
    c.commands[z] = Command(CT.NO_OPERATION)
    with pytest.raises(CheckError, match=r"command \d+ .*undefined data of variable m\d+"):
        check_computation(c, nnet, context="after pass 'x'")
    with pytest.raises(CheckError, match="after pass 'x'"):
        check_computation(c, nnet, context="after pass 'x'")


def test_use_after_deallocation(tdnn):
    nnet, c = tdnn
    i = _first(c, CT.PROPAGATE)
    m = c.submatrices[c.commands[i].in_value].matrix
    d = _first(c, CT.DEALLOC_MATRIX, lambda cmd: cmd.matrix == m)
    cmd = c.commands.pop(d)
    c.commands.insert(i, cmd)
    with pytest.raises(CheckError, match="after it is deallocated"):
        check_computation(c, nnet)


def test_use_before_allocation(tdnn):
    nnet, c = tdnn
    i = _first(c, CT.PROPAGATE)
    m = c.submatrices[c.commands[i].out_value].matrix
    a = _first(c, CT.ALLOC_MATRIX, lambda cmd: cmd.matrix == m)
    cmd = c.commands.pop(a)
    c.commands.insert(len(c.commands) - 1, cmd)
    with pytest.raises(CheckError, match="before it is allocated|undefined"):
        check_computation(c, nnet)


def test_not_deallocated(tdnn):
    nnet, c = tdnn
    d = _first(c, CT.DEALLOC_MATRIX)
    c.commands[d] = Command(CT.NO_OPERATION)
    with pytest.raises(CheckError, match="never deallocated"):
        check_computation(c, nnet)


def test_double_allocation(tdnn):
    nnet, c = tdnn
    a = _first(c, CT.ALLOC_MATRIX)
    c.commands.insert(a, copy.copy(c.commands[a]))
    with pytest.raises(CheckError, match="allocated twice"):
        check_computation(c, nnet)


def test_index_table_out_of_range(tdnn):
    nnet, c = tdnn
    i = next(i for i, cmd in enumerate(c.commands) if cmd.type in (CT.COPY_ROWS, CT.ADD_ROWS))
    cmd = c.commands[i]
    tab = c.indexes[cmd.table].copy()
    tab[0] = c.submatrices[cmd.src].num_rows
    c.indexes[cmd.table] = tab
    with pytest.raises(CheckError, match=f"command {i} .*out of range"):
        check_computation(c, nnet)


def test_dims_mismatch(tdnn):
    nnet, c = tdnn
    i = _first(c, CT.PROPAGATE)
    cmd = c.commands[i]
    sm = c.submatrices[cmd.out_value]
    cmd.out_value = c.new_submatrix(sm.matrix, 0, sm.num_rows, 0, sm.num_cols - 1)
    with pytest.raises(CheckError, match=f"command {i} .*component"):
        check_computation(c, nnet)


def test_backprop_before_marker(tdnn):
    nnet, c = tdnn
    b = _first(c, CT.BACKPROP)
    mk = _first(c, CT.NO_OPERATION_MARKER)
    cmd = c.commands.pop(b)
    c.commands.insert(mk, cmd)
    with pytest.raises(CheckError, match="before the forward/backward marker"):
        check_computation(c, nnet)


def test_submatrix_outside_matrix(tdnn):
    nnet, c = tdnn
    sm = c.submatrices[1]
    c.submatrices[1] = type(sm)(sm.matrix, sm.row_offset + 1, sm.num_rows, sm.col_offset,
                                sm.num_cols)
    with pytest.raises(CheckError, match="does not fit"):
        check_computation(c, nnet)


def test_overlapping_copy(tdnn):
    nnet, c = tdnn
    i = _first(c, CT.PROPAGATE)
    m = c.submatrices[c.commands[i].out_value].matrix
    rows = c.matrices[m].rows
    a = c.new_submatrix(m, 0, rows - 1, 0, c.matrices[m].cols)
    b = c.new_submatrix(m, 1, rows - 1, 0, c.matrices[m].cols)
    c.commands.insert(i + 1, Command(CT.MATRIX_ADD, dst=a, src=b))
    with pytest.raises(CheckError, match="overlap"):
        check_computation(c, nnet)


def test_io_node_kind(tdnn):
    nnet, c = tdnn
    i = _first(c, CT.ACCEPT_INPUT, lambda cmd: not cmd.is_deriv)
    c.commands[i].node = "output"
    with pytest.raises(CheckError, match="not an input-node"):
        check_computation(c, nnet)


def test_every_pass_keeps_the_checker_happy():
    """The optimizer's check mode runs the checker after each pass."""
    nnet, c = _tdnn()
    report = pynnet3.optimize.OptimizeReport()
    pynnet3.optimize.optimize(c, nnet, pynnet3.OptimizeOptions(), report=report, check=True)
    assert report.passes
    assert np.all([p.num_commands > 0 for p in report.passes])


def test_compressed_matrix_read_through_a_multi_table(tdnn):
    """A row table naming a compressed matrix is an access to it too."""
    nnet, c = tdnn
    i = _first(c, CT.PROPAGATE)
    m = c.submatrices[c.commands[i].out_value].matrix
    rows, cols = c.matrices[m].rows, c.matrices[m].cols
    n = c.new_matrix(rows, cols)
    c.indexes_multi.append(np.array([[c.whole(m), r] for r in range(rows)], dtype=np.int64))
    c.commands[i + 1:i + 1] = [
        Command(CT.COMPRESS_MATRIX, dst=c.whole(m), compress_kind=3, alpha=10.0),
        Command(CT.ALLOC_MATRIX, matrix=n),
        Command(CT.SET_CONST, dst=c.whole(n), alpha=0.0),
        Command(CT.ADD_ROWS_MULTI, dst=c.whole(n), table=len(c.indexes_multi) - 1),
        Command(CT.DEALLOC_MATRIX, matrix=n),
        Command(CT.DECOMPRESS_MATRIX, dst=c.whole(m), compress_kind=3, alpha=10.0)]
    with pytest.raises(CheckError, match=f"command {i + 4} .*accessed while compressed"):
        check_computation(c, nnet)
