"""CachingCompiler behaviour: hits and misses, LRU eviction, shared shifted entries,
thread safety, invalidation, per-phase timing, save/load."""

from __future__ import annotations

import copy
import threading
import warnings

import numpy as np
import pytest

import pynnet3
from pynnet3.cache import CachingCompiler, cache_for
from pynnet3.cache.caching_compiler import PHASES
from pynnet3.errors import FormatError, PynnetError
from tests.cache.common import assert_same_results, frames, random_data, request, run_on_copy
from tests.compiler import nets


def _tdnn():
    nnet = pynnet3.Nnet.from_config(nets.TDNN, seed=1)
    nets.to_float64(nnet)
    return nnet


def _req(n_seqs=1, t0=0, t1=6, n0=0, deriv=False):
    return request({"input": frames(n_seqs, t0 - 3, t1 + 3, n0=n0)},
                   {"output": frames(n_seqs, t0, t1, n0=n0)}, output_deriv=deriv, model=deriv)


def test_hit_returns_the_cached_object():
    cc = CachingCompiler(_tdnn())
    a = cc.compile(_req())
    b = cc.compile(_req())  # a fresh but equal request object
    assert a is b
    info = cc.info()
    assert (info["hits"], info["misses"], info["entries"]) == (1, 1, 1)
    assert set(info["seconds"]) == set(PHASES)
    sec = info["seconds"]
    assert sec["graph"] > 0 and sec["schedule"] > 0 and sec["commands"] > 0
    assert sec["optimize"] > 0 and sec["key"] > 0 and sec["expand"] == 0


def test_different_requests_get_different_entries():
    cc = CachingCompiler(_tdnn())
    a = cc.compile(_req())
    b = cc.compile(_req(deriv=True))
    c = cc.compile(_req(t1=8))
    assert len({id(a), id(b), id(c)}) == 3 and cc.info()["misses"] == 3


def test_lru_eviction():
    cc = CachingCompiler(_tdnn(), capacity=2, use_shortcut=False)
    ra, rb, rc = _req(t1=5), _req(t1=6), _req(t1=7)
    a = cc.compile(ra)
    cc.compile(rb)
    assert cc.compile(ra) is a  # a is now the most recently used
    cc.compile(rc)  # evicts b
    info = cc.info()
    assert info["evictions"] == 1 and info["entries"] == 2
    assert cc.compile(ra) is a
    misses = cc.info()["misses"]
    cc.compile(rb)
    assert cc.info()["misses"] == misses + 1


def test_time_and_sequence_shifts_share_an_entry_when_safe():
    nnet = _tdnn()
    cc = CachingCompiler(nnet, use_shortcut=False)
    base = cc.compile(_req(n_seqs=2))
    shifted_req = _req(n_seqs=2, t0=17, t1=23, n0=5)
    shifted = cc.compile(shifted_req)
    assert shifted is base and cc.info()["hits"] == 1
    inputs, derivs = random_data(nnet, shifted_req)
    assert_same_results(run_on_copy(nnet, shifted, inputs, derivs),
                        run_on_copy(nnet, pynnet3.compile(nnet, shifted_req, optimize=False),
                                    inputs, derivs))


def test_time_shift_not_shared_when_time_is_pinned():
    nnet = pynnet3.Nnet.from_config(nets.IVECTOR, seed=1)
    cc = CachingCompiler(nnet, use_shortcut=False)

    def req(t0):
        return request({"input": frames(1, t0 - 1, t0 + 6), "ivector": frames(1, 0, 1)},
                       {"output": frames(1, t0, t0 + 6)})

    a = cc.compile(req(0))
    b = cc.compile(req(3))
    assert a is not b and cc.info()["misses"] == 2


def test_round_network_shares_only_multiples_of_the_modulus():
    nnet = pynnet3.Nnet.from_config(nets.ROUND, seed=1)
    cc = CachingCompiler(nnet, use_shortcut=False)

    def req(t0):
        iv = frames(1, t0 - 3, t0 + 9)
        return request({"input": frames(1, t0, t0 + 7), "ivector": iv[iv[:, 1] % 3 == 0]},
                       {"output": frames(1, t0, t0 + 7)})

    a = cc.compile(req(0))
    assert cc.compile(req(6)) is a
    assert cc.compile(req(1)) is not a


def test_concurrent_compiles_of_one_request_compile_once():
    cc = CachingCompiler(_tdnn())
    results, errors = [], []
    barrier = threading.Barrier(8)

    def work():
        try:
            barrier.wait()
            results.append(cc.compile(_req(n_seqs=4, deriv=True)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({id(r) for r in results}) == 1
    info = cc.info()
    # One miss for the request and one for its two-sequence mini request.
    assert info["misses"] == 2 and info["hits"] == 7 and info["shortcut"] == 1


def test_concurrent_mixed_requests():
    cc = CachingCompiler(_tdnn(), capacity=3)
    reqs = [_req(n_seqs=n, t1=t1) for n in (1, 3) for t1 in (5, 6, 7)]
    out: dict[int, list] = {i: [] for i in range(len(reqs))}

    def work(k):
        for j in range(12):
            i = (k + j) % len(reqs)
            out[i].append(cc.compile(reqs[i]))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, comps in out.items():
        expected = pynnet3.compile(cc.nnet, reqs[i]).stats()
        assert all(c.stats() == expected for c in comps)
    assert cc.info()["entries"] <= 3


def test_network_changes_empty_the_cache():
    cfg = """
input-node name=input dim=4
component name=bn type=BatchNormComponent dim=4
component-node name=bn component=bn input=input
output-node name=output input=bn
"""
    nnet = pynnet3.Nnet.from_config(cfg)
    cc = CachingCompiler(nnet, use_shortcut=False)
    req = request({"input": frames(2, 0, 4)}, {"output": frames(2, 0, 4)}, output_deriv=True)
    train = cc.compile(req)
    nnet.set_test_mode(True)  # BatchNorm's flags change: no memo, no stats
    test = cc.compile(req)
    assert test is not train and cc.info()["invalidations"] == 1
    assert test.stats() == pynnet3.compile(nnet, req).stats()
    nnet.read_config("component name=bn type=BatchNormComponent dim=4\n")
    cc.compile(req)
    assert cc.info()["invalidations"] == 2


def test_bad_arguments():
    with pytest.raises(PynnetError):
        CachingCompiler(_tdnn(), capacity=0)
    with pytest.raises(PynnetError):
        CachingCompiler(_tdnn(), optimize="yes")


def test_copy_of_a_network_gets_an_empty_cache():
    nnet = _tdnn()
    cache_for(nnet).compile(_req())
    other = nnet.copy()
    assert len(cache_for(other)) == 0 and cache_for(other).nnet is other
    assert len(cache_for(nnet)) == 1
    shallow = copy.copy(nnet)
    assert cache_for(shallow).nnet is shallow and cache_for(nnet).nnet is nnet


# -- run() and the network's cache --------------------------------------------------------

def test_run_with_a_request_compiles_once():
    nnet = _tdnn()
    rng = np.random.default_rng(0)
    for _ in range(3):
        req = _req(n_seqs=3, deriv=True)
        inputs, derivs = random_data(nnet, req, seed=int(rng.integers(100)))
        res = pynnet3.run(nnet, req, inputs, derivs)
        ref = pynnet3.run(nnet, pynnet3.compile(nnet, req, optimize=False), inputs, derivs)
        assert_same_results(res, ref)
    info = cache_for(nnet).info()
    assert info["hits"] == 2 and info["shortcut"] == 1
    # run()'s defaults (float32, numpy) are the cache's defaults: the same entry.
    cache_for(nnet).compile(_req(n_seqs=3, deriv=True))
    assert cache_for(nnet).info()["hits"] == 3
    cache_for(nnet).compile(_req(n_seqs=3, deriv=True), dtype=np.float64)
    assert cache_for(nnet).info()["misses"] == info["misses"] + 1


# -- save / load ----------------------------------------------------------------------------

def test_save_and_load(tmp_path):
    nnet = _tdnn()
    cc = CachingCompiler(nnet)
    req = _req(n_seqs=4, deriv=True)
    comp = cc.compile(req)
    cc.compile(_req())
    path = tmp_path / "cache.bin"
    cc.save(path)
    fresh = CachingCompiler(nnet)
    assert fresh.load(path) == 3  # two requests and one mini computation
    loaded = fresh.compile(_req(n_seqs=4, deriv=True))
    assert fresh.info()["misses"] == 0 and fresh.info()["hits"] == 1
    assert loaded.stats() == comp.stats()
    inputs, derivs = random_data(nnet, req)
    assert_same_results(run_on_copy(nnet, loaded, inputs, derivs),
                        run_on_copy(nnet, comp, inputs, derivs))
    # The loaded mini computation serves a new N without compiling it again.
    fresh.compile(_req(n_seqs=6, deriv=True))
    assert fresh.info()["shortcut"] == 1 and fresh.info()["misses"] == 1


def test_load_survives_new_weights(tmp_path):
    nnet = _tdnn()
    cc = CachingCompiler(nnet)
    cc.compile(_req())
    cc.save(tmp_path / "c")
    retrained = pynnet3.Nnet.from_config(nets.TDNN, seed=99)  # same structure
    assert CachingCompiler(retrained).load(tmp_path / "c") == 1


@pytest.mark.parametrize("mismatch", ["network", "options", "version"])
def test_load_skips_mismatched_entries_with_a_warning(tmp_path, mismatch, monkeypatch):
    cc = CachingCompiler(_tdnn())
    cc.compile(_req())
    cc.save(tmp_path / "c")
    nnet, options = _tdnn(), True
    if mismatch == "network":
        nnet = pynnet3.Nnet.from_config(nets.IVECTOR)
    elif mismatch == "options":
        options = pynnet3.OptimizeOptions(split_row_ops=False)
    else:
        monkeypatch.setattr(pynnet3, "__version__", "999.0")
    other = CachingCompiler(nnet, optimize=options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert other.load(tmp_path / "c") == 0
    assert any("skipped 1 compile-cache entry" in str(w.message) for w in caught)
    assert other.info()["entries"] == 0


def test_load_rejects_other_files(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"not a cache")
    with pytest.raises(FormatError):
        CachingCompiler(_tdnn()).load(bad)


def test_compiler_phase_timings_are_recorded(monkeypatch):
    """compile_computation's graph / schedule / commands seconds (its ``timings``
    argument) show in info() per phase."""
    from pynnet3.cache import caching_compiler as cc_mod
    from pynnet3.compiler import compile_computation

    def timed_compile(nnet, request, timings=None):
        comp = compile_computation(nnet, request)
        if timings is not None:
            timings.update(graph=0.5, schedule=0.25, commands=0.125)
        return comp

    monkeypatch.setattr(cc_mod, "compile_computation", timed_compile)
    cc = CachingCompiler(_tdnn())
    cc.compile(_req(n_seqs=3))  # the mini request is compiled once
    sec = cc.info()["seconds"]
    assert (sec["graph"], sec["schedule"], sec["commands"]) == (0.5, 0.25, 0.125)


def test_another_n_reuses_the_mini_computation(monkeypatch):
    """N = 8 then N = 4 of one pattern: the two-sequence computation is compiled and
    its expansion plan made once; the second request costs only an expansion."""
    from pynnet3.cache import caching_compiler as cc_mod

    compiled, plans = [], []
    real_compile, real_plan = cc_mod.compile_computation, cc_mod.ExpansionPlan

    def counting_compile(nnet, request, timings=None):
        compiled.append(request)
        return real_compile(nnet, request, timings=timings)

    def counting_plan(*args):
        plans.append(args)
        return real_plan(*args)

    monkeypatch.setattr(cc_mod, "compile_computation", counting_compile)
    monkeypatch.setattr(cc_mod, "ExpansionPlan", counting_plan)
    cc = CachingCompiler(_tdnn())
    big = cc.compile(_req(n_seqs=8, deriv=True))
    small = cc.compile(_req(n_seqs=4, deriv=True))
    assert len(compiled) == 1 and len(plans) == 1
    info = cc.info()
    # misses: the two requests and the mini request; the second finds the mini cached
    assert (info["misses"], info["hits"], info["shortcut"]) == (3, 1, 2)
    for n_seqs, comp in ((8, big), (4, small)):
        full = pynnet3.compile(cc.nnet, _req(n_seqs=n_seqs, deriv=True))
        assert comp.stats() == full.stats()


def test_garbage_collector_is_paused_during_a_miss(monkeypatch):
    """A miss runs with the cyclic GC paused and restores its state afterwards, also
    when compiling fails; a caller's own gc.disable() is left alone."""
    import gc

    from pynnet3.cache import caching_compiler as cc_mod

    seen = []
    real_compile = cc_mod.compile_computation

    def watching_compile(nnet, request, timings=None):
        seen.append(gc.isenabled())
        if request.outputs[0].indexes[-1, 1] > 6:
            raise PynnetError("boom")
        return real_compile(nnet, request, timings=timings)

    monkeypatch.setattr(cc_mod, "compile_computation", watching_compile)
    cc = CachingCompiler(_tdnn())
    assert gc.isenabled()
    cc.compile(_req(n_seqs=3))
    with pytest.raises(PynnetError):
        cc.compile(_req(t1=8))
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        cc.compile(_req(n_seqs=1))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_replaced_component_empties_the_cache():
    nnet = _tdnn()
    cc = CachingCompiler(nnet)
    a = cc.compile(_req())
    name = next(iter(nnet.components))
    nnet.components[name] = copy.deepcopy(nnet.components[name])
    b = cc.compile(_req())
    assert b is not a and cc.info()["invalidations"] == 1
    assert cc.compile(_req()) is b


# -- regressions: entries that must not be shared or kept ----------------------------------

_BT = (
    "input-node name=input dim=2\n"
    "component name=bt type=BackpropTruncationComponent dim=2 clipping-threshold=0 "
    "zeroing-threshold=0.001 zeroing-interval=4 recurrence-interval=1\n"
    "component-node name=bt component=bt input=input\n"
    "output-node name=output input=bt\n")


@pytest.mark.parametrize("n0", [0, 1])
def test_absolute_n_network_expands_only_from_n0_zero(n0):
    """BackpropTruncation zeroes derivative rows by (t - n): the shortcut, which
    numbers the expanded sequences 0 .. N-1, is exact only for requests from n = 0
    (others compile in full); both give the direct compilation's derivatives."""
    nnet = pynnet3.Nnet.from_config(_BT, seed=0)
    req = request({"input": frames(4, 0, 8, n0=n0)}, {"output": frames(4, 0, 8, n0=n0)},
                  input_deriv=True, output_deriv=True)
    cc = CachingCompiler(nnet)
    comp = cc.compile(req)
    assert cc.info()["shortcut"] == (1 if n0 == 0 else 0)
    inputs, derivs = random_data(nnet, req)
    got = run_on_copy(nnet, comp, inputs, derivs)
    want = run_on_copy(nnet, pynnet3.compile(nnet, req), inputs, derivs)
    zeroed = (want.input_derivs["input"] == 0).all(axis=1)
    assert zeroed.any() and not zeroed.all()  # the test exercises the zeroing
    assert_same_results(got, want)


def test_absolute_derivative_times_switch_off_the_time_shift():
    """min_deriv_time is an absolute time: a request shifted in time is not the
    same computation, so it must not share the unshifted request's entry."""
    nnet = _tdnn()
    opts = pynnet3.OptimizeOptions(min_deriv_time=3)
    cc = CachingCompiler(nnet, optimize=opts)
    assert cc.policy().t_period == 0
    assert CachingCompiler(nnet, optimize=pynnet3.OptimizeOptions(
        max_deriv_time_relative=2)).policy().t_period != 0  # relative: shifts with t
    cc.compile(_req(t0=0, t1=6, deriv=True))
    shifted = request({"input": frames(1, 7, 19)}, {"output": frames(1, 10, 16)},
                      input_deriv=True, output_deriv=True, model=True)
    comp = cc.compile(shifted)
    assert cc.info()["misses"] == 2
    inputs, derivs = random_data(nnet, shifted)
    assert_same_results(run_on_copy(nnet, comp, inputs, derivs),
                        run_on_copy(nnet, pynnet3.compile(nnet, shifted, optimize=opts),
                                    inputs, derivs))


_TDNN_COMPONENT = """
input-node name=input dim=3
component name=a type=TdnnComponent input-dim=3 output-dim=3 time-offsets={}
component-node name=a component=a input=input
output-node name=output input=a
"""


def test_build_overtaken_by_a_network_change_is_not_stored():
    """A compile that began before the network changed, and ends after another
    call emptied the cache for the change, must not store its stale computation."""
    nnet = pynnet3.Nnet.from_config(_TDNN_COMPONENT.format("-1,0,1"), seed=1)
    other = pynnet3.Nnet.from_config(_TDNN_COMPONENT.format("-2,0,2"), seed=1)
    cc = CachingCompiler(nnet, use_shortcut=False)
    compiled, resume = threading.Event(), threading.Event()
    optimize = cc._optimize

    def paused(comp):
        if threading.current_thread().name == "slow":
            compiled.set()
            resume.wait(10)
        return optimize(comp)

    cc._optimize = paused
    req = _req(t1=6)
    slow = threading.Thread(target=cc.compile, args=(req,), name="slow")
    slow.start()
    assert compiled.wait(10)
    nnet.components["a"] = other.components["a"]  # the network changes meanwhile
    cc.compile(_req(t1=5))  # another call sees the change and empties the cache
    resume.set()
    slow.join()
    comp = cc.compile(req)
    assert cc.info()["hits"] == 0  # compiled again, for the current network
    inputs, derivs = random_data(nnet, req)
    assert_same_results(run_on_copy(nnet, comp, inputs, derivs),
                        run_on_copy(nnet, pynnet3.compile(nnet, req), inputs, derivs))


def test_save_drops_entries_of_a_changed_network(tmp_path):
    """save() right after the network changed (no compile between) writes no entry
    made for the old network under the new network's fingerprint."""
    nnet = pynnet3.Nnet.from_config(_TDNN_COMPONENT.format("-1,0,1"), seed=1)
    cc = CachingCompiler(nnet)
    req = _req(t1=6)
    cc.compile(req)
    nnet.read_config("component name=a type=TdnnComponent input-dim=3 output-dim=3 "
                     "time-offsets=-2,0,2\n")
    cc.save(tmp_path / "c")
    fresh = CachingCompiler(nnet)
    assert fresh.load(tmp_path / "c") == 0
    comp = fresh.compile(req)
    inputs, derivs = random_data(nnet, req)
    assert_same_results(run_on_copy(nnet, comp, inputs, derivs),
                        run_on_copy(nnet, pynnet3.compile(nnet, req), inputs, derivs))
