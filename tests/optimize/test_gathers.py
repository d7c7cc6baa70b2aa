"""share_identical_gathers: a repeated gather of the same rows becomes an assignment
(and merging removes it). Values: the same computation with the pass off."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.computation import Command, NnetComputation
from pynnet3.computation import CommandType as CT
from pynnet3.optimize import OptimizeOptions
from pynnet3.optimize.gathers import share_identical_gathers
from tests.compiler import nets
from tests.optimize.test_permute import RECURRENT_HEADS

OFF = OptimizeOptions(share_identical_gathers=False)


def _gathers(c) -> int:
    return sum(1 for cmd in c.commands if cmd.type in (CT.COPY_ROWS, CT.COPY_ROWS_MULTI))


@pytest.mark.parametrize("n", [1, 3])
def test_two_heads_share_one_gathered_input(n):
    nnet = pynnet3.Nnet.from_config(RECURRENT_HEADS, seed=2)
    nets.to_float64(nnet)
    req = nets.request({"input": nets.frames(-2, 8, n=n)},
                       {"output": nets.frames(0, 6, n=n), "output-xent": nets.frames(0, 6, n=n)})
    rng = np.random.default_rng(1)
    x = nets.random_inputs(nnet, req, rng)
    off = pynnet3.compile(nnet, req, optimize=OFF, check=True)
    on = pynnet3.compile(nnet, req, optimize=True, check=True)
    assert _gathers(on) == _gathers(off) - 1
    heads = [cmd for cmd in on.commands if cmd.type is CT.PROPAGATE
             and cmd.node in ("head1", "head2")]
    assert len({on.submatrices[cmd.in_value].matrix for cmd in heads}) == 1
    want, got = pynnet3.run(nnet, off, x).outputs, pynnet3.run(nnet, on, x).outputs
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def _two_gathers(between=None) -> NnetComputation:
    """m3 = m1[t], [between(c)], m4 = m1[t] (all 4x2 matrices; m2 unused)."""
    c = NnetComputation()
    m1, _, m3, m4 = (c.new_matrix(4, 2) for _ in range(4))
    c.indexes.append(np.array([3, 2, 1, 0]))
    c.add(Command(CT.COPY_ROWS, dst=c.whole(m3), src=c.whole(m1), table=0))
    if between is not None:
        c.add(between(c, m1, m3))
    c.add(Command(CT.COPY_ROWS, dst=c.whole(m4), src=c.whole(m1), table=0))
    return c


def test_the_repeat_becomes_an_assignment():
    c = _two_gathers()
    assert share_identical_gathers(c, None, OptimizeOptions())
    assert c.commands[-1].type is CT.MATRIX_COPY
    assert c.commands[-1].src == c.whole(c.submatrices[c.commands[0].dst].matrix)


@pytest.mark.parametrize("between", [
    lambda c, src, first: Command(CT.SET_CONST, dst=c.whole(src), alpha=1.0),
    lambda c, src, first: Command(CT.SET_CONST, dst=c.whole(first), alpha=2.0),
    lambda c, src, first: Command(CT.DEALLOC_MATRIX, matrix=first),
], ids=["source written", "first result written", "first result freed"])
def test_not_when_something_changes_in_between(between):
    c = _two_gathers(between)
    assert not share_identical_gathers(c, None, OptimizeOptions())
    assert c.commands[-1].type is CT.COPY_ROWS


# Outputs only (the commands below say what runs).
_IO_ONLY = "\n".join(["input-node name=input dim=4"]
                     + [f"output-node name={n} input=input" for n in ("out1", "out2", "out3")])


def _gather_across_a_big_matrix() -> NnetComputation:
    """m1 = x[t] read at once; a big matrix lives and dies; m2 = x[t] again, and x
    is read after that (so it stays alive whatever happens to the repeat)."""
    c = NnetComputation()
    x = c.new_matrix(4, 4, "input")
    m1, o1, big, o2, m2 = (c.new_matrix(r, 4) for r in (4, 4, 50, 4, 4))

    def table(rows):
        c.indexes.append(np.array(rows))
        return len(c.indexes) - 1

    t = table([3, 2, 1, 0])
    c.commands = [Command(CT.ACCEPT_INPUT, dst=c.whole(x), node="input")]
    c.commands += [Command(CT.ALLOC_MATRIX, matrix=m) for m in (m1, o1, big, o2, m2)]
    c.commands += [
        Command(CT.COPY_ROWS, dst=c.whole(m1), src=c.whole(x), table=t),
        Command(CT.MATRIX_COPY, dst=c.whole(o1), src=c.whole(m1), alpha=2.0),
        Command(CT.COPY_ROWS, dst=c.whole(big), src=c.whole(x), table=table([0] * 50)),
        Command(CT.COPY_ROWS, dst=c.whole(o2), src=c.whole(big), table=table([1, 2, 3, 4])),
        Command(CT.COPY_ROWS, dst=c.whole(m2), src=c.whole(x), table=t),  # the repeat
        Command(CT.ADD_ROWS, dst=c.whole(o2), src=c.whole(x), table=table([0, 0, 1, 1])),
        Command(CT.PROVIDE_OUTPUT, src=c.whole(o1), node="out1"),
        Command(CT.PROVIDE_OUTPUT, src=c.whole(o2), node="out2"),
        Command(CT.PROVIDE_OUTPUT, src=c.whole(m2), node="out3")]
    c.commands += [Command(CT.DEALLOC_MATRIX, matrix=m) for m in (x, m1, big)]
    return c


def test_not_when_keeping_the_first_result_raises_the_peak():
    """Sharing would keep m1 alive across the big matrix (x is alive anyway): the
    peak would rise by m1's size, so the repeat stays a gather."""
    nnet = pynnet3.Nnet.from_config(_IO_ONLY)
    c = _gather_across_a_big_matrix()
    pynnet3.analysis.check_computation(c, nnet)
    x = np.random.default_rng(0).standard_normal((4, 4))
    want = pynnet3.run(nnet, c, {"input": x}, dtype=np.float64).outputs
    on, off = c.copy(), c.copy()
    pynnet3.optimize.optimize(on, nnet, OptimizeOptions(), check=True)
    pynnet3.optimize.optimize(off, nnet, OFF, check=True)
    assert on.peak_memory_floats() <= off.peak_memory_floats()
    assert _gathers(on) == _gathers(off)
    got = pynnet3.run(nnet, on, {"input": x}, dtype=np.float64).outputs
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)
