"""Which cindexes can be computed from the inputs of a request.

Computability is the least fixed point of the descriptor rules (Sum needs both
sides, Failover either, IfDefined nothing, an input node only what the request
supplies, a non-simple component what its ``input_indexes`` require). It is
evaluated lazily and memoized per node, vectorized over batches of indexes.

Recurrences (``c(t)`` reading ``c(t-1)``) make evaluation re-enter a batch that
is still being evaluated. Such "in progress" cindexes are taken as not computable
and the batch that owns them iterates until nothing changes; because every rule
is monotone this reaches the least fixed point. A "computable" answer is always
final; a "not computable" answer that leaned on an outer batch still in progress
is forgotten so that it is asked again later.
"""

from __future__ import annotations

import numpy as np

from ..descriptor import descriptor_computable
from ..index import pack, unpack
from .keymap import KeyMap, unique_inverse, unique_keys

UNKNOWN, YES, NO, IN_PROGRESS = 0, 1, 2, 3
_NO_HIT = 1 << 60


class Computability:
    """``computable(node, indexes) -> bool mask`` for one network and one set of
    available inputs (``inputs``: input-node name -> ``(k, 3)`` indexes)."""

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

    def computable(self, node: str, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) == 0:
            return np.zeros(0, dtype=bool)
        n = self.nodes[node]
        keys = pack(idx)
        kmap = self.maps[node]
        state = kmap.lookup(keys, UNKNOWN)
        if n.kind == "input-node":
            return state == YES
        busy = state >= IN_PROGRESS
        if busy.any():
            self._min_hit = min(self._min_hit, int(state[busy].min()) - IN_PROGRESS)
        unknown = state == UNKNOWN
        if unknown.any():
            self._evaluate_batch(node, unique_keys(keys[unknown]))
            state = kmap.lookup(keys, UNKNOWN)
        return state == YES

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
        if n.kind == "component-node":
            comp = self.nnet.components[n.component]
            if not comp.is_simple():
                return self._nonsimple_rule(n, comp, idx)
        return descriptor_computable(n.descriptor, idx, self.computable)

    def _nonsimple_rule(self, n, comp, idx: np.ndarray) -> np.ndarray:
        deps = comp.input_indexes(idx)
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
