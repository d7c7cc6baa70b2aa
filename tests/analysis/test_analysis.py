"""Analysis: variables partition every matrix, accesses follow command semantics."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.analysis import AccessType, Analyzer
from pynnet3.computation import CommandType as CT
from tests.compiler import nets


def _compiled(config: str, model: bool = True):
    nnet = pynnet3.Nnet.from_config(config, seed=1)
    req = nets.request({"input": nets.frames(-4, 8, n=2)}, {"output": nets.frames(0, 4, n=2)},
                       input_deriv=True, output_deriv=True, model=model)
    return nnet, pynnet3.compile(nnet, req, optimize=False)


@pytest.fixture(scope="module")
def tdnn():
    return _compiled(nets.TDNN)


@pytest.fixture(scope="module")
def rnn():
    nnet = pynnet3.Nnet.from_config(nets.RNN, seed=1)
    req = nets.request({"input": nets.frames(0, 6)}, {"output": nets.frames(0, 4)},
                       input_deriv=True, output_deriv=True, model=True)
    return nnet, pynnet3.compile(nnet, req, optimize=False)


@pytest.mark.parametrize("which", ["tdnn", "rnn"])
def test_variables_partition_each_submatrix(which, request):
    nnet, c = request.getfixturevalue(which)
    a = Analyzer(c, nnet)
    v = a.variables
    # paint each matrix cell with its variable id; a submatrix's cells must be exactly
    # its variables, and the variables of a matrix must tile it
    paint = {}
    for m in range(1, len(c.matrices)):
        info = c.matrices[m]
        grid = np.full((info.rows, info.cols), -1)
        rp, cp = v.row_points[m], v.col_points[m]
        ncell = len(cp) - 1
        for r in range(len(rp) - 1):
            for k in range(ncell):
                grid[rp[r]:rp[r + 1], cp[k]:cp[k + 1]] = v.base[m] + r * ncell + k
        assert (grid >= 0).all()
        assert set(np.unique(grid)) == set(v.matrix_variables(m).tolist())
        paint[m] = grid
    for s in range(1, len(c.submatrices)):
        sm = c.submatrices[s]
        cells = paint[sm.matrix][sm.row_offset:sm.row_offset + sm.num_rows,
                                 sm.col_offset:sm.col_offset + sm.num_cols]
        assert sorted(np.unique(cells).tolist()) == v.submatrix_variables(s).tolist()
        # exact union: no variable sticks out of the submatrix
        outside = paint[sm.matrix].copy()
        outside[sm.row_offset:sm.row_offset + sm.num_rows,
                sm.col_offset:sm.col_offset + sm.num_cols] = -1
        assert not set(np.unique(outside).tolist()) & set(cells.ravel().tolist())


def test_command_accesses_follow_semantics(tdnn):
    nnet, c = tdnn
    a = Analyzer(c, nnet)
    seen = set()
    for i, cmd in enumerate(c.commands):
        attrs = a.command_attributes[i]
        if cmd.type is CT.PROPAGATE:
            assert c.submatrices[cmd.out_value].matrix in attrs.matrices_written
            assert c.submatrices[cmd.in_value].matrix in attrs.matrices_read
            seen.add("prop")
        elif cmd.type is CT.ADD_ROWS or cmd.type is CT.MATRIX_ADD:
            # an addition reads its destination too
            dv = a.variables.submatrix_variables(cmd.dst)
            assert set(dv.tolist()) <= set(attrs.variables_read.tolist())
            assert set(dv.tolist()) <= set(attrs.variables_written.tolist())
            seen.add("add")
        elif cmd.type is CT.BACKPROP:
            assert attrs.has_side_effects
            seen.add("backprop")
        elif cmd.type is CT.SET_CONST:
            assert not len(attrs.variables_read)
    assert seen == {"prop", "add", "backprop"}


def test_variable_accesses_are_ordered_and_merged(rnn):
    nnet, c = rnn
    a = Analyzer(c, nnet)
    va = a.variable_accesses
    for v in range(a.variables.num_variables):
        cmds, acc = va.of(v)
        assert (np.diff(cmds) > 0).all()  # one entry per command, ascending
        for i, ac in zip(cmds, acc, strict=True):
            attrs = a.command_attributes[i]
            r = v in attrs.variables_read
            w = v in attrs.variables_written
            assert ac == (AccessType.READ * r | AccessType.WRITE * w)


def test_matrix_accesses(tdnn):
    nnet, c = tdnn
    a = Analyzer(c, nnet)
    for m in range(1, len(c.matrices)):
        ma = a.matrix_accesses[m]
        if ma.allocate_command >= 0:
            cmd = c.commands[ma.allocate_command]
            assert cmd.type is CT.ALLOC_MATRIX and cmd.matrix == m
        if ma.deallocate_command >= 0:
            cmd = c.commands[ma.deallocate_command]
            assert cmd.type is CT.DEALLOC_MATRIX and cmd.matrix == m
        firsts = [i for i, _ in ma.accesses]
        assert firsts == sorted(firsts)
    inputs = {c.submatrices[cmd.dst].matrix for cmd in c.commands if cmd.type is CT.ACCEPT_INPUT}
    outputs = {c.submatrices[cmd.src].matrix for cmd in c.commands
               if cmd.type is CT.PROVIDE_OUTPUT}
    assert {m for m in range(len(c.matrices)) if a.matrix_accesses[m].is_input} == inputs
    assert {m for m in range(len(c.matrices)) if a.matrix_accesses[m].is_output} == outputs


def test_queries(tdnn):
    nnet, c = tdnn
    a = Analyzer(c, nnet)
    for cmd_i, cmd in enumerate(c.commands):
        if cmd.type is CT.PROPAGATE:
            s = cmd.out_value
            # the output was zeroed when allocated; the propagate is the first
            # non-trivial access, and nothing but zeroing comes before it
            assert a.first_nontrivial_access(s) == cmd_i
            assert a.first_access(s) <= cmd_i
            assert a.last_access(s) >= cmd_i
            assert a.last_write_access(s) >= cmd_i
            m = c.submatrices[s].matrix
            assert a.data_invalidated_command(cmd_i, s) == \
                a.matrix_accesses[m].deallocate_command
            assert a.first_nontrivial_matrix_access(m) == cmd_i
            break
