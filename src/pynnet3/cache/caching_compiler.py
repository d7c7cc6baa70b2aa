"""CachingCompiler: request -> optimized computation, cached by a structural key.

The JIT-style layer of the flow (DESIGN.md "cache"): a request's key
(:func:`pynnet3.cache.key.request_key`) is looked up in an LRU map of at most
``capacity`` entries; a miss compiles (graph, schedule, commands), optimizes and
stores. With ``use_shortcut`` a request of N > 2 identically shaped sequences is
compiled for two sequences and expanded (:mod:`pynnet3.cache.expand`); the mini
computation is cached too, so other N reuse it. A request without that
structure, or whose mini computation cannot be expanded, is compiled in full.

Invariants: a cached computation is never mutated after it is stored, and callers
get the stored object itself (expanded computations also share command objects
with their cached two-sequence computation), so they must treat it as read-only:
``computation.copy()`` before optimizing it further. The runtime never writes to
a computation. The cache belongs to one network; if that network's
nodes or components are replaced, or a component's property flags change (e.g.
BatchNorm test mode), the cache empties itself on the next call.
All public methods are safe to call from several threads; two threads asking for
the same missing key compile it once.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from itertools import repeat

from ..compiler import check_matrix_sizes, compile_computation
from ..components.base import Component
from ..components.fused import linear_part
from ..computation import NnetComputation
from ..errors import PynnetError
from ..gcpause import gc_paused
from ..graphopt import NetworkOptions, optimize_network
from ..optimize import OptimizeOptions
from ..optimize import optimize as run_optimizer
from .expand import (
    ExpansionError,
    ExpansionPlan,
    PrecomputedInfo,
    rekey_snapshot,
    snapshot_precomputed,
)
from .key import RequestKey, ShiftPolicy, mini_request, request_key, request_layouts, shift_policy

PHASES = ("key", "graph", "schedule", "commands", "optimize", "expand", "check")


@dataclass
class _Entry:
    """One cached computation: the bucket key and exact indexes it answers for."""

    key: tuple
    arrays: list
    shift: tuple
    value: object


@dataclass
class _MiniEntry:
    """A cached two-sequence computation plus what expansion needs (snapshot keyed
    by the computation's precomputed-index positions). ``plan`` (the N-independent
    part of expansion) is made on first use and not saved to files."""

    computation: NnetComputation
    snapshot: dict[int, PrecomputedInfo]
    plan: ExpansionPlan | None = None
    failed: bool = False

    def __getstate__(self):
        return {"computation": self.computation, "snapshot": self.snapshot,
                "plan": None, "failed": False}


class CachingCompiler:
    """Compile requests for ``nnet``, caching optimized computations (module doc).

    ``optimize``: True (default options), False (cache unoptimized computations) or
    an :class:`OptimizeOptions`. ``capacity``: entries kept (least recently used
    evicted). ``use_shortcut``: Kaldi's shortcut compilation. ``check``: run the
    computation checker on every computation made (slow; for debugging).
    ``network_optimize``: None (compile ``nnet`` itself), True or a
    :class:`~pynnet3.NetworkOptions`: compile for a network-optimized copy of
    ``nnet`` (:attr:`compiled_nnet`, remade when ``nnet`` changes); computations
    from this compiler must be run with :attr:`compiled_nnet`.
    """

    def __init__(self, nnet, optimize: bool | OptimizeOptions = True, capacity: int = 64,
                 use_shortcut: bool = True, check: bool = False, network_optimize=None):
        if capacity < 1:
            raise PynnetError(f"CachingCompiler capacity must be >= 1, got {capacity}")
        if optimize is True:
            optimize = OptimizeOptions()
        elif optimize is False:
            optimize = OptimizeOptions(optimize=False)
        if not isinstance(optimize, OptimizeOptions):
            raise PynnetError(f"optimize must be a bool or OptimizeOptions, got {optimize!r}")
        self.nnet = nnet
        self.options = optimize
        if network_optimize is True:
            network_optimize = NetworkOptions()
        elif network_optimize is False:
            network_optimize = None
        if network_optimize is not None and not isinstance(network_optimize, NetworkOptions):
            raise PynnetError("network_optimize must be None, a bool or NetworkOptions, got "
                              f"{network_optimize!r}")
        self.network_options = network_optimize
        if network_optimize is not None and network_optimize.memory \
                and not optimize.recompute_cheap_values:
            # the network optimizer's "memory" pass works on the compiled commands
            # (optimize/recompute.py)
            self.options = replace(optimize, recompute_cheap_values=True)
        self._compiled_nnet = nnet
        self.capacity = int(capacity)
        # Looped computations are not expanded (Kaldi compiles them in full too).
        self.use_shortcut = bool(use_shortcut) and not optimize.optimize_looped_computation
        self.check = bool(check)
        self._lock = threading.RLock()
        # LRU of entries by serial number; buckets: bucket key -> serial numbers.
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._buckets: dict[tuple, list[int]] = {}
        self._serial = 0
        self._inflight: dict[tuple, threading.Event] = {}
        self._stamp: tuple | None = None
        # bumped when the cache is emptied (clear(), a network change): a build that began
        # before it does not store its (stale) result
        self._generation = 0
        self._policy = ShiftPolicy(False, 0)
        self._reset_counters()

    # -- public ---------------------------------------------------------------------------
    def compile(self, request, *, dtype=None, backend: str | None = None,
                device=None) -> NnetComputation:
        """The computation for ``request`` (optimized per this compiler's options).
        ``dtype`` / ``backend`` / ``device`` (defaults: float32, "numpy", the CPU, as
        ``pynnet3.run``) are part of the key, so a backend may later attach prepared
        state to an entry; today's computations do not depend on them. The returned
        object is shared: do not mutate it."""
        t0 = time.perf_counter()
        self._check_network()
        variant = (_dtype_name(dtype), backend or "numpy")
        if device is not None and str(device) != "cpu":  # (the CPU: the plain key)
            variant += (str(device),)
        rk = request_key(request, self._policy, variant)
        self._add_time("key", time.perf_counter() - t0)
        return self._get_or_build(rk, lambda: self._build(request))

    def info(self) -> dict:
        """Counters: hits, misses, evictions, entries, shortcut compilations,
        shortcut fallbacks (irregular mini computation), invalidations, and seconds
        spent per phase (key, graph, schedule, commands, optimize, expand, check)."""
        with self._lock:
            out = dict(self._counts)
            out["entries"] = len(self._entries)
            out["capacity"] = self.capacity
            out["seconds"] = dict(self._seconds)
            return out

    def clear(self) -> None:
        """Forget every entry (counters are kept; a compile already under way does
        not store its result), and the network-optimized copy: the next compile
        makes it anew from the network as it is now (after in-place changes)."""
        with self._lock:
            self._entries.clear()
            self._buckets.clear()
            self._generation += 1
            self._stamp = None

    def __len__(self) -> int:
        return len(self._entries)

    def save(self, path) -> None:
        """Write the entries to ``path``, atomically, as plain data (see
        :mod:`pynnet3.cache.persist`)."""
        from .persist import save_cache

        save_cache(self, path)

    def load(self, path) -> int:
        """Add the usable entries of a file written by :meth:`save`; entries made for
        another network structure, other options or another pynnet3 version are
        skipped with a warning. Returns the number of entries added. The file is
        data, not code: loading runs nothing from it, and a damaged or hand-made
        file raises FormatError (see :mod:`pynnet3.cache.persist`)."""
        from .persist import load_cache

        return load_cache(self, path)

    # -- copying / pickling: a copy starts empty ------------------------------------------------
    def __deepcopy__(self, memo):
        nnet = memo.get(id(self.nnet))
        if nnet is None:
            nnet = copy.deepcopy(self.nnet, memo)
        return CachingCompiler(nnet, self.options, self.capacity, self.use_shortcut,
                               self.check, self.network_options)

    def __getstate__(self):
        return {"nnet": self.nnet, "options": self.options, "capacity": self.capacity,
                "use_shortcut": self.use_shortcut, "check": self.check,
                "network_options": self.network_options}

    def __setstate__(self, state):
        self.__init__(state["nnet"], state["options"], state["capacity"],
                      state["use_shortcut"], state["check"], state.get("network_options"))

    @property
    def compiled_nnet(self):
        """The network computations are compiled for: ``nnet`` itself, or its
        network-optimized copy (see ``network_optimize``)."""
        self._check_network()
        return self._compiled_nnet

    # -- internals --------------------------------------------------------------------------
    def _reset_counters(self) -> None:
        self._counts = {"hits": 0, "misses": 0, "evictions": 0, "shortcut": 0,
                        "shortcut_fallbacks": 0, "invalidations": 0}
        self._seconds = dict.fromkeys(PHASES, 0.0)

    def _add_time(self, phase: str, seconds: float) -> None:
        with self._lock:
            self._seconds[phase] += seconds

    def network_stamp(self) -> tuple:
        """The network's nodes and components (the objects) plus the test-mode
        flags of the components that have one (which change property flags, e.g.
        BatchNorm's). Other in-place changes to a component's configuration are not
        seen; call :meth:`clear` after such surgery."""
        nnet = self.nnet
        comps = tuple(nnet.components.values())
        # (a fused kernel's mode is its linear layer's: read there, not through the
        # fused component's attribute forwarding, which costs microseconds per look)
        modal = tuple(c for c in map(linear_part, comps) if "test_mode" in c.__dict__
                      or type(c).set_test_mode is not Component.set_test_mode)
        return (tuple(nnet.nodes), comps, modal, _test_modes(modal))

    def _network_changed(self) -> bool:
        """Whether the network differs from the last stamp, in about a microsecond
        (this runs on every compile). Tuple equality looks at identity first, so
        unchanged nodes and components cost a pointer comparison each (a node
        replaced by an equal one counts as unchanged)."""
        stamp = self._stamp
        if stamp is None:
            return True
        nodes, comps, modal, modes = stamp
        nnet = self.nnet
        return not (tuple(nnet.nodes) == nodes
                    and tuple(nnet.components.values()) == comps
                    and _test_modes(modal) == modes)

    def _check_network(self) -> None:
        if not self._network_changed():
            return
        with self._lock:
            if not self._network_changed():
                return
            if self._stamp is not None:
                self._entries.clear()
                self._buckets.clear()
                self._counts["invalidations"] += 1
                self._generation += 1
            if self.network_options is not None:
                self._compiled_nnet = optimize_network(self.nnet, self.network_options)
            self._policy = shift_policy(self._compiled_nnet, self.options)
            self._stamp = self.network_stamp()

    def _lookup(self, rk: RequestKey):
        """The cached value for ``rk`` (exact match within its bucket), or None.
        Caller holds the lock."""
        for serial in self._buckets.get(rk.key, ()):
            e = self._entries[serial]
            if rk.matches(e.arrays, e.shift):
                self._entries.move_to_end(serial)
                return e.value
        return None

    def _get_or_build(self, rk: RequestKey, build):
        """Cached value for ``rk``, or ``build()`` stored under it. A thread that
        finds another compiling the same bucket waits for it and looks again."""
        while True:
            with self._lock:
                value = self._lookup(rk)
                if value is not None:
                    self._counts["hits"] += 1
                    return value
                event = self._inflight.get(rk.key)
                owner = event is None
                if owner:
                    event = self._inflight[rk.key] = threading.Event()
                    self._counts["misses"] += 1
                    generation = self._generation
            if not owner:
                event.wait()
                continue  # the owner stored it (or failed / compiled another request)
            try:
                value = build()
                self._store(rk.key, [a.copy() for a in rk.arrays], rk.shift, value,
                            generation)
                return value
            finally:
                with self._lock:
                    del self._inflight[rk.key]
                event.set()

    def _store(self, key: tuple, arrays: list, shift: tuple, value,
               generation: int | None = None) -> None:
        """Add an entry (not when ``generation``, the one its build began in, has
        passed: it was made for the network before a change)."""
        with self._lock:
            if generation is not None and generation != self._generation:
                return
            self._serial += 1
            self._entries[self._serial] = _Entry(key, arrays, shift, value)
            self._buckets.setdefault(key, []).append(self._serial)
            while len(self._entries) > self.capacity:
                serial, old = self._entries.popitem(last=False)
                bucket = self._buckets[old.key]
                bucket.remove(serial)
                if not bucket:
                    del self._buckets[old.key]
                self._counts["evictions"] += 1

    def _build(self, request) -> NnetComputation:
        # the cyclic collector is paused for the whole miss (compile, optimize,
        # expand): its runs would walk every cached computation (pynnet3.gcpause)
        with gc_paused():
            return self._build_unpaused(request)

    def _build_unpaused(self, request) -> NnetComputation:
        if self.use_shortcut:
            layouts = request_layouts(request)
            mini = mini_request(request, layouts, any_n0=self._policy.n_shift)
            if mini is not None:
                comp = self._shortcut(request, mini, layouts[0].num_n)
                if comp is not None:
                    return comp
        comp = self._compile_full(request)
        self._run_check(comp)
        return comp

    def _shortcut(self, request, mini, num_n: int) -> NnetComputation | None:
        t0 = time.perf_counter()
        mini_key = request_key(mini, self._policy, ("mini",))
        self._add_time("key", time.perf_counter() - t0)
        entry = self._get_or_build(mini_key, lambda: self._build_mini(mini))
        t0 = time.perf_counter()
        try:
            if entry.failed:
                raise ExpansionError("known not to expand")
            if entry.plan is None:
                entry.plan = ExpansionPlan(entry.computation, entry.snapshot,
                                           self._compiled_nnet)
            comp = entry.plan.expand(num_n, request)
            check_matrix_sizes(comp)
        except ExpansionError:
            entry.failed = True
            with self._lock:
                self._counts["shortcut_fallbacks"] += 1
            return None
        finally:
            self._add_time("expand", time.perf_counter() - t0)
        with self._lock:
            self._counts["shortcut"] += 1
        self._run_check(comp)
        return comp

    def _build_mini(self, mini) -> _MiniEntry:
        unopt = self._compile_unoptimized(mini)
        snapshot = snapshot_precomputed(unopt)
        comp = self._optimize(unopt)
        self._run_check(comp)
        return _MiniEntry(comp, rekey_snapshot(snapshot, comp))

    def _compile_full(self, request) -> NnetComputation:
        return self._optimize(self._compile_unoptimized(request))

    def _compile_unoptimized(self, request) -> NnetComputation:
        """``compile_computation`` (exactly: the cache must return what the plain
        compiler returns), with its phases timed when it reports them."""
        timings: dict[str, float] = {}
        comp = compile_computation(self._compiled_nnet, request, timings=timings)
        for phase, seconds in timings.items():
            self._add_time(phase, seconds)
        return comp

    def _optimize(self, comp: NnetComputation) -> NnetComputation:
        if not (self.options.optimize or self.options.optimize_looped_computation):
            return comp
        t0 = time.perf_counter()
        comp = run_optimizer(comp, self._compiled_nnet, self.options, check=self.check)
        self._add_time("optimize", time.perf_counter() - t0)
        return comp

    def _run_check(self, comp: NnetComputation) -> None:
        if not self.check:
            return
        from ..analysis.checker import check_computation

        t0 = time.perf_counter()
        try:
            check_computation(comp, self._compiled_nnet, context="CachingCompiler")
        finally:
            self._add_time("check", time.perf_counter() - t0)

    def policy(self) -> ShiftPolicy:
        """The offsets this compiler's keys ignore (see :mod:`pynnet3.cache.key`)."""
        self._check_network()
        return self._policy


def _test_modes(components: tuple) -> tuple:
    return tuple(map(getattr, components, repeat("test_mode"), repeat(None)))


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str:
    """The dtype's name (float32 for None), memoized: np.dtype() costs microseconds."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        import numpy as np

        name = np.dtype(np.float32 if dtype is None else dtype).name
        try:
            _DTYPE_NAMES[dtype] = name
        except TypeError:  # an unhashable dtype-like
            pass
    return name


_NNET_CACHE_LOCK = threading.Lock()


def cache_for(nnet, network_optimize=None, derivatives: bool = False) -> CachingCompiler:
    """The CachingCompiler a network carries (made with default options on first
    use and kept on the network object); with ``network_optimize`` (True or a
    NetworkOptions), the one that compiles for its network-optimized copy. With
    ``derivatives`` (a request that backpropagates), that copy keeps derivatives
    exact (``keep_derivatives``: a BackpropTruncation, say, stays)."""
    if network_optimize is not None and network_optimize is not False:
        opts = NetworkOptions() if network_optimize is True else network_optimize
        if derivatives and not opts.keep_derivatives:
            opts = dataclasses.replace(opts, keep_derivatives=True)
        with _NNET_CACHE_LOCK:
            table = nnet.__dict__.get("_network_optimized_caches")
            if table is None or table[0] is not nnet:
                table = (nnet, {})
                object.__setattr__(nnet, "_network_optimized_caches", table)
            cc = table[1].get(opts.key())
            if cc is None:
                cc = table[1][opts.key()] = CachingCompiler(nnet, network_optimize=opts)
        return cc
    cc = nnet.__dict__.get("_compile_cache")
    if cc is None or cc.nnet is not nnet:  # (a shallow copy shares the attribute)
        with _NNET_CACHE_LOCK:
            cc = nnet.__dict__.get("_compile_cache")
            if cc is None or cc.nnet is not nnet:
                cc = CachingCompiler(nnet)
                object.__setattr__(nnet, "_compile_cache", cc)
    return cc


#: requests of at most this many sequences (and the rules added for them): a
#: recurrent layer's step of a few rows is a product bound by reading its weights,
#: and taking its input's product out of the step pays (tdnn_lstm at 1 sequence ~40%
#: less time). ``pynnet3.run(..., network_optimize=True)`` (few_sequences_cache) and
#: ``pynnet3 compute`` (chunks per request) use them.
FEW_SEQUENCES = 8
FEW_SEQUENCES_RULES = ("split-recurrent-affine",)


def few_sequences_cache(nnet, default: CachingCompiler) -> CachingCompiler | None:
    """The network-optimized cache for requests of one or a few sequences: default
    network options plus :data:`FEW_SEQUENCES_RULES` (a recurrent layer's input
    product taken out of its steps). None when those rules change nothing in the
    network (no recurrence they apply to): ``default`` (the cache of the default
    options) serves those requests, and no second copy is compiled for."""
    cc = cache_for(nnet, NetworkOptions(enable_rules=FEW_SEQUENCES_RULES))
    with _NNET_CACHE_LOCK:
        table = nnet.__dict__.get("_network_optimized_caches")
        verdicts = table[1].setdefault("few-sequences", {})
    # (the verdict is the networks' shapes, per network stamp: a changed network
    # gets a new look)
    stamp = id(cc.compiled_nnet), id(default.compiled_nnet)
    useful = verdicts.get(stamp)
    if useful is None:
        names = [n.name for n in cc.compiled_nnet.nodes]
        useful = verdicts[stamp] = names != [n.name for n in default.compiled_nnet.nodes]
    return cc if useful else None
