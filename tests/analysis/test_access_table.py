"""The vectorized analysis (AccessTable and everything derived from it) against
straightforward per-command / per-cell reference computations written here."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pynnet3
from pynnet3.analysis import Analyzer, ComputationVariables
from pynnet3.analysis.accesses import build_access_table, command_accesses
from pynnet3.computation import CommandType as CT
from pynnet3.optimize import OptimizeOptions
from tests.compiler import nets
from tests.reference import require_reference

_GENERATED = ["generated/case_3", "generated/case_9", "generated/case_24"]


def _small(config: str, opts):
    nnet = pynnet3.Nnet.from_config(config, seed=1)
    req = nets.request({"input": nets.frames(-4, 8, n=2)}, {"output": nets.frames(0, 4, n=2)},
                       input_deriv=True, output_deriv=True, model=True)
    return nnet, pynnet3.compile(nnet, req, optimize=opts)


def _reference_case(rel: str, opts):
    case = require_reference() / rel
    nnet = pynnet3.read_nnet(str(case / "model.txt"))
    req = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
    return nnet, pynnet3.compile(nnet, req, optimize=opts)


_OPTS = {
    "unoptimized": False,
    "default": OptimizeOptions(),
    # lossy compression: COMPRESS/DECOMPRESS commands on many matrices
    "compressed": OptimizeOptions(memory_compression_level=2),
    # Kaldi's pairing: more SWAP_MATRIX commands
    "swaps": OptimizeOptions(allocate_from_other_peak_aware=False),
}
_CASES = [("tdnn", k) for k in _OPTS] + [("rnn", k) for k in _OPTS] + \
    [(g, k) for g in _GENERATED for k in ("unoptimized", "default", "compressed")] + \
    [("synthetic", "unoptimized")]


def _synthetic():
    """The unoptimized TDNN computation with every multi-row command kind appended
    (gathers and scatters, full and partial, repeated targets) and a compression
    named by matrix: the access rules under test do not need a runnable order."""
    from pynnet3.computation import Command

    nnet, c = _small(nets.TDNN, False)
    subs = c.submatrices
    # a (read, or scattered into) and b (the command's own rows): same width, other
    # matrices, b at least as tall as a so a scatter can cover all of a
    a, b = next((x, y) for x in range(1, len(subs)) for y in range(1, len(subs))
                if subs[x].matrix != subs[y].matrix and subs[x].num_cols == subs[y].num_cols
                and subs[y].num_rows >= subs[x].num_rows >= 2)
    rows_b = c.submatrices[b].num_rows
    k = len(c.indexes_multi)
    full = np.stack([np.full(rows_b, a), np.arange(rows_b) % c.submatrices[a].num_rows], axis=1)
    c.indexes_multi += [
        full,  # every row of a read
        np.where(np.arange(rows_b)[:, None] % 2 == 0, full, -1),  # with (-1, -1) rows
        np.stack([np.full(rows_b, a), np.zeros(rows_b, dtype=np.int64)], axis=1),  # row 0 only
    ]
    for cmd_type, table, own in ((CT.COPY_ROWS_MULTI, k, b), (CT.COPY_ROWS_MULTI, k + 1, b),
                                 (CT.ADD_ROWS_MULTI, k, b), (CT.COPY_TO_ROWS_MULTI, k, b),
                                 (CT.COPY_TO_ROWS_MULTI, k + 2, b),
                                 (CT.ADD_TO_ROWS_MULTI, k + 1, b)):
        field = "src" if cmd_type in (CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI) else "dst"
        c.commands.append(Command(cmd_type, table=table, **{field: own}))
    m = c.submatrices[a].matrix
    c.commands += [Command(CT.COMPRESS_MATRIX, matrix=m, compress_kind=3, alpha=10.0),
                   Command(CT.DECOMPRESS_MATRIX, dst=c.whole(m), compress_kind=3, alpha=10.0)]
    return nnet, c


@pytest.fixture(scope="module", params=_CASES, ids=lambda p: f"{p[0]}-{p[1]}")
def computation(request):
    which, opts = request.param
    if which == "tdnn":
        return _small(nets.TDNN, _OPTS[opts])
    if which == "rnn":
        return _small(nets.RNN, _OPTS[opts])
    if which == "synthetic":
        return _synthetic()
    return _reference_case(which, _OPTS[opts])


def test_table_lists_command_accesses_in_order(computation):
    nnet, c = computation
    t = build_access_table(c, nnet)
    got: list[list] = [[] for _ in c.commands]
    for i, s, a in zip(t.cmd.tolist(), t.sub.tolist(), t.acc.tolist(), strict=True):
        got[i].append((s, a))
    for i, cmd in enumerate(c.commands):
        want = [(s, int(a)) for s, a in command_accesses(c, nnet, cmd)]
        assert got[i] == want, (i, cmd)


def test_table_lifetimes(computation):
    nnet, c = computation
    t = build_access_table(c, nnet)
    nm = len(c.matrices)
    alloc, dealloc = [-1] * nm, [-1] * nm
    alloc_only, dealloc_only, accept = [-1] * nm, [-1] * nm, [-1] * nm
    is_in, is_out = [False] * nm, [False] * nm
    zeroing, side = [], []
    for i, cmd in enumerate(c.commands):
        if cmd.type is CT.ALLOC_MATRIX:
            alloc[cmd.matrix] = alloc_only[cmd.matrix] = i
        elif cmd.type is CT.DEALLOC_MATRIX:
            dealloc[cmd.matrix] = dealloc_only[cmd.matrix] = i
        elif cmd.type is CT.SWAP_MATRIX:
            alloc[cmd.matrix] = dealloc[cmd.src_matrix] = i
        elif cmd.type is CT.ACCEPT_INPUT:
            m = c.submatrices[cmd.dst].matrix
            if not is_in[m]:
                accept[m] = i
            is_in[m] = True
        elif cmd.type is CT.PROVIDE_OUTPUT:
            m = c.submatrices[cmd.src].matrix
            is_out[m] = True
            if cmd.release:
                dealloc[m] = i
        zeroing.append(cmd.type is CT.SET_CONST and cmd.alpha == 0.0)
        side.append(cmd.type is CT.BACKPROP or (cmd.type is CT.PROPAGATE and cmd.alpha == 2.0))
    assert t.alloc.tolist() == alloc and t.dealloc.tolist() == dealloc
    assert t.alloc_only.tolist() == alloc_only and t.dealloc_only.tolist() == dealloc_only
    assert t.accept.tolist() == accept
    assert t.is_input.tolist() == is_in and t.is_output.tolist() == is_out
    assert t.zeroing.tolist() == zeroing and t.side_effects.tolist() == side
    assert t.sub_matrix.tolist() == [sm.matrix for sm in c.submatrices]


def test_table_lifetimes_take_the_last_event_in_command_order():
    """Swaps and releasing outputs before, between and after plain (de)allocations
    of the same matrices: each lifetime field is the last event naming the matrix."""
    from pynnet3.computation import Command, NnetComputation

    c = NnetComputation()
    m1, m2, m3 = (c.new_matrix(4, 3) for _ in range(3))
    c.commands = [
        Command(CT.SWAP_MATRIX, matrix=m1, src_matrix=m2),  # before m1's ALLOC
        Command(CT.ALLOC_MATRIX, matrix=m1),
        Command(CT.ACCEPT_INPUT, dst=c.whole(m3), node="input"),
        Command(CT.ACCEPT_INPUT, dst=c.whole(m3), node="input"),  # not the first accept
        Command(CT.DEALLOC_MATRIX, matrix=m2),  # after m2 was swapped away
        Command(CT.ALLOC_MATRIX, matrix=m2),
        Command(CT.SWAP_MATRIX, matrix=m2, src_matrix=m1),  # after m2's ALLOC
        Command(CT.PROVIDE_OUTPUT, src=c.whole(m3), node="output", release=True),
        Command(CT.DEALLOC_MATRIX, matrix=m3),  # after the release
    ]
    test_table_lifetimes((None, c))
    t = build_access_table(c, None)
    assert t.alloc.tolist() == [-1, 1, 6, -1] and t.dealloc.tolist() == [-1, 6, 4, 8]
    assert t.accept.tolist() == [-1, -1, -1, 2]


def test_matrix_accesses_match_per_command_reference(computation):
    nnet, c = computation
    a = Analyzer(c, nnet)
    want: list[list] = [[] for _ in c.matrices]
    for i, cmd in enumerate(c.commands):
        per: dict[int, int] = {}
        for s, acc in command_accesses(c, nnet, cmd):
            m = c.submatrices[s].matrix
            per[m] = per.get(m, 0) | int(acc)
        for m, acc in per.items():
            want[m].append((i, acc))
    ma = a.matrix_arrays
    for m in range(len(c.matrices)):
        lo, hi = ma.ptr[m], ma.ptr[m + 1]
        assert list(zip(ma.command[lo:hi].tolist(), ma.access[lo:hi].tolist(),
                        strict=True)) == want[m]
        assert [(i, int(x)) for i, x in a.matrix_accesses[m].accesses] == want[m]
    has = [bool(w) for w in want]
    first = [w[0][0] if w else -1 for w in want]
    last = [w[-1][0] if w else -1 for w in want]
    assert ma.first(-1).tolist() == first and ma.last(-1).tolist() == last
    zero = [cmd.type is CT.SET_CONST and cmd.alpha == 0.0 for cmd in c.commands]
    nontrivial = [next((i for i, _ in w if not zero[i]), len(c.commands)) for w in want]
    assert a.first_nontrivial_matrix_accesses().tolist() == nontrivial
    for m in range(1, len(c.matrices)):
        assert a.first_nontrivial_matrix_access(m) == nontrivial[m]
        assert a.last_matrix_access(m) == (last[m] if has[m] else -1)


def _paint(c):
    """Reference variables: per matrix, the cells cut by every submatrix boundary,
    numbered row-major after the previous matrices' cells; returns (grid per matrix,
    variable ids of each submatrix)."""
    grids = [None]
    base = 0
    for m in range(1, len(c.matrices)):
        info = c.matrices[m]
        rows, cols = {0, info.rows}, {0, info.cols}
        for sm in c.submatrices[1:]:
            if sm.matrix == m:
                rows |= {sm.row_offset, sm.row_offset + sm.num_rows}
                cols |= {sm.col_offset, sm.col_offset + sm.num_cols}
        rows, cols = sorted(rows), sorted(cols)
        grid = np.zeros((info.rows, info.cols), dtype=np.int64)
        for r in range(len(rows) - 1):
            for k in range(len(cols) - 1):
                grid[rows[r]:rows[r + 1], cols[k]:cols[k + 1]] = base + r * (len(cols) - 1) + k
        base += (len(rows) - 1) * (len(cols) - 1)
        grids.append(grid)
    sub_vars = [np.zeros(0, dtype=np.int64)]
    for sm in c.submatrices[1:]:
        cells = grids[sm.matrix][sm.row_offset:sm.row_offset + sm.num_rows,
                                 sm.col_offset:sm.col_offset + sm.num_cols]
        sub_vars.append(np.unique(cells))
    return grids, sub_vars, base


def test_variables_match_painted_cells(computation):
    _, c = computation
    v = ComputationVariables(c)
    _, sub_vars, total = _paint(c)
    assert v.num_variables == total
    for s in range(len(c.submatrices)):
        assert v.submatrix_variables(s).tolist() == sub_vars[s].tolist()


def test_variable_accesses_match_painted_reference(computation):
    nnet, c = computation
    a = Analyzer(c, nnet)
    _, sub_vars, total = _paint(c)
    per_var: list[dict[int, int]] = [{} for _ in range(total)]
    for i, cmd in enumerate(c.commands):
        for s, acc in command_accesses(c, nnet, cmd):
            if s:
                for v in sub_vars[s].tolist():
                    per_var[v][i] = per_var[v].get(i, 0) | int(acc)
    va = a.variable_accesses
    assert len(va.ptr) == total + 1
    for v in range(total):
        cmds, acc = va.of(v)
        assert list(zip(cmds.tolist(), acc.tolist(), strict=True)) == sorted(per_var[v].items())
    # per-command attributes agree with the same reference
    for i in range(len(c.commands)):
        attrs = a.command_attributes[i]
        rd = sorted(v for v in range(total) if per_var[v].get(i, 0) & 1)
        wr = sorted(v for v in range(total) if per_var[v].get(i, 0) & 2)
        assert attrs.variables_read.tolist() == rd and attrs.variables_written.tolist() == wr


def test_submatrix_queries_match_reference(computation):
    nnet, c = computation
    a = Analyzer(c, nnet)
    _, sub_vars, total = _paint(c)
    touched: list[list] = [[] for _ in range(total)]
    for i, cmd in enumerate(c.commands):
        for s, acc in command_accesses(c, nnet, cmd):
            if s:
                for v in sub_vars[s].tolist():
                    touched[v].append((i, int(acc)))
    n = len(c.commands)
    zero = [cmd.type is CT.SET_CONST and cmd.alpha == 0.0 for cmd in c.commands]
    for s in range(1, len(c.submatrices)):
        entries = [e for v in sub_vars[s].tolist() for e in touched[v]]
        cmds = sorted({i for i, _ in entries})
        writes = [i for i, acc in entries if acc & 2]
        assert a.first_access(s) == (cmds[0] if cmds else n)
        assert a.last_access(s) == (cmds[-1] if cmds else -1)
        assert a.first_nontrivial_access(s) == next((i for i in cmds if not zero[i]), n)
        assert a.last_write_access(s) == (max(writes) if writes else -1)


def test_cases_cover_the_rarer_commands():
    """The fixtures above do exercise the rarer command types and forms."""
    _, c = _synthetic()
    kinds = {cmd.type for cmd in c.commands}
    assert {CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI,
            CT.ADD_TO_ROWS_MULTI} <= kinds
    # a scatter that writes all of its target, and one that does not
    nnet = pynnet3.Nnet.from_config(nets.TDNN, seed=1)
    scatters = [acc for cmd in c.commands if cmd.type is CT.COPY_TO_ROWS_MULTI
                for _, acc in command_accesses(c, nnet, cmd)[1:]]
    assert {int(x) for x in scatters} == {2, 3}
    seen = set()
    for which in ("tdnn", "rnn"):
        for opts in _OPTS.values():
            _, c = _small(nets.TDNN if which == "tdnn" else nets.RNN, opts)
            seen |= {cmd.type for cmd in c.commands}
            seen |= {"release" for cmd in c.commands if cmd.release}
    assert {CT.SWAP_MATRIX, CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX, "release"} <= seen


def test_memory_profile_agrees_with_peak_memory(computation):
    """memory_profile's peak is peak_memory_floats; where nothing is compressed and
    no temporary is gathered at the peak, the matrices live there add up to it."""
    from pynnet3.analysis.memory import live_floats, memory_profile

    _, c = computation
    compressed = any(cmd.type in (CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX)
                     for cmd in c.commands)
    prof = memory_profile(c)
    assert prof.peak_floats == c.peak_memory_floats()
    live, _ = live_floats(c)
    assert np.array_equal(live, prof.live_floats)
    gathering = prof.peak_command >= 0 and c.commands[prof.peak_command].table >= 0 and \
        c.commands[prof.peak_command].in_value == 0
    if prof.peak_command >= 0 and not compressed and not gathering:
        # the matrices live at the peak add up to it, and it is the first time reached
        _, at_peak = live_floats(c, prof.peak_command)
        assert sorted(prof.live_at_peak) == sorted(at_peak)
        assert sum(at_peak.values()) == prof.peak_floats
        assert (live[:prof.peak_command] < prof.peak_floats).all()
