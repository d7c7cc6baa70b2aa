"""Which cindexes can be computed from the inputs of a request.

Computability is the least fixed point of the descriptor rules (Sum needs both
sides, Failover either, IfDefined nothing, an input node only what the request
supplies, a non-simple component what its ``input_indexes`` require). It is
memoized per node and evaluated on demand, vectorized over batches of indexes.

A question about a node outside any recurrence is answered for a whole *region*
at once: demand flows consumers-first through the non-recurrent nodes above it
(every cindex that may be read, IfDefined/Failover sides included), then each
node is evaluated once, sources first, for all its demanded cindexes. So a node
costs a few array operations per compile instead of one round per small batch of
edge frames that each consumer happens to ask about. Nodes of a recurrent SCC
(and what their evaluation asks of the nodes below) are evaluated lazily, batch
by batch, as follows.

Recurrences (``c(t)`` reading ``c(t-1)``) make evaluation re-enter a batch that
is still being evaluated. Such "in progress" cindexes are taken as not computable
and the batch that owns them iterates until nothing changes; because every rule
is monotone this reaches the least fixed point. A "computable" answer is always
final; a "not computable" answer that leaned on an outer batch still in progress
is forgotten so that it is asked again later.
"""

from __future__ import annotations

import math

import numpy as np

from ..components.base import Flags
from ..descriptor import (
    UNBOUNDED,
    TimeBounds,
    dependency_keys,
    descriptor_computable_keys,
    descriptor_time_bounds,
    resolve_part_keys,
)
from ..index import pack, unique_inverse, unique_keys, unpack
from .epochs import is_recurrent_scc, node_sccs
from .keymap import KeyMap

UNKNOWN, YES, NO, IN_PROGRESS = 0, 1, 2, 3
_SIMPLE = int(Flags.SIMPLE)
_NO_HIT = 1 << 60


class Computability:
    """``computable(node, indexes) -> bool mask`` for one network and one set of
    available inputs (``inputs``: input-node name -> ``(k, 3)`` indexes)."""

    # Evaluate non-recurrent nodes by regions (module doc); False: batch by batch
    # like the nodes of a recurrence (the slower reference, kept for tests).
    use_regions: bool = True
    # Let statistics components leave out window frames that cannot exist
    # (see input_deps); False: the full windows (reference, for tests).
    clip_windows: bool = True
    # Keep what a region's rules found (the terms of descriptor rules, the inputs
    # of non-simple components) for the graph builder; False: it works them out
    # again (reference, for tests).
    keep_rules: bool = True

    def __init__(self, nnet, inputs: dict[str, np.ndarray]):
        self.nnet = nnet
        self.nodes = nnet.node_map
        self.maps: dict[str, KeyMap] = {name: KeyMap() for name in self.nodes}
        for name, node in self.nodes.items():
            if node.kind == "input-node":
                given = inputs.get(name)
                if given is not None and len(given):
                    self.maps[name].set(pack(given), YES)
        self._next_frame = 0
        self._min_hit = _NO_HIT
        self.sccs = node_sccs(nnet)
        # Topological position of every node (sources first) and whether it is
        # part of a recurrence (evaluated lazily) or not (evaluated by regions).
        self._position: dict[str, int] = {}
        self.recurrent: dict[str, bool] = {}  # node -> in a recurrent SCC
        for scc in self.sccs:
            rec = is_recurrent_scc(nnet, scc, self.nodes)
            for name in scc:
                self._position[name] = len(self._position)
                self.recurrent[name] = rec
        self._is_input = {name: node.kind == "input-node" for name, node in self.nodes.items()}
        # component node -> its component's property flags (an int: tests on the
        # enum are slow, and the command compiler reads them too), and whether
        # it is simple
        self.flags: dict[str, int] = {}
        self.simple: dict[str, bool] = {}
        for name, node in self.nodes.items():
            if node.kind == "component-node":
                flags = self.flags[name] = int(nnet.components[node.component].properties())
                self.simple[name] = bool(flags & _SIMPLE)
        self._inputs = inputs
        self._bounds: dict[str, TimeBounds] | None = None
        # non-simple node -> (sorted output keys, sorted unique keys of their
        # available inputs), left by the graph builder for the command compiler
        self.input_memo: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        # What a region's rule found for a node, which the graph builder takes
        # over when it needs exactly the same cindexes: (the keys, then for a
        # descriptor rule (simple component, output) the terms of each part; for
        # a non-simple component its InputDeps, which dependencies are available,
        # their sorted unique keys, each one's position among those, which of
        # those are available). None for a node evaluated by several regions.
        self.resolved: dict[str, tuple | None] = {}
        # non-simple node -> (keys, input_deps at them): the last ones asked about
        # (a region's demand, its rule and the graph builder ask about the same)
        self._deps_at: dict[str, tuple[np.ndarray, object]] = {}

    def computable(self, node: str, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) == 0:
            return np.zeros(0, dtype=bool)
        return self.computable_keys(node, pack(idx))

    def computable_keys(self, node: str, keys: np.ndarray) -> np.ndarray:
        """:meth:`computable` of packed index keys."""
        if len(keys) == 0:
            return np.zeros(0, dtype=bool)
        kmap = self.maps[node]
        state = kmap.lookup(keys, UNKNOWN)
        if self._is_input[node]:
            return state == YES
        if not self.recurrent[node] and self.use_regions:
            # Only YES / NO / UNKNOWN here (nothing outside a recurrence is ever
            # in progress, see _evaluate_region).
            if not state.all():
                self._evaluate_region(node, unique_keys(keys[state == UNKNOWN]))
                state = kmap.lookup(keys, UNKNOWN)
            return state == YES
        busy = state >= IN_PROGRESS
        if busy.any():
            self._min_hit = min(self._min_hit, int(state[busy].min()) - IN_PROGRESS)
        unknown = state == UNKNOWN
        if unknown.any():
            self._evaluate_batch(node, unique_keys(keys[unknown]))
            state = kmap.lookup(keys, UNKNOWN)
        return state == YES

    def _evaluate_region(self, root: str, ukeys: np.ndarray) -> None:
        """Evaluate ``root`` at ``ukeys`` (unknown, sorted, unique) together with
        everything it may read in the non-recurrent nodes above it (module doc).

        Nothing in the region can be in progress: a batch in progress belongs to a
        recurrence that (directly or not) consumes ``root``, and no node the region
        reaches can read that recurrence, so every answer here is final."""
        position = self._position
        pending: dict[str, list[np.ndarray]] = {root: [ukeys]}
        region: list[tuple[str, np.ndarray]] = []
        while pending:
            name = max(pending, key=position.__getitem__)
            parts = pending.pop(name)
            if self._is_input[name]:
                continue  # known from the request
            keys = parts[0] if len(parts) == 1 else unique_keys(np.concatenate(parts))
            kmap = self.maps[name]
            if kmap.blocks:
                keys = keys[kmap.lookup(keys, UNKNOWN) == UNKNOWN]
            if not len(keys):
                continue
            region.append((name, keys))
            if self.recurrent[name]:
                continue  # evaluated lazily (below), asking its sources as it goes
            for src, skeys in self._demand(name, keys):
                pending.setdefault(src, []).append(skeys)
        for name, keys in reversed(region):  # sources first
            if self.recurrent[name]:
                self.computable_keys(name, keys)
                continue
            kmap = self.maps[name]
            if kmap.blocks:  # (a lazily evaluated recurrence may have asked meanwhile)
                todo = kmap.lookup(keys, UNKNOWN) == UNKNOWN
                if not todo.all():
                    keys = keys[todo]
                if not len(keys):
                    continue
            n = self.nodes[name]
            if not self.keep_rules or n.kind == "dim-range-node":
                res = self._rule(name, keys)
            elif name in self.resolved:  # (evaluated by an earlier region too)
                res = self._rule(name, keys)
                self.resolved[name] = None
            elif n.kind == "component-node" and not self.simple[name]:
                res, found = self._nonsimple_rule(n, keys)
                self.resolved[name] = (keys, *found)
            else:
                # The rule, with the terms each computable row uses (the region
                # evaluated every cindex they may read, so this costs no more).
                res = np.ones(len(keys), dtype=bool)
                parts = []
                for part in n.descriptor.parts:
                    ok, terms = resolve_part_keys(part, keys, self.computable_keys)
                    res &= ok
                    parts.append(terms)
                self.resolved[name] = (keys, parts)
            kmap.add_new(keys, np.where(res, YES, NO))

    def _demand(self, name: str, keys: np.ndarray):
        """(source node, sorted unique keys) of every cindex that evaluating the
        rule of non-input node ``name`` at ``keys`` may read."""
        n = self.nodes[name]
        if n.kind == "dim-range-node":
            yield n.source, keys
            return
        if n.kind == "component-node" and not self.simple[name]:
            deps = self.input_deps_at(n, keys)
            if not len(deps.owner):
                return
            keys = unique_keys(pack(deps.indexes))
        for node, src in dependency_keys(n.descriptor, keys):
            if len(src):
                yield node, unique_keys(src)

    def _evaluate_batch(self, node: str, ukeys: np.ndarray) -> None:
        kmap = self.maps[node]
        frame = self._next_frame
        self._next_frame += 1
        kmap.set(ukeys, IN_PROGRESS + frame)
        outer_hit = self._min_hit
        done = np.zeros(len(ukeys), dtype=bool)
        while True:
            self._min_hit = _NO_HIT
            todo = ~done
            res = self._rule(node, ukeys[todo])
            newly = np.flatnonzero(todo)[res]
            if len(newly):
                kmap.set(ukeys[newly], YES)
                done[newly] = True
            hit = self._min_hit
            if hit == _NO_HIT or (hit >= frame and not len(newly)):
                # Nothing in progress was consulted, or only our own batch and it
                # has converged: the remaining rows are definitely not computable.
                kmap.set(ukeys[~done], NO)
                break
            if hit < frame and not len(newly):
                # Leaned on an outer batch: forget the negative answers.
                kmap.set(ukeys[~done], UNKNOWN)
                break
            if done.all():
                break
        if hit < frame:
            outer_hit = min(outer_hit, hit)
        self._min_hit = outer_hit

    def _rule(self, name: str, keys: np.ndarray) -> np.ndarray:
        """One application of the computability rule of node ``name`` (at packed
        keys)."""
        n = self.nodes[name]
        if len(keys) == 0:
            return np.zeros(0, dtype=bool)
        if n.kind == "dim-range-node":
            return self.computable_keys(n.source, keys)
        if n.kind == "component-node" and not self.simple[name]:
            return self._nonsimple_rule(n, keys)[0]
        return descriptor_computable_keys(n.descriptor, keys, self.computable_keys)

    def _nonsimple_rule(self, n, keys: np.ndarray) -> tuple[np.ndarray, tuple]:
        """The rule of a non-simple component node at ``keys``, and (InputDeps,
        which dependencies are available, their sorted unique keys, each one's
        position among those, which of those are available)."""
        deps = self.input_deps_at(n, keys)
        k = len(keys)
        ukeys, inv = unique_inverse(pack(deps.indexes))
        avail_u = descriptor_computable_keys(n.descriptor, ukeys, self.computable_keys)
        ok = avail_u[inv]
        found = (deps, ok, ukeys, inv, avail_u)
        if len(deps.owner) == 0:
            res = np.zeros(k, dtype=bool) if deps.any_suffices else np.ones(k, dtype=bool)
            return res, found
        missing_required = np.bincount(deps.owner[deps.required & ~ok], minlength=k) > 0
        res = ~missing_required
        if deps.any_suffices:
            res &= np.bincount(deps.owner[ok], minlength=k) > 0
        return res, found

    def input_available(self, n, idx: np.ndarray) -> np.ndarray:
        """Whether the component-input (the descriptor of node ``n``) is computable."""
        ukeys, inv = unique_inverse(pack(idx))
        return descriptor_computable_keys(n.descriptor, ukeys, self.computable_keys)[inv]

    def input_deps_at(self, n, keys: np.ndarray):
        """:meth:`input_deps` at packed keys, remembered for the last keys asked
        about per node."""
        memo = self._deps_at.get(n.name)
        if memo is not None and (memo[0] is keys or np.array_equal(memo[0], keys)):
            return memo[1]
        deps = self.input_deps(n, unpack(keys))
        self._deps_at[n.name] = (keys, deps)
        return deps

    # -- time bounds -------------------------------------------------------------------------
    def input_deps(self, n, idx: np.ndarray):
        """``input_indexes(idx)`` of the (non-simple) component of node ``n``, less
        dependencies that certainly cannot be computed when the component can
        leave them out (``input_indexes_within``: a statistics window of 10001
        frames is cut to the frames the input can have). What is left out is
        never available, so computability and the inputs used are unchanged."""
        comp = self.nnet.components[n.component]
        within = getattr(comp, "input_indexes_within", None) if self.clip_windows else None
        if within is not None:
            lo, hi = descriptor_time_bounds(n.descriptor, self.time_bounds)
            if lo > -math.inf or hi < math.inf:
                return within(idx, lo, hi)
        return comp.input_indexes(idx)

    def time_bounds(self, name: str) -> TimeBounds:
        """Bounds on the t of the computable cindexes of node ``name`` (see
        :func:`pynnet3.descriptor.part_time_bounds`); recurrences and components
        without an ``output_time_bounds`` method are unbounded."""
        if self._bounds is None:
            self._bounds = self._all_time_bounds()
        return self._bounds[name]

    def _all_time_bounds(self) -> dict[str, TimeBounds]:
        bounds: dict[str, TimeBounds] = {}
        get = bounds.__getitem__
        for scc in self.sccs:  # sources first
            for name in scc:
                n = self.nodes[name]
                if self.recurrent[name]:
                    b = UNBOUNDED
                elif n.kind == "input-node":
                    given = self._inputs.get(name)
                    if given is None or not len(given):
                        b = (math.inf, -math.inf)
                    else:
                        t = np.asarray(given)[:, 1]
                        b = (int(t.min()), int(t.max()))
                elif n.kind == "dim-range-node":
                    b = bounds[n.source]
                else:
                    b = descriptor_time_bounds(n.descriptor, get)
                    if n.kind == "component-node" and not self.simple[name]:
                        hook = getattr(self.nnet.components[n.component],
                                       "output_time_bounds", None)
                        b = hook(b) if hook is not None else UNBOUNDED
                bounds[name] = b
        return bounds
