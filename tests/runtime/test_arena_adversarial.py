"""Adversarial checks of runtime/arena.py and runtime/kernels.py: buffers kept
between runs hold garbage, parameters and components change between runs, two
networks share a computation, a run raises half-way, inputs come in odd layouts.
Every arena run must give the unbound program's floats bit for bit."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

import pynnet3
from pynnet3.components.statistics import RangeIndexes
from pynnet3.runtime import arena as A
from pynnet3.runtime import program as P
from pynnet3.runtime.computer import NnetComputer
from tests.compiler import nets as N
from tests.compiler.test_commands import CASES
from tests.reference import REF, needs_reference

LSTM = N.FAST_LSTMP.format(x="input", delay=-1)
ALL = dict(CASES)
ALL["lstm"] = (LSTM, {"input": N.frames(-4, 12, n=2)}, {"output": N.frames(0, 12, n=2)})
ALL["stats"] = (N.STATS, {"input": N.frames(-4, 20)}, {"output": N.frames(0, 16)})


def _buffers(arena: A.Arena) -> list[np.ndarray]:
    seen = {}
    for _, mats in arena.ops:
        for k, v in mats.items():
            if type(k) is int:
                seen[id(v)] = v
    return list(seen.values())


def _bound(nnet, c, xs, dtype=np.float32) -> A.Arena:
    for x in xs[:2]:
        NnetComputer(nnet, c, dtype=dtype, cache_program=True).run(x)
    arena = P.program_for(c).arenas.get(np.dtype(dtype))
    assert isinstance(arena, A.Arena)
    return arena


def _assert_same(nnet, c, x, dtype=np.float32):
    got = NnetComputer(nnet, c, dtype=dtype, cache_program=True).run(x).outputs
    want = NnetComputer(nnet, c.copy(), dtype=dtype, cache_program=True).run(x).outputs
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    return got


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("optimize", [False, True], ids=["plain", "optimized"])
@pytest.mark.parametrize("name", list(ALL))
def test_garbage_left_in_the_buffers_is_never_read(name, optimize, dtype):
    """Whatever the buffers hold from earlier runs (NaN, huge, negative) is written
    before it is read: ALLOC_MATRIX's undefined contents, as the compiler plans."""
    cfg, inputs, outputs = ALL[name]
    nnet = pynnet3.Nnet.from_config(cfg, seed=1)
    req = N.request(inputs, outputs)
    c = pynnet3.compile(nnet, req, optimize=optimize)
    rng = np.random.default_rng(3)
    xs = [N.random_inputs(nnet, req, rng, dtype) for _ in range(3)]
    arena = _bound(nnet, c, xs, dtype)
    for poison in (np.nan, 1e30, -7.0):
        for buf in _buffers(arena):
            buf.fill(poison)
        _assert_same(nnet, c, xs[2], dtype)


def test_odd_input_layouts_and_types():
    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=1)
    cfg, inputs, outputs = CASES["ivector"]
    req = N.request(inputs, outputs)
    c = pynnet3.compile(nnet, req, optimize=True)
    x = N.random_inputs(nnet, req, np.random.default_rng(0), np.float64)
    _bound(nnet, c, [x, x])
    want = _assert_same(nnet, c, x)["output"]
    readonly = {k: v.copy() for k, v in x.items()}
    for v in readonly.values():
        v.flags.writeable = False
    variants = [
        {k: np.asfortranarray(v) for k, v in x.items()},
        {k: np.repeat(v, 2, axis=1)[:, ::2] for k, v in x.items()},
        {k: v[::-1].copy()[::-1] for k, v in x.items()},
        {k: v.astype(">f8") for k, v in x.items()},
        {k: v.tolist() for k, v in x.items()},
        readonly,
    ]
    for xv in variants:
        before = {k: np.array(v, copy=True) for k, v in xv.items()}
        got = NnetComputer(nnet, c, cache_program=True).run(xv).outputs["output"]
        np.testing.assert_array_equal(got, want)
        for k in xv:  # (the user's arrays untouched)
            np.testing.assert_array_equal(np.asarray(xv[k]), before[k])
    xi = {k: (v * 3).astype(np.int32) for k, v in x.items()}
    _assert_same(nnet, c, xi)


def _realistic(net: str):
    from pynnet3.graphopt import optimize_network
    from pynnet3.runtime.simple import chunk_request

    nnet = pynnet3.read_nnet(REF / "realistic" / net / "model.txt")
    nnet.set_test_mode(True)
    nnet = optimize_network(nnet)
    left, right = nnet.context()
    fss = 3 if net == "tdnnf_chain" else 1
    req = chunk_request(-left, 21 + left + right, 21 // fss, fss, nnet.has_node("ivector"), 1)
    c = pynnet3.CachingCompiler(nnet).compile(req)
    rng = np.random.default_rng(1)
    return nnet, c, [N.random_inputs(nnet, req, rng, np.float32) for _ in range(4)]


def _linears(nnet):
    for comp in nnet.components.values():
        yield comp.linear if hasattr(comp, "_parts") else comp


def _kernel_ops(arena: A.Arena) -> int:
    return sum(1 for op, _ in arena.ops if "kernel" in op.__code__.co_freevars)


@needs_reference
@pytest.mark.parametrize("net", ["tdnnf_chain", "tdnn_lstm"])
def test_parameters_and_components_changed_between_runs(net):
    """Bound kernels see in-place writes, and give way to the ordinary op when a
    parameter array, a fused floor or linear layer, or the component is replaced."""
    nnet, c, xs = _realistic(net)
    arena = _bound(nnet, c, xs)
    assert _kernel_ops(arena) > 0
    buffers = _buffers(arena)
    base = _assert_same(nnet, c, xs[2])["output"]
    for lin in _linears(nnet):  # in place
        for v in lin.params().values():
            v *= np.float32(1.5)
    assert not np.array_equal(_assert_same(nnet, c, xs[2])["output"], base)

    def replace(fn):
        for lin in _linears(nnet):
            for k in list(lin.params()):
                attr = "params_" if k == "params" else k
                if hasattr(lin, attr):
                    setattr(lin, attr, fn(getattr(lin, attr)))

    replace(lambda a: (a / np.float32(1.5)).astype(np.float32))
    _assert_same(nnet, c, xs[2])
    replace(lambda a: a.astype(np.float64))  # (kernels decline: another dtype)
    _assert_same(nnet, c, xs[2])
    replace(lambda a: a.astype(np.float32))
    _assert_same(nnet, c, xs[2])
    for comp in nnet.components.values():
        if hasattr(comp, "_parts"):
            comp.floor = comp.floor + np.float32(0.01)
    _assert_same(nnet, c, xs[2])
    for comp in nnet.components.values():
        if hasattr(comp, "_parts"):
            comp.linear = copy.deepcopy(comp.linear)
    _assert_same(nnet, c, xs[2])
    for name in list(nnet.components):
        nnet.components[name] = copy.deepcopy(nnet.components[name])
    _assert_same(nnet, c, xs[3])
    # a kernel that declined had the program bound anew (to the arrays now there),
    # and the new arena's buffers are as garbage-proof
    _assert_same(nnet, c, xs[3])
    now = P.program_for(c).arenas[np.dtype(np.float32)]
    assert isinstance(now, A.Arena) and now is not arena and _kernel_ops(now) > 0
    assert not now.stale
    for buf in buffers + _buffers(now):
        buf.fill(np.nan)
    _assert_same(nnet, c, xs[0])


@needs_reference
def test_two_networks_share_one_computation():
    nnet, c, xs = _realistic("tdnn_lstm")
    other = copy.deepcopy(nnet)
    for lin in _linears(other):
        for v in lin.params().values():
            v *= np.float32(0.9)
    _bound(other, c, xs)  # (bound to the other network's components)
    for x in xs:
        a = _assert_same(nnet, c, x)["output"]
        b = _assert_same(other, c, x)["output"]
        assert not np.array_equal(a, b)


@needs_reference
def test_a_run_that_raises_half_way_then_a_rerun():
    nnet, c, xs = _realistic("tdnn_lstm")
    _bound(nnet, c, xs)
    name = [n for n, comp in nnet.components.items()
            if type(comp).__name__ == "LstmNonlinearityComponent"][-1]
    orig = nnet.components[name]

    class Boom(type(orig)):
        def propagate(self, *args):
            raise RuntimeError("boom")

    boom = copy.copy(orig)
    object.__setattr__(boom, "__class__", Boom)
    nnet.components[name] = boom
    with pytest.raises(RuntimeError, match="boom"):
        NnetComputer(nnet, c, cache_program=True).run(xs[2])
    nnet.components[name] = orig
    for x in xs:
        _assert_same(nnet, c, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_window_sums_and_squares_equal_the_window_sums(dtype):
    rng = np.random.default_rng(0)
    for n, lo, hi in [(100, [0, 40], [40, 100]), (50, [0, 10, 10], [10, 10, 50]),
                      (64, [0, 0], [64, 64]), (20, [5], [20])]:
        x = (rng.standard_normal((n, 14)) * 100).astype(dtype)
        for v in (x, x[:, ::2]):
            r = RangeIndexes(np.arange(n), np.array(lo), np.array(hi), n)
            sums, squares = r.window_sums_and_squares(v)
            r2 = RangeIndexes(np.arange(n), np.array(lo), np.array(hi), n)
            np.testing.assert_array_equal(sums, r2.window_sums(v))
            np.testing.assert_array_equal(squares, r2.window_sums(np.square(v)))


def test_statistics_of_network_optimized_runs_go_to_one_copy():
    """pynnet3.run(..., network_optimize=True) documents that statistics accumulate
    in the network-optimized copy; requests of few and of many sequences must not
    split them between two copies."""
    from pynnet3.cache.caching_compiler import NetworkOptions, cache_for

    cfg = LSTM.replace("output-node name=output input=out",
                       "component name=sig type=SigmoidComponent dim=6\n"
                       "component-node name=sig component=sig input=out\n"
                       "output-node name=output input=sig")
    nnet = pynnet3.Nnet.from_config(cfg, seed=4)
    rng = np.random.default_rng(0)
    total = 0
    for n in (1, 9):
        req = dataclasses.replace(
            N.request({"input": N.frames(-2, 10, n=n)}, {"output": N.frames(0, 10, n=n)}),
            store_component_stats=True)
        pynnet3.run(nnet, req, N.random_inputs(nnet, req, rng, np.float32),
                    network_optimize=True)
        total += 10 * n
    split = cache_for(nnet, NetworkOptions(enable_rules=("split-recurrent-affine",)))
    counts = [cache_for(nnet, True).compiled_nnet.components["sig"].count,
              split.compiled_nnet.components["sig"].count]
    assert total in counts, counts
