"""runtime/arena.py: a shared forward program bound, from its second run on, to
buffers kept between runs gives the floats the unbound program gives, run after
run, and hands out nothing that a later run overwrites."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest

import pynnet3
from pynnet3.computation import CommandType as CT
from pynnet3.errors import PynnetError
from pynnet3.runtime import arena as A
from pynnet3.runtime import program as P
from pynnet3.runtime.computer import NnetComputer
from tests.compiler import nets as N
from tests.compiler.test_commands import CASES
from tests.reference import REF, needs_reference

F32 = np.dtype(np.float32)


def _unbound(nnet, c, x):
    """The result of the program without an arena: a copy of ``c`` (a program of its
    own) run once."""
    return NnetComputer(nnet, c.copy(), cache_program=True).run(x)


def _check_runs(nnet, c, inputs: list[dict], want_arena: bool = True) -> None:
    """Run ``c`` (shared) on each input in turn; every result equals the unbound
    program's bit for bit, and from the second run on the arena is what ran."""
    results = []
    for k, x in enumerate(inputs):
        got = NnetComputer(nnet, c, cache_program=True).run(x)
        want = _unbound(nnet, c, x)
        assert got.outputs.keys() == want.outputs.keys()
        for name in want.outputs:
            np.testing.assert_array_equal(got.outputs[name], want.outputs[name])
        results.append(got)
        entry = P.program_for(c).arenas.get(F32)
        if k == 0:
            assert entry is True  # (a first run binds nothing)
        else:
            assert isinstance(entry, A.Arena) == want_arena
    # nothing handed out is a buffer: results of different runs stay apart
    for r1, r2 in zip(results, results[1:], strict=False):
        for name in r1.outputs:
            assert not np.shares_memory(r1.outputs[name], r2.outputs[name])


@pytest.mark.parametrize("optimize", [False, True], ids=["plain", "optimized"])
@pytest.mark.parametrize("name", list(CASES))
def test_bound_runs_equal_the_program(name, optimize):
    cfg, inputs, outputs = CASES[name]
    nnet = pynnet3.Nnet.from_config(cfg, seed=1)
    req = N.request(inputs, outputs)
    c = pynnet3.compile(nnet, req, optimize=optimize)
    rng = np.random.default_rng(5)
    xs = [N.random_inputs(nnet, req, rng, np.float32) for _ in range(4)]
    _check_runs(nnet, c, xs)


def test_an_lstm_step_by_step_swaps_buffers():
    """A recurrent layer's optimized steps swap matrices (SWAP_MATRIX): the arena
    replays the swaps at binding time."""
    nnet = pynnet3.Nnet.from_config(N.FAST_LSTMP.format(x="input", delay=-1), seed=2)
    req = N.request({"input": N.frames(-4, 12)}, {"output": N.frames(0, 12)})
    c = pynnet3.compile(nnet, req, optimize=True)
    assert any(cmd.type is CT.SWAP_MATRIX for cmd in c.commands)
    rng = np.random.default_rng(0)
    _check_runs(nnet, c, [N.random_inputs(nnet, req, rng, np.float32) for _ in range(3)])


@needs_reference
@pytest.mark.parametrize("net", ["tdnnf_chain", "tdnn_lstm", "tdnn_relu_bn", "xvector"])
def test_decoding_chunks_of_the_realistic_networks(net):
    """One chunk at a time, as compute --batch-size=1 runs them: iVector row
    blocks, LSTM swaps, statistics pooling, all through the arena."""
    from pynnet3.graphopt import optimize_network
    from pynnet3.runtime.simple import chunk_request

    nnet = pynnet3.read_nnet(REF / "realistic" / net / "model.txt")
    nnet.set_test_mode(True)
    nnet = optimize_network(nnet)
    left, right = nnet.context()
    iv = nnet.has_node("ivector")
    fss = 3 if net == "tdnnf_chain" else 1
    req = chunk_request(-left, 51 + left + right, 51 // fss, fss, iv, 1)
    c = pynnet3.CachingCompiler(nnet).compile(req)
    rng = np.random.default_rng(1)
    xs = [N.random_inputs(nnet, req, rng, np.float32) for _ in range(3)]
    _check_runs(nnet, c, xs)


def test_outputs_kept_by_the_user_are_not_overwritten():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    c = pynnet3.compile(nnet, req)
    rng = np.random.default_rng(0)
    x1, x2 = (N.random_inputs(nnet, req, rng, np.float32) for _ in range(2))
    kept = [NnetComputer(nnet, c, cache_program=True).run(x1).outputs["output"]
            for _ in range(2)]  # (the second from the arena)
    before = kept[1].copy()
    kept[1][:] = 7.0  # the user's array: written to ...
    again = NnetComputer(nnet, c, cache_program=True).run(x1).outputs["output"]
    np.testing.assert_array_equal(again, before)  # ... changes no later run
    other = NnetComputer(nnet, c, cache_program=True).run(x2).outputs["output"]
    np.testing.assert_array_equal(kept[0], before)  # (and a later run none kept)
    assert not np.array_equal(other, before)


def test_what_is_not_bound():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    c = pynnet3.compile(nnet, req)
    program = P.program_for(c)
    assert A.bind(c, program, F32) is not None
    # more entries than the limit: the buffers would outlive what the plan frees
    floats = A.bind(c, program, F32).floats
    assert A.bind(c, program, F32, limit=floats - 1) is None
    assert A.bind(c, program, F32, limit=floats) is not None
    # a backward pass
    back = pynnet3.compile(nnet, N.request({"input": N.frames(-3, 9)},
                                           {"output": N.frames(0, 6)}, True, True))
    assert A.bind(back, P.program_for(back), F32) is None
    x = N.random_inputs(nnet, req, np.random.default_rng(0), np.float32)
    d = {"output": np.ones((6, nnet.output_dim("output")), np.float32)}
    for _ in range(3):
        NnetComputer(nnet, back, cache_program=True).run(x, d)
    assert P.program_for(back).arenas[F32] is False


def test_a_matrix_used_before_allocation_is_still_reported():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    c = pynnet3.compile(nnet, req, optimize=False).copy()
    k = next(i for i, cmd in enumerate(c.commands) if cmd.type is CT.ALLOC_MATRIX)
    del c.commands[k]
    assert A.bind(c, P.program_for(c), F32) is None
    x = N.random_inputs(nnet, req, np.random.default_rng(0), np.float32)
    for _ in range(3):  # (the first run, then the runs that would be bound)
        with pytest.raises(PynnetError, match="not allocated"):
            NnetComputer(nnet, c, cache_program=True).run(x)


def test_threads_sharing_one_computation():
    """Runs from several threads: one holds the arena, the others take the
    ordinary path meanwhile; every result is its own input's."""
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9, n=2)}, {"output": N.frames(0, 6, n=2)})
    c = pynnet3.compile(nnet, req)
    rng = np.random.default_rng(0)
    xs = [N.random_inputs(nnet, req, rng, np.float32) for _ in range(8)]
    want = [_unbound(nnet, c, x).outputs["output"] for x in xs]
    for _ in range(2):
        NnetComputer(nnet, c, cache_program=True).run(xs[0])
    assert isinstance(P.program_for(c).arenas[F32], A.Arena)
    errors = []

    def work(k):
        try:
            for r in range(40):
                i = (k + r) % len(xs)
                got = NnetComputer(nnet, c, cache_program=True).run(xs[i]).outputs["output"]
                np.testing.assert_array_equal(got, want[i])
        except Exception as e:  # (reported below, in the test's thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_float64_runs_have_their_own_arena():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    c = pynnet3.compile(nnet, req)
    x = N.random_inputs(nnet, req, np.random.default_rng(0), np.float64)
    mine = copy.deepcopy(nnet)
    for _ in range(3):
        got = NnetComputer(mine, c, dtype=np.float64,
                           cache_program=True).run(x).outputs["output"]
        assert got.dtype == np.float64
    arenas = P.program_for(c).arenas
    assert isinstance(arenas[np.dtype(np.float64)], A.Arena) and F32 not in arenas
    want = NnetComputer(nnet, c, dtype=np.float64).run(x).outputs["output"]
    np.testing.assert_array_equal(got, want)


def test_networks_taking_turns_rebind_a_bounded_number_of_times():
    """Two networks running one computation by turns: each run finds the other's
    components bound, marks the arena stale and has it bound anew, at most
    arena.REBINDS times; after that the arena stays (its ops take the ordinary
    path for the other network). Results are each network's own throughout."""
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    other = pynnet3.Nnet.from_config(N.TDNN, seed=2)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    c = pynnet3.compile(nnet, req)
    x = N.random_inputs(nnet, req, np.random.default_rng(0), np.float32)
    want = {id(n): NnetComputer(n, c.copy()).run(x).outputs["output"] for n in (nnet, other)}
    arenas = P.program_for(c).arenas
    seen = set()
    for k in range(2 * A.REBINDS + 6):
        n = (nnet, other)[k % 2]
        got = NnetComputer(n, c, cache_program=True).run(x).outputs["output"]
        np.testing.assert_array_equal(got, want[id(n)])
        if isinstance(arenas.get(F32), A.Arena):
            seen.add(id(arenas[F32]))
    assert arenas[("rebinds", F32)] == A.REBINDS
    assert isinstance(arenas[F32], A.Arena)  # (kept once the budget is spent)
    assert len(seen) >= 2
