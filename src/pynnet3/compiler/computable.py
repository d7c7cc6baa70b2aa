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
edge frames that each consumer happens to ask about.

A question about a node of a recurrence (``c(t)`` reading ``c(t-1)``) is answered
by a breadth-first worklist over that recurrence (Kaldi's ComputationGraphBuilder
with its four states, see seeds/001): never one Python call per time step, so a
recurrence over thousands of frames, or one whose start is found far back in
time, costs a loop, not a recursion. Each round

* admits the cindexes asked about (the question, then those of the previous
  round's frontier): they become PENDING, and so do, in the same round, the
  cindexes of the recurrence they read through edges that go forward in a
  fixed order of its nodes (sources-first order of the edges without a time
  shift, so one round covers all the nodes of a time step); what they read
  through the other edges (``c(t-1)``) waits for the next round;
* evaluates every pending cindex, sources first, until nothing changes, with
  Kaldi's two tests: computable even when every pending/unknown cindex of the
  recurrence is taken as not computable -> YES (final); not computable even
  when they are all taken as computable -> NO (final; every rule is monotone);
* takes as the next frontier what the still-undecided cindexes read through the
  waiting edges (a decided cindex needs nothing more: computability alone is
  asked here, the terms are the graph builder's business).

A cindex outside the time bounds of its node (an interval fixed point over the
recurrence, :meth:`Computability.solver_bounds`) is NO at once: this is what
stops ``Failover(Offset(c, -1), input)`` from walking to t = -inf. When the
frontier is empty the undecided cindexes form a closed set that the YES test
could not grow: in the least fixed point they are all NO. IfDefined and
Failover still choose by availability exactly as before: the answers are the
least fixed point of the rules, whatever the order of evaluation.
"""

from __future__ import annotations

import math

import numpy as np

from ..components.base import Flags
from ..descriptor import (
    UNBOUNDED,
    FailoverOf,
    IfDefinedOf,
    NodeRef,
    OffsetOf,
    SumOf,
    SwitchOf,
    TimeBounds,
    dependency_keys,
    descriptor_computable_keys,
    descriptor_time_bounds,
    resolve_part_keys,
)
from ..errors import ComputeError
from ..index import key_t, pack, unique_inverse, unique_keys, unpack
from .epochs import is_recurrent_scc, node_sccs
from .keymap import KeyMap

UNKNOWN, YES, NO, PENDING = 0, 1, 2, 3
_SIMPLE = int(Flags.SIMPLE)
_EMPTY: TimeBounds = (math.inf, -math.inf)
# Rounds of one recurrence's worklist before giving up: Kaldi's max_distance (its
# "Loop detected while building computation graph"). Only a recurrence whose
# computability is decided at t = -inf, beyond the time bounds, gets there (the old
# depth-first evaluation ran out of Python stack after a few hundred).
MAX_SOLVER_ROUNDS = 10000


class Computability:
    """``computable(node, indexes) -> bool mask`` for one network and one set of
    available inputs (``inputs``: input-node name -> ``(k, 3)`` indexes)."""

    # Evaluate non-recurrent nodes by regions (module doc); False: one node at a
    # time, for the cindexes asked about, its sources asked depth-first (the
    # slower reference, kept for tests).
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
        self.sccs = node_sccs(nnet)
        # Topological position of every node (sources first) and whether it is
        # part of a recurrence (evaluated lazily) or not (evaluated by regions).
        self._position: dict[str, int] = {}
        self.recurrent: dict[str, bool] = {}  # node -> in a recurrent SCC
        # node of a recurrence -> (its recurrence's nodes, each one's rank in it:
        # sources-first along the edges without a time shift)
        self._scc_rank: dict[str, dict[str, int]] = {}
        for scc in self.sccs:
            rec = is_recurrent_scc(nnet, scc, self.nodes)
            for name in scc:
                self._position[name] = len(self._position)
                self.recurrent[name] = rec
            if rec:
                rank = _unshifted_order(scc, self.nodes)
                for name in scc:
                    self._scc_rank[name] = rank
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
        self._solver_bounds: dict[str, TimeBounds] | None = None
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
            # (nothing outside a recurrence is ever pending, see _solve)
            if not state.all():
                self._evaluate_region(node, unique_keys(keys[state == UNKNOWN]))
                state = kmap.lookup(keys, UNKNOWN)
            return state == YES
        unknown = state == UNKNOWN
        if unknown.any():
            ukeys = unique_keys(keys[unknown])
            if self.recurrent[node]:
                self._solve(node, ukeys)
            else:  # (use_regions off: node by node, sources asked depth-first)
                res = self._rule(node, ukeys, self.computable_keys)
                kmap.set(ukeys, np.where(res, YES, NO))
            state = kmap.lookup(keys, UNKNOWN)
        # A cindex still pending would mean that a recurrence's evaluation asked
        # about itself from outside its worklist, which cannot happen: the nodes
        # its rules read outside it are its sources.
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

    # -- recurrences: breadth-first worklist (module doc) ---------------------------------
    def _solve(self, root: str, ukeys: np.ndarray) -> None:
        """Decide ``root`` (a node of a recurrence) at ``ukeys`` (unknown, sorted,
        unique), and whatever of its recurrence that takes, breadth-first."""
        # the pending cindexes of the recurrence, per node (not decided yet)
        open_: dict[str, np.ndarray] = {}
        try:
            self._worklist(root, ukeys, open_)
        except BaseException:
            for name, keys in open_.items():  # (an error: leave nothing pending)
                self.maps[name].set(keys, UNKNOWN)
            raise

    def _worklist(self, root: str, ukeys: np.ndarray, open_: dict[str, np.ndarray]) -> None:
        rank = self._scc_rank[root]
        maps = self.maps
        frontier: dict[str, list[np.ndarray]] = {root: [ukeys]}

        def pessimistic(node: str, keys: np.ndarray) -> np.ndarray:
            if node in rank:  # pending / unknown taken as not computable
                return maps[node].lookup(keys, UNKNOWN) == YES
            return self.computable_keys(node, keys)

        def optimistic(node: str, keys: np.ndarray) -> np.ndarray:
            if node in rank:  # pending / unknown taken as computable
                return maps[node].lookup(keys, UNKNOWN) != NO
            return self.computable_keys(node, keys)

        rounds = 0
        while frontier:
            rounds += 1
            if rounds > MAX_SOLVER_ROUNDS:
                raise ComputeError(
                    f"computability of recurrence {sorted(rank)} does not terminate after "
                    f"{MAX_SOLVER_ROUNDS} rounds (a recurrence decided only at t = -inf?)")
            # Admit the frontier and what it reads forward in rank order (consumers
            # first); what it reads backward waits for the next round.
            admitted: dict[str, np.ndarray] = {}
            pending = frontier
            while pending:
                name = max(pending, key=rank.__getitem__)
                parts = pending.pop(name)
                keys = parts[0] if len(parts) == 1 else unique_keys(np.concatenate(parts))
                keys = self._admit(name, keys)
                if not len(keys):
                    continue
                admitted[name] = keys
                prev = open_.get(name)
                open_[name] = keys if prev is None else np.concatenate([prev, keys])
                r = rank[name]
                for src, skeys in self._demand(name, keys):
                    if rank.get(src, r) < r:
                        pending.setdefault(src, []).append(skeys)
            # Evaluate, sources first, until nothing changes: first what was
            # admitted (to both tests a cindex just admitted is what an unknown one
            # was, so the rest can only change once something is decided), then,
            # while something is, everything pending.
            order = sorted(open_, key=rank.__getitem__)
            sweep: dict[str, np.ndarray] = admitted
            while True:
                changed = False
                for name in order:
                    keys = sweep.get(name)
                    if keys is None or not len(keys):
                        continue
                    n_keys = len(keys)
                    yes = self._rule(name, keys, pessimistic)
                    if yes.any():
                        maps[name].set(keys[yes], YES)
                        keys = keys[~yes]
                    if len(keys):
                        maybe = self._rule(name, keys, optimistic)
                        if not maybe.all():
                            maps[name].set(keys[~maybe], NO)
                            keys = keys[maybe]
                    if len(keys) == n_keys:
                        continue
                    changed = True
                    if sweep is admitted:  # (they are the last ones of the node)
                        whole = open_[name]
                        open_[name] = np.concatenate([whole[:len(whole) - n_keys], keys])
                    else:
                        open_[name] = keys
                if not changed:
                    break
                sweep = open_
            for name in [name for name, keys in open_.items() if not len(keys)]:
                del open_[name]
            # Next frontier: what the undecided cindexes admitted this round read
            # backward in rank order (the rest they read is admitted already).
            frontier = {}
            if not open_:
                break
            for name, keys in admitted.items():
                still = open_.get(name)
                if still is None:
                    continue
                keys = keys[np.isin(keys, still, assume_unique=True)]
                if not len(keys):
                    continue
                r = rank[name]
                for src, skeys in self._demand(name, keys):
                    if rank.get(src, -1) >= r:
                        frontier.setdefault(src, []).append(skeys)
        # Closed and not growing under the YES test: not computable (least fixed
        # point).
        for name, keys in open_.items():
            maps[name].set(keys, NO)
        open_.clear()

    def _admit(self, name: str, keys: np.ndarray) -> np.ndarray:
        """Of ``keys`` (sorted, unique) of recurrent node ``name``, the unknown ones
        within its time bounds, now pending; those outside are set NO."""
        kmap = self.maps[name]
        if kmap.blocks:
            keys = keys[kmap.lookup(keys, UNKNOWN) == UNKNOWN]
            if not len(keys):
                return keys
        lo, hi = self.solver_bounds(name)
        if lo > -math.inf or hi < math.inf:
            t = key_t(keys)
            inside = (t >= lo) & (t <= hi)
            if not inside.all():
                kmap.set(keys[~inside], NO)
                keys = keys[inside]
                if not len(keys):
                    return keys
        kmap.set(keys, PENDING)
        return keys

    def _rule(self, name: str, keys: np.ndarray, available=None) -> np.ndarray:
        """One application of the computability rule of node ``name`` (at packed
        keys), asking ``available(node, keys)`` (default: :meth:`computable_keys`)
        about its sources."""
        if available is None:
            available = self.computable_keys
        n = self.nodes[name]
        if len(keys) == 0:
            return np.zeros(0, dtype=bool)
        if n.kind == "dim-range-node":
            return np.array(available(n.source, keys), dtype=bool)
        if n.kind == "component-node" and not self.simple[name]:
            return self._nonsimple_rule(n, keys, available)[0]
        return descriptor_computable_keys(n.descriptor, keys, available)

    def _nonsimple_rule(self, n, keys: np.ndarray, available=None) -> tuple[np.ndarray, tuple]:
        """The rule of a non-simple component node at ``keys``, and (InputDeps,
        which dependencies are available, their sorted unique keys, each one's
        position among those, which of those are available)."""
        deps = self.input_deps_at(n, keys)
        k = len(keys)
        ukeys, inv = unique_inverse(pack(deps.indexes))
        avail_u = descriptor_computable_keys(n.descriptor, ukeys,
                                             available or self.computable_keys)
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

    def solver_bounds(self, name: str) -> TimeBounds:
        """:meth:`time_bounds`, but with the bounds of recurrences worked out too (an
        interval fixed point, see :meth:`_recurrence_bounds`); what the worklist of
        a recurrence uses to stop at the frames where nothing can be computable."""
        if self._solver_bounds is None:
            self._solver_bounds = self._all_time_bounds(recurrences=True)
        return self._solver_bounds[name]

    def _node_bounds(self, name: str, get) -> TimeBounds:
        """Bounds of non-input node ``name`` from those of its sources (``get``)."""
        n = self.nodes[name]
        if n.kind == "dim-range-node":
            return get(n.source)
        b = descriptor_time_bounds(n.descriptor, get)
        if n.kind == "component-node" and not self.simple[name]:
            hook = getattr(self.nnet.components[n.component], "output_time_bounds", None)
            b = hook(b) if hook is not None else UNBOUNDED
        return b

    def _all_time_bounds(self, recurrences: bool = False) -> dict[str, TimeBounds]:
        bounds: dict[str, TimeBounds] = {}
        get = bounds.__getitem__
        for scc in self.sccs:  # sources first
            if self.recurrent[scc[0]]:
                if recurrences:
                    bounds.update(self._recurrence_bounds(scc, bounds))
                else:
                    bounds.update((name, UNBOUNDED) for name in scc)
                continue
            for name in scc:
                n = self.nodes[name]
                if n.kind == "input-node":
                    given = self._inputs.get(name)
                    if given is None or not len(given):
                        b = _EMPTY
                    else:
                        t = np.asarray(given)[:, 1]
                        b = (int(t.min()), int(t.max()))
                else:
                    b = self._node_bounds(name, get)
                bounds[name] = b
        return bounds

    def _recurrence_bounds(self, scc: list[str], outer: dict[str, TimeBounds]
                           ) -> dict[str, TimeBounds]:
        """Bounds of the nodes of a recurrence: the least fixed point of the bound
        rules from "nothing computable", widened (a side that moves again goes to
        infinity, so it ends after a few sweeps). The result is a post-fixed point
        of sound rules, so it contains every computable cindex (Knaster-Tarski)."""
        cur: dict[str, TimeBounds] = {name: _EMPTY for name in scc}

        def get(node: str) -> TimeBounds:
            b = cur.get(node)
            return outer[node] if b is None else b

        changed = True
        while changed:
            changed = False
            for name in scc:
                old = cur[name]
                b = self._node_bounds(name, get)
                if b[0] > b[1]:
                    continue  # nothing new
                if old[0] > old[1]:
                    cur[name] = b
                    changed = True
                    continue
                lo = old[0] if b[0] >= old[0] else -math.inf
                hi = old[1] if b[1] <= old[1] else math.inf
                if (lo, hi) != old:
                    cur[name] = (lo, hi)
                    changed = True
        return cur


def _unshifted_nodes(e) -> list[str]:
    """Nodes that part ``e`` reads at the very index of the row (no Offset, Round
    or ReplaceIndex on the way)."""
    if isinstance(e, NodeRef):
        return [e.node]
    if isinstance(e, OffsetOf) and e.t_offset == 0 and e.x_offset == 0:
        return _unshifted_nodes(e.src)
    if isinstance(e, SwitchOf):
        return [x for s in e.srcs for x in _unshifted_nodes(s)]
    if isinstance(e, (SumOf, FailoverOf)):
        return _unshifted_nodes(e.a) + _unshifted_nodes(e.b)
    if isinstance(e, IfDefinedOf):
        return _unshifted_nodes(e.a)
    return []


def _unshifted_order(scc: list[str], nodes: dict) -> dict[str, int]:
    """Rank of each node of a recurrence: sources first along the edges that read
    the same index (a time step's own nodes), the other edges ignored (Kahn's
    algorithm; a node on a cycle of such edges, which no valid recurrence has,
    goes last)."""
    members = set(scc)
    preds: dict[str, set[str]] = {}
    for name in scc:
        n = nodes[name]
        if n.kind == "dim-range-node":
            src = [n.source]
        elif n.descriptor is not None:
            src = [x for p in n.descriptor.parts for x in _unshifted_nodes(p)]
        else:
            src = []
        preds[name] = {x for x in src if x in members and x != name}
    succ: dict[str, list[str]] = {name: [] for name in scc}
    for name, ps in preds.items():
        for p in ps:
            succ[p].append(name)
    left = {name: len(ps) for name, ps in preds.items()}
    ready = [name for name in scc if not left[name]]
    order: list[str] = []
    while ready:
        name = ready.pop(0)
        order.append(name)
        for c in succ[name]:
            left[c] -= 1
            if not left[c]:
                ready.append(c)
    seen = set(order)
    order += [name for name in scc if name not in seen]
    return {name: i for i, name in enumerate(order)}
