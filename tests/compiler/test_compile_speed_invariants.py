"""The compiler's fast paths give exactly what their plain counterparts give.

Compile-time optimizations must not change a single command, matrix or index
table. Each fast path keeps a switch (or a plain twin) so that the two can be
compared here:

* ``Computability.use_regions``: non-recurrent nodes evaluated region by region
  vs. batch by batch (the lazy evaluation recurrences still use);
* ``Computability.clip_windows``: statistics windows cut to the frames that can
  exist vs. the full (e.g. 10001-frame) windows;
* ``CommandCompiler.batch_steps``: descriptor terms, component inputs and
  source locations worked out for all steps of a node at once (and component
  inputs taken over from the graph builder) vs. per step;
* small-graph (Python) vs. numpy Kahn levels, dense vs. sorted offset lookups,
  the two ``pack`` code paths, ``KeyMap``'s one-block lookup, statistics
  windows within bounds, and the time bounds used for clipping (checked
  against computability itself).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

import pynnet3
from pynnet3.compiler import commands as commands_mod
from pynnet3.compiler import compile_computation
from pynnet3.compiler import graph as graph_mod
from pynnet3.compiler.commands import CommandCompiler
from pynnet3.compiler.computable import Computability
from pynnet3.compiler.keymap import KeyMap
from pynnet3.components.statistics import StatisticsPoolingComponent
from pynnet3.components.tdnn import time_offset_sources
from pynnet3.index import pack, unpack
from pynnet3.testing import random_nets
from tests.compiler import nets as N
from tests.reference import require_reference

# -- comparing computations ------------------------------------------------------------------


def _same(a, b, path: str = "") -> None:
    """Recursive exact equality of computations and everything they hold."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert np.array_equal(a, b), path
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            if f.name in ("request", "_whole"):
                continue
            _same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif hasattr(a, "__dict__") and not isinstance(a, (type, str)):
        assert type(a) is type(b), path
        _same(vars(a), vars(b), path)
    else:
        assert a == b or (a != a and b != b), f"{path}: {a!r} != {b!r}"


def _plain(monkeypatch) -> None:
    monkeypatch.setattr(Computability, "use_regions", False)
    monkeypatch.setattr(Computability, "clip_windows", False)
    monkeypatch.setattr(CommandCompiler, "batch_steps", False)


def _compile_both(monkeypatch, nnet, request):
    fast = compile_computation(nnet, request)
    with monkeypatch.context() as m:
        _plain(m)
        plain = compile_computation(nnet, request)
    assert str(fast) == str(plain)
    _same(fast, plain)
    return fast


# -- whole compilations ------------------------------------------------------------------------

_SMALL_NETS = [
    ("TDNN", N.TDNN, {"input": N.frames(-3, 12, n=2)}, {"output": N.frames(0, 9, n=2)}),
    ("RNN", N.RNN, {"input": N.frames(0, 12, n=2)}, {"output": N.frames(0, 10, n=2)}),
    ("FAILOVER", N.FAILOVER, {"input": N.frames(0, 8)}, {"output": N.frames(0, 8)}),
    ("ROUND", N.ROUND, {"input": N.frames(0, 9), "ivector": N.frames(0, 9)},
     {"output": N.frames(0, 9)}),
    ("STATS", N.STATS, {"input": N.frames(0, 20, n=2)},
     {"output": np.array([[0, 0, 0], [1, 0, 0], [0, 6, 0]])}),
]


@pytest.mark.parametrize("name,config,inputs,outputs", _SMALL_NETS,
                         ids=[c[0] for c in _SMALL_NETS])
@pytest.mark.parametrize("derivs", [False, True])
def test_small_networks_compile_the_same_either_way(monkeypatch, name, config, inputs,
                                                    outputs, derivs):
    nnet = pynnet3.Nnet.from_config(config, seed=3)
    req = N.request(inputs, outputs, input_deriv=derivs, output_deriv=derivs,
                    model=derivs)
    _compile_both(monkeypatch, nnet, req)


def test_random_networks_compile_the_same_either_way(monkeypatch):
    for seed in range(150):
        case = random_nets.case_for_seed(seed)
        nnet = case.build_nnet()
        try:
            _compile_both(monkeypatch, nnet, case.request)
        except AssertionError as e:
            raise AssertionError(f"{case.describe()}\n{e}") from None


def _realistic(net: str):
    path = require_reference() / "realistic" / net / "model.txt"
    return pynnet3.read_nnet(path)


def _frames(n_seqs: int, t0: int, t1: int) -> np.ndarray:
    n, t = np.meshgrid(np.arange(n_seqs), np.arange(t0, t1), indexing="ij")
    return np.stack([n.ravel(), t.ravel(), np.zeros(n.size, dtype=np.int64)], axis=1)


@pytest.mark.parametrize("net", ["tdnn_lstm", "xvector"])
def test_realistic_networks_compile_the_same_either_way(monkeypatch, net):
    """A recurrent network (many steps per node, lazily evaluated SCCs) and the
    x-vector network (a 10001-frame statistics window, clipped)."""
    nnet = _realistic(net)
    left, right = nnet.context()
    if net == "xvector":
        inputs = [pynnet3.IoSpecification("input", _frames(2, 0, 40))]
        out = _frames(2, 0, 1)
    else:
        inputs = [pynnet3.IoSpecification("input", _frames(2, -left, 30 + right)),
                  pynnet3.IoSpecification("ivector", _frames(2, 0, 1))]
        out = _frames(2, 0, 30)
    for train in (False, True):
        outputs = [pynnet3.IoSpecification(name, out.copy(), has_deriv=train)
                   for name in nnet.output_names()]
        req = pynnet3.ComputationRequest(inputs=inputs, outputs=outputs,
                                         need_model_derivative=train)
        _compile_both(monkeypatch, nnet, req)


def test_reference_requests_compile_the_same_either_way(monkeypatch):
    cases = sorted(p.parent for p in (require_reference() / "generated").glob("*/request.json"))
    assert len(cases) == 40  # generated/case_<seed> for seeds 1..40 (reference README)
    for case in cases:
        model = case / "model.txt"
        if not model.exists():
            model = case.parent / "model.txt"
        nnet = pynnet3.read_nnet(model)
        req = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json")
                                                              .read_text()))
        _compile_both(monkeypatch, nnet, req)


# -- time bounds and clipped windows ----------------------------------------------------------

def test_time_bounds_contain_every_computable_cindex():
    """Bounds are sound: a computable cindex is never outside them (checked by
    computability over a wide range of t, for every node)."""
    probe_t = np.arange(-60, 80)
    for seed in range(40):
        case = random_nets.case_for_seed(seed)
        nnet = case.build_nnet()
        given = {s.name: s.indexes for s in case.request.inputs}
        comp = Computability(nnet, given)
        ns = np.unique(np.concatenate([s.indexes[:, 0] for s in case.request.inputs]))
        xs = np.unique(np.concatenate([s.indexes[:, 2] for s in case.request.inputs]))
        n, t, x = np.meshgrid(ns, probe_t, xs, indexing="ij")
        probe = np.stack([n.ravel(), t.ravel(), x.ravel()], axis=1)
        for node in nnet.node_map:
            lo, hi = comp.time_bounds(node)
            t_ok = probe[comp.computable(node, probe), 1]
            assert ((t_ok >= lo) & (t_ok <= hi)).all(), (seed, node, lo, hi)


def test_stats_network_bounds_are_tight_enough_to_clip():
    nnet = pynnet3.Nnet.from_config(N.STATS, seed=0)
    comp = Computability(nnet, {"input": N.frames(5, 20)})
    assert comp.time_bounds("tanh1") == (5, 19)
    assert comp.time_bounds("extract") == (4, 20)  # output-period 2
    assert comp.time_bounds("pool") == (0, 24)  # +-4 frames of context


@pytest.mark.parametrize("bounds", [(-math.inf, math.inf), (0, 7), (-3, 2), (5, 5), (9, 40),
                                    (math.inf, -math.inf), (-math.inf, 1), (3, math.inf)])
def test_pooling_window_within_bounds_is_the_filtered_window(bounds):
    comp = StatisticsPoolingComponent(input_dim=5, input_period=2, left_context=4,
                                      right_context=6)
    out = np.array([[0, 2, 0], [0, 3, 0], [1, -4, 1], [0, 8, 0], [2, 0, 0]])
    full = comp.input_indexes(out)
    lo, hi = bounds
    keep = (full.indexes[:, 1] >= lo) & (full.indexes[:, 1] <= hi)
    got = comp.input_indexes_within(out, lo, hi)
    assert got.any_suffices and not got.required.any()
    np.testing.assert_array_equal(got.owner, full.owner[keep])
    np.testing.assert_array_equal(got.indexes, full.indexes[keep])
    assert got.indexes.shape[1] == 3


# -- building blocks ------------------------------------------------------------------------------

def _levels_by_dp(total: int, src: np.ndarray, dst: np.ndarray) -> list[int] | None:
    """Longest-path depth by repeated relaxation (independent of Kahn's algorithm)."""
    level = [0] * total
    for _ in range(total + 1):
        changed = False
        for a, b in zip(src.tolist(), dst.tolist(), strict=True):
            if level[b] < level[a] + 1:
                level[b] = level[a] + 1
                changed = True
        if not changed:
            return level
    return None  # still growing after |V| rounds: a cycle


def test_longest_path_levels_both_paths_match_relaxation(monkeypatch):
    rng = np.random.default_rng(5)
    for trial in range(60):
        total = int(rng.integers(1, 40))
        m = int(rng.integers(0, 3 * total))
        a, b = rng.integers(0, total, m), rng.integers(0, total, m)
        if trial % 4:  # a DAG: edges from lower to higher vertex ids
            a, b = np.minimum(a, b), np.maximum(a, b)
            keep = a != b
            a, b = a[keep], b[keep]
        want = _levels_by_dp(total, a, b)
        small = graph_mod._longest_path_levels(total, a, b)
        with monkeypatch.context() as mp:
            mp.setattr(graph_mod, "_SMALL_GRAPH", -1)
            large = graph_mod._longest_path_levels(total, a, b)
        for got in (small, large):
            if want is None:
                assert got is None, trial
            else:
                assert got is not None and got.tolist() == want, trial


def _sources_by_dict(inp: np.ndarray, out: np.ndarray, offsets) -> np.ndarray:
    where = {tuple(r): i for i, r in enumerate(inp.tolist())}
    return np.array([[where.get((n, t + o, x), -1) for n, t, x in out.tolist()]
                     for o in offsets], dtype=np.int64).reshape(len(offsets), len(out))


def test_time_offset_sources_dense_and_sparse_match_a_dict():
    rng = np.random.default_rng(2)
    for trial in range(80):
        ns, xs = int(rng.integers(1, 5)), int(rng.integers(1, 3))
        n, t, x = np.meshgrid(np.arange(ns), np.arange(-6, 25), np.arange(xs), indexing="ij")
        inp = np.stack([n.ravel(), t.ravel(), x.ravel()], axis=1)
        inp = inp[rng.permutation(len(inp))]
        if trial % 3 == 0:
            inp = inp[rng.random(len(inp)) < 0.6]  # holes
        if trial % 5 == 0:
            inp = inp * np.array([1, 997, 1])  # too sparse for a dense table
        if trial % 13 == 0:
            inp = inp[:0]
        out = inp[rng.permutation(len(inp))][: len(inp) // 2] if len(inp) else inp
        out = np.concatenate([out, [[ns + 1, 3, 0], [0, 3, xs + 2], [-1, 0, 0]]])
        offsets = sorted(rng.choice(np.arange(-5, 6), size=3, replace=False).tolist())
        got = time_offset_sources(inp, out, offsets)
        np.testing.assert_array_equal(got, _sources_by_dict(inp, out, offsets))


def test_pack_paths_match_the_bit_fields():
    rng = np.random.default_rng(0)
    for k in (0, 1, 7, 1024, 1025, 5000):
        idx = np.stack([rng.integers(-(1 << 19), 1 << 19, k), rng.integers(-(1 << 26), 1 << 26, k),
                        rng.integers(-(1 << 15), 1 << 15, k)], axis=1).astype(np.int64)
        want = (((idx[:, 0] + (1 << 19)) << 43) | ((idx[:, 1] + (1 << 26)) << 16)
                | (idx[:, 2] + (1 << 15)))
        got = pack(idx)
        assert got.dtype == np.int64 and got.shape == (k,)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(unpack(got), idx)
        # key order is (n, t, x) order
        order = np.lexsort((idx[:, 2], idx[:, 1], idx[:, 0]))
        assert (np.diff(got[order]) >= 0).all()


def test_keymap_lookup_one_and_many_blocks_match_a_dict():
    rng = np.random.default_rng(1)
    km, ref = KeyMap(), {}
    for step in range(30):
        keys = rng.integers(0, 300, int(rng.integers(1, 40)))
        vals = rng.integers(1, 9, len(keys))
        if step % 3 == 0:
            uk = np.unique(keys)
            uk = uk[[k not in ref for k in uk.tolist()]]
            km.add_new(uk, np.full(len(uk), 7))
            ref.update(dict.fromkeys(uk.tolist(), 7))
        else:
            km.set(keys, vals)
            ref.update(zip(keys.tolist(), vals.tolist(), strict=True))
        probe = rng.integers(-5, 310, 50)
        np.testing.assert_array_equal(km.lookup(probe, -1),
                                      [ref.get(k, -1) for k in probe.tolist()])
    km.items()  # merges into one block
    assert len(km.blocks) == 1
    probe = np.arange(-5, 310)
    np.testing.assert_array_equal(km.lookup(probe, -3), [ref.get(k, -3) for k in probe.tolist()])


def test_batched_steps_are_really_batched():
    """The switch is not dead code: with batching, a recurrent node's steps share
    one resolution (one group), without it each step has its own."""
    nnet = pynnet3.Nnet.from_config(N.RNN, seed=1)
    req = N.request({"input": N.frames(0, 6)}, {"output": N.frames(0, 6)})
    calls = []
    orig = commands_mod.resolve_part_keys

    def counting(*args, **kw):
        calls.append(len(args[1]))
        return orig(*args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(commands_mod, "resolve_part_keys", counting)
        compile_computation(nnet, req)
        batched = len(calls)
        calls.clear()
        mp.setattr(CommandCompiler, "batch_steps", False)
        compile_computation(nnet, req)
        unbatched = len(calls)
    assert batched < unbatched


def test_cut_pieces_and_flags_match_their_definitions():
    rng = np.random.default_rng(4)
    for _ in range(200):
        g = int(rng.integers(1, 5))
        sizes = rng.integers(0, 6, g)
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        total = int(bounds[-1])
        rows = np.flatnonzero(rng.random(total) < 0.8).astype(np.int64)  # increasing
        steps = rng.integers(0, 2, len(rows)) + 3 * (rng.random() < 0.5)
        srows = np.cumsum(rng.integers(0, 3, len(rows))) + int(rng.integers(0, 4))
        if rng.random() < 0.5:
            steps[:] = steps[0] if len(steps) else 0
        cut = np.searchsorted(rows, bounds).tolist()
        pieces = commands_mod._cut("x", 0.5, 0.0, rows, steps, srows, bounds, cut)
        assert len(pieces) == g
        for q, p in enumerate(pieces):
            sel = (rows >= bounds[q]) & (rows < bounds[q + 1])
            if not sel.any():
                assert p is None
                continue
            r, s, sr = rows[sel] - bounds[q], steps[sel], srows[sel]
            np.testing.assert_array_equal(p.rows, r)
            np.testing.assert_array_equal(p.steps, s)
            np.testing.assert_array_equal(p.srows, sr)
            single = bool((s == s[0]).all())
            run = (np.array_equal(r, r[0] + np.arange(len(r)))
                   and np.array_equal(sr, sr[0] + np.arange(len(sr))))
            assert p.single == single and p.contig == (single and run)
            assert (p.s0, p.r0, p.sr0) == (s[0], r[0], sr[0])


def test_keeping_region_rules_changes_nothing(monkeypatch):
    """Reusing what region evaluation resolved (``Computability.keep_rules``) gives
    the same computation as resolving again in the graph builder."""
    for seed in range(60):
        case = random_nets.case_for_seed(seed)
        nnet = pynnet3.Nnet.from_config(case.config, seed=case.nnet_seed)
        fast = compile_computation(nnet, case.request)
        with monkeypatch.context() as m:
            m.setattr(Computability, "keep_rules", False)
            plain = compile_computation(nnet, case.request)
        assert str(fast) == str(plain)
        _same(fast, plain)
