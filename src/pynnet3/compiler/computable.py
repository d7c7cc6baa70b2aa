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

from ..descriptor import UNBOUNDED, TimeBounds, descriptor_computable, descriptor_time_bounds
from ..index import pack, unpack
from .epochs import is_recurrent_scc, node_sccs
from .keymap import KeyMap, unique_inverse, unique_keys

UNKNOWN, YES, NO, IN_PROGRESS = 0, 1, 2, 3
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
            rec = is_recurrent_scc(nnet, scc)
            for name in scc:
                self._position[name] = len(self._position)
                self.recurrent[name] = rec
        self._is_input = {name: node.kind == "input-node" for name, node in self.nodes.items()}
        # component node -> whether its component is simple
        self.simple: dict[str, bool] = {}
        for name, node in self.nodes.items():
            if node.kind == "component-node":
                self.simple[name] = nnet.components[node.component].is_simple()
        self._inputs = inputs
        self._bounds: dict[str, TimeBounds] | None = None
        # non-simple node -> (sorted output keys, sorted unique keys of their
        # available inputs), left by the graph builder for the command compiler
        self.input_memo: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def computable(self, node: str, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) == 0:
            return np.zeros(0, dtype=bool)
        keys = pack(idx)
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
        region: list[tuple[str, np.ndarray, np.ndarray]] = []
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
            idx = unpack(keys)
            region.append((name, keys, idx))
            if self.recurrent[name]:
                continue  # evaluated lazily (below), asking its sources as it goes
            for src, skeys in self._demand(name, idx):
                pending.setdefault(src, []).append(skeys)
        for name, keys, idx in reversed(region):  # sources first
            if self.recurrent[name]:
                self.computable(name, idx)
                continue
            kmap = self.maps[name]
            if kmap.blocks:  # (a lazily evaluated recurrence may have asked meanwhile)
                todo = kmap.lookup(keys, UNKNOWN) == UNKNOWN
                if not todo.all():
                    keys, idx = keys[todo], idx[todo]
                if not len(keys):
                    continue
            res = self._rule(name, idx)
            kmap.add_new(keys, np.where(res, YES, NO))

    def _demand(self, name: str, idx: np.ndarray):
        """(source node, sorted unique keys) of every cindex that evaluating the
        rule of non-input node ``name`` at ``idx`` may read."""
        n = self.nodes[name]
        if n.kind == "dim-range-node":
            yield n.source, pack(idx)
            return
        if n.kind == "component-node" and not self.simple[name]:
            deps = self.input_deps(n, idx)
            if not len(deps.owner):
                return
            idx = unpack(unique_keys(pack(deps.indexes)))
        for d in n.descriptor.dependencies(idx):
            if len(d.indexes):
                yield d.node, unique_keys(pack(d.indexes))

    def _evaluate_batch(self, node: str, ukeys: np.ndarray) -> None:
        kmap = self.maps[node]
        frame = self._next_frame
        self._next_frame += 1
        kmap.set(ukeys, IN_PROGRESS + frame)
        uidx = unpack(ukeys)
        outer_hit = self._min_hit
        done = np.zeros(len(ukeys), dtype=bool)
        while True:
            self._min_hit = _NO_HIT
            todo = ~done
            res = self._rule(node, uidx[todo])
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

    def _rule(self, name: str, idx: np.ndarray) -> np.ndarray:
        """One application of the computability rule of node ``name``."""
        n = self.nodes[name]
        if len(idx) == 0:
            return np.zeros(0, dtype=bool)
        if n.kind == "dim-range-node":
            return self.computable(n.source, idx)
        if n.kind == "component-node" and not self.simple[name]:
            return self._nonsimple_rule(n, self.nnet.components[n.component], idx)
        return descriptor_computable(n.descriptor, idx, self.computable)

    def _nonsimple_rule(self, n, comp, idx: np.ndarray) -> np.ndarray:
        deps = self.input_deps(n, idx)
        k = len(idx)
        if len(deps.owner) == 0:
            return np.zeros(k, dtype=bool) if deps.any_suffices else np.ones(k, dtype=bool)
        ok = self.input_available(n, deps.indexes)
        missing_required = np.bincount(deps.owner[deps.required & ~ok], minlength=k) > 0
        res = ~missing_required
        if deps.any_suffices:
            res &= np.bincount(deps.owner[ok], minlength=k) > 0
        return res

    def input_available(self, n, idx: np.ndarray) -> np.ndarray:
        """Whether the component-input (the descriptor of node ``n``) is computable."""
        keys = pack(idx)
        ukeys, inv = unique_inverse(keys)
        return descriptor_computable(n.descriptor, unpack(ukeys), self.computable)[inv]

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
