"""The computation graph: which cindexes a request needs, and in which steps.

1. Every requested output cindex must be computable (:mod:`.computable`).
2. Demand flows from the outputs to the inputs: a cindex needs the *used* inputs
   of its descriptor (IfDefined/Failover resolved by computability) or, for a
   non-simple component, of the input indexes its component asks for. Nodes are
   visited consumers-first, so a non-recurrent node is visited once.
3. Scheduling: epochs are the SCCs of the node graph in topological order. A
   non-recurrent node becomes one step holding all its cindexes; a recurrent
   epoch is cut into phases by the depth of each cindex in the epoch's own
   dependency graph, one step per node per phase. Rows of a step are sorted by
   (t, x, n) (Kaldi's Index order); input and output steps keep request order.

Cindexes travel as packed keys (:func:`pynnet3.index.pack`) throughout; the
index-array methods (:meth:`GraphBuilder.used_sources`) wrap the key ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..descriptor import resolve_part_keys
from ..errors import ComputeError
from ..index import KeySet, describe, pack, txn_keys, unique_inverse, unique_keys, unpack
from .computable import Computability
from .keymap import KeyMap

_MAX_ROUNDS = 100000
# A legitimate long recurrence takes one round per frame inside the request's
# range; past this many rounds the demanded frames are checked (cheaply) against
# the window a terminating computation can need (GraphBuilder._demand_window).
_RUNAWAY_CHECK_AFTER = 256
_RUNAWAY_MARGIN = 1024
_STEP_KIND = {"input-node": "input", "component-node": "component",
              "dim-range-node": "dim-range", "output-node": "output"}


@dataclass(slots=True)
class Step:
    """A batch of cindexes of one node computed together; ``indexes`` is the row
    order of its value matrix."""

    node: str
    kind: str
    indexes: np.ndarray
    epoch: int
    recurrent: bool = False


@dataclass
class ComputationGraph:
    steps: list[Step]
    computability: Computability


class GraphBuilder:
    def __init__(self, nnet, request):
        self.nnet = nnet
        self.request = request
        self.nodes = nnet.node_map
        inputs = {}
        for kind, specs in (("input", request.inputs), ("output", request.outputs)):
            seen = set()
            for spec in specs:
                if spec.name in seen:
                    raise ComputeError(f"request {kind} {spec.name!r} is listed more than once")
                seen.add(spec.name)
                if len(spec.indexes) == 0:
                    raise ComputeError(f"request {kind} {spec.name!r} has no indexes")
                keys = np.sort(pack(spec.indexes))
                dup = np.flatnonzero(keys[1:] == keys[:-1])
                if len(dup):
                    raise ComputeError(f"request {kind} {spec.name!r} lists index "
                                       f"{describe(unpack(keys[dup[:1]]))} more than once")
        for spec in request.inputs:
            n = self.nodes.get(spec.name)
            if n is None or n.kind != "input-node":
                raise ComputeError(f"request input {spec.name!r} is not an input node of "
                                   f"the network (inputs: {nnet.input_names()})")
            inputs[spec.name] = spec.indexes
        for spec in request.outputs:
            n = self.nodes.get(spec.name)
            if n is None or n.kind != "output-node":
                raise ComputeError(f"request output {spec.name!r} is not an output node of "
                                   f"the network (outputs: {nnet.output_names()})")
        self.comp = Computability(nnet, inputs)
        self.schedule_seconds = 0.0
        self.sccs = self.comp.sccs
        self.scc_of = {name: i for i, scc in enumerate(self.sccs) for name in scc}
        self._recurrent = [self.comp.recurrent[scc[0]] for scc in self.sccs]
        # node of a recurrence -> (consumer keys, source node, source keys) of every
        # dependency inside its recurrence, gathered while the graph is built
        self._inner_edges: dict[str, list[tuple[np.ndarray, str, np.ndarray]]] = {}

    # -- used inputs -------------------------------------------------------------
    def used_sources(self, name: str, idx: np.ndarray):
        """Yield (source node, consumer rows, source indexes) for computable ``idx``
        (index-array form of :meth:`used_source_keys`, which :meth:`build` uses and
        a subclass overrides to drop sources)."""
        for src, rows, skeys in self.used_source_keys(name, pack(idx)):
            yield src, rows, unpack(skeys)

    def used_source_keys(self, name: str, keys: np.ndarray):
        """:meth:`used_sources` on packed keys: yield (source node, consumer rows,
        source keys) for the computable cindexes ``keys`` of ``name``."""
        n = self.nodes[name]
        if n.kind == "input-node" or len(keys) == 0:
            return
        if n.kind == "dim-range-node":
            yield n.source, np.arange(len(keys)), keys
            return
        if n.kind != "component-node" or self.comp.simple[name]:
            memo = self.comp.resolved.get(name)
            if memo is not None and np.array_equal(memo[0], keys):
                parts = memo[1]  # resolved at exactly these cindexes already
            else:
                parts = [resolve_part_keys(part, keys, self.comp.computable_keys)[1]
                         for part in n.descriptor.parts]
            for terms in parts:
                for t in terms:
                    if t.node is not None:
                        yield t.node, t.rows, t.keys
            return
        memo = self.comp.resolved.get(name)
        if memo is not None and np.array_equal(memo[0], keys):
            # evaluated at exactly these cindexes already: the available
            # dependencies are some of the unique ones found then
            _, deps, avail, ukeys, inv, avail_u = memo
            rank = np.cumsum(avail_u) - 1
            ukeys, inv = ukeys[avail_u], rank[inv[avail]]
        else:
            deps = self.comp.input_deps_at(n, keys)
            avail = self.comp.input_available(n, deps.indexes)
            ukeys, inv = unique_inverse(pack(deps.indexes[avail]))
        owners = deps.owner[avail]
        # the command compiler asks again for the same cindexes (in another order)
        self.comp.input_memo[name] = (np.sort(keys), ukeys)
        if len(deps.owner) == 0:
            return
        for part in n.descriptor.parts:
            _, terms = resolve_part_keys(part, ukeys, self.comp.computable_keys)
            for t in terms:
                if t.node is None:
                    continue
                where = np.full(len(ukeys), -1, dtype=np.int64)
                where[t.rows] = np.arange(len(t.rows))
                w = where[inv]
                sel = w >= 0
                yield t.node, owners[sel], t.keys[w[sel]]

    # -- building ------------------------------------------------------------------
    def check_outputs(self) -> None:
        for spec in self.request.outputs:
            ok = self.comp.computable(spec.name, spec.indexes)
            if not ok.all():
                bad = spec.indexes[~ok]
                missing = self._explain(spec.name, bad[:1])
                raise ComputeError(
                    f"output {spec.name!r} is not computable at {describe(bad)}"
                    + (f"; missing inputs: {missing}" if missing else ""))

    def _explain(self, name: str, idx: np.ndarray, depth: int = 0) -> str:
        """Follow required dependencies of uncomputable cindexes down to inputs."""
        n = self.nodes[name]
        if n.kind == "input-node":
            return f"{name}[{describe(idx, 3)}]"
        if depth > 50:
            return ""
        deps = []
        if n.kind == "dim-range-node":
            deps = [(n.source, idx)]
        else:
            for d in n.descriptor.dependencies(idx):
                deps.append((d.node, d.indexes))
            comp = self.nnet.components.get(n.component) if n.component else None
            if comp is not None and not comp.is_simple():
                inp = comp.input_indexes(idx)
                deps = [(d.node, d.indexes) for d in n.descriptor.dependencies(inp.indexes)]
        for src, sidx in deps:
            ok = self.comp.computable(src, sidx)
            if not ok.all():
                found = self._explain(src, sidx[~ok][:1], depth + 1)
                if found:
                    return found
        return ""

    def build(self) -> ComputationGraph:
        self.check_outputs()
        order = {name: i for i, scc in enumerate(self.sccs) for name in scc}
        needed: dict[str, KeyMap] = {name: KeyMap() for name in self.nodes}
        pending: dict[str, list[np.ndarray]] = {}
        for spec in self.request.outputs:
            pending.setdefault(spec.name, []).append(pack(spec.indexes))
        for spec in self.request.inputs:  # inputs are always part of the graph
            pending.setdefault(spec.name, []).append(pack(spec.indexes))
        sources = self.used_source_keys
        rounds = 0
        t_window = None
        while pending:
            rounds += 1
            if rounds > _MAX_ROUNDS:
                raise ComputeError("computation graph does not terminate (a recurrence "
                                   "that never runs out of inputs?)")
            name = max(pending, key=order.__getitem__)
            keys = unique_keys(np.concatenate(pending.pop(name)))
            if needed[name].blocks:
                keys = keys[needed[name].lookup(keys, 0) == 0]
                if not len(keys):
                    continue
            needed[name].add_new(keys, np.ones(len(keys), dtype=np.int64))
            scc = self.scc_of[name]
            if rounds > _RUNAWAY_CHECK_AFTER and self._recurrent[scc]:
                if t_window is None:
                    t_window = self._demand_window()
                self._check_runaway(name, keys, t_window)
            inner = self._inner_edges.setdefault(name, []) if self._recurrent[scc] else None
            for src, rows, skeys in sources(name, keys):
                pending.setdefault(src, []).append(skeys)
                if inner is not None and self.scc_of[src] == scc:
                    # kept for the phases of the recurrence (_recurrent_steps)
                    inner.append((keys[rows], src, skeys))
        t0 = time.perf_counter()
        steps = self._schedule({k: v.items()[0] for k, v in needed.items() if len(v)})
        self.schedule_seconds = time.perf_counter() - t0
        return ComputationGraph(steps, self.comp)

    def _demand_window(self) -> tuple[int, int]:
        """The t range outside which no cindex can be needed by a computation that
        terminates: the request's frames widened by twice the farthest single hop
        any descriptor or component takes, plus a margin for Round() periods.

        Why it is safe: a recurrent cindex that far from every requested frame can
        reach no input, so it is computable from constants alone, and so is every
        cindex further along the same recurrence (computability that far out is
        periodic in t); a demand walking out there never stops."""
        ts = [spec.indexes[:, 1] for spec in (*self.request.inputs, *self.request.outputs)]
        allt = np.concatenate(ts)
        reach = 1
        probe = np.zeros((8, 3), dtype=np.int64)
        probe[:, 1] = np.arange(8)
        pt = probe[:, 1]
        for n in self.nodes.values():
            if n.kind not in ("component-node", "output-node"):
                continue
            hop = 0
            comp = self.nnet.components.get(n.component) if n.component else None
            if comp is not None and not comp.is_simple():
                inp = comp.input_indexes(probe)
                if len(inp.owner):
                    hop = int(np.abs(inp.indexes[:, 1] - pt[inp.owner]).max())
            for d in n.descriptor.dependencies(probe):
                if len(d.rows):
                    reach = max(reach, hop + int(np.abs(d.indexes[:, 1] - pt[d.rows]).max()))
            reach = max(reach, hop)
        margin = 2 * reach + _RUNAWAY_MARGIN
        return int(allt.min()) - margin, int(allt.max()) + margin

    def _check_runaway(self, name: str, keys: np.ndarray, window: tuple[int, int]) -> None:
        t = unpack(keys)[:, 1]
        far = (t < window[0]) | (t > window[1])
        if far.any():
            bad = unpack(keys[far][:1])
            raise ComputeError(
                f"computation graph does not terminate: node {name!r} is needed at "
                f"{describe(bad)}, beyond any frame the request or the network's "
                f"offsets can reach (t in [{window[0]}, {window[1]}]); a recurrence "
                "that always finds a computable input, e.g. Failover(Offset(x, -1), "
                "<constant>), walks away forever")

    # -- scheduling ---------------------------------------------------------------
    def _schedule(self, needed: dict[str, np.ndarray]) -> list[Step]:
        req_in = {s.name: s for s in self.request.inputs}
        req_out = {s.name: s for s in self.request.outputs}
        steps: list[Step] = []
        for spec in self.request.inputs:
            steps.append(Step(spec.name, "input", spec.indexes, -1))
        for e, scc in enumerate(self.sccs):
            scc = [x for x in scc if x in needed and x not in req_in and x not in req_out]
            if not scc:
                continue
            if self._recurrent[e]:
                steps.extend(self._recurrent_steps(e, scc, needed))
            else:
                for name in scc:
                    if self.nodes[name].kind == "dim-range-node":
                        mirrored = self._mirror_steps(name, needed[name], steps, e)
                        if mirrored:
                            steps.extend(mirrored)
                            continue
                    keys = needed[name]
                    keys = keys[np.argsort(txn_keys(keys), kind="stable")]
                    steps.append(Step(name, self._kind(name), unpack(keys), e))
        for spec in self.request.outputs:
            steps.append(Step(spec.name, "output", spec.indexes, len(self.sccs)))
        return steps

    def _mirror_steps(self, name: str, keys: np.ndarray, steps: list[Step],
                      epoch: int) -> list[Step]:
        """A dim-range node whose source was computed in several steps (a recurrent
        layer) gets one step per source step, with the source step's row order, so
        each can be a column range of the source matrix instead of a copy."""
        source = self.nodes[name].source
        src_steps = [s for s in steps if s.node == source]
        if len(src_steps) < 2:
            return []
        wanted = KeySet(keys)
        out = []
        for s in src_steps:
            sel = wanted.contains(pack(s.indexes))
            if sel.any():
                out.append(Step(name, "dim-range", s.indexes[sel], epoch))
        return out

    def _kind(self, name: str) -> str:
        return _STEP_KIND[self.nodes[name].kind]

    def _recurrent_steps(self, epoch: int, scc: list[str],
                         needed: dict[str, np.ndarray]) -> list[Step]:
        members = set(scc)
        offsets = {}
        total = 0
        for name in scc:
            offsets[name] = total
            total += len(needed[name])
        src_ids, dst_ids = [], []
        for name in scc:
            # (the build resolved every needed cindex of the node exactly once, and
            # ``needed`` holds sorted keys: a key's vertex is its position there)
            for dkeys, src, skeys in self._inner_edges.get(name, ()):
                if src not in members:
                    continue
                src_ids.append(offsets[src] + needed[src].searchsorted(skeys))
                dst_ids.append(offsets[name] + needed[name].searchsorted(dkeys))
        if src_ids:
            level = _longest_path_levels(total, np.concatenate(src_ids),
                                         np.concatenate(dst_ids))
            if level is None:
                raise ComputeError(f"cycle without time offset among nodes {scc}")
        else:
            level = np.zeros(total, dtype=np.int64)
        node_of = np.repeat(np.arange(len(scc)), [len(needed[name]) for name in scc])
        keys = np.concatenate([needed[name] for name in scc])
        # One sort for all steps: by level, then node (scc order), then Kaldi's
        # (t, x, n) row order within the step.
        order = np.lexsort((txn_keys(keys), node_of, level))
        lv_sorted, node_sorted = level[order], node_of[order]
        cut = np.flatnonzero((lv_sorted[1:] != lv_sorted[:-1])
                             | (node_sorted[1:] != node_sorted[:-1])) + 1
        idx = unpack(keys[order])
        starts = [0, *cut.tolist()]
        ends = [*starts[1:], len(order)]
        node_at = node_sorted[starts].tolist()
        kind = [self._kind(name) for name in scc]
        return [Step(scc[q], kind[q], idx[a:b], epoch, True)
                for a, b, q in zip(starts, ends, node_at, strict=True)]


_SMALL_GRAPH = 20000  # edges; below this Python (on the contracted graph) is faster


def _longest_path_levels(total: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray | None:
    """Depth of each vertex in the DAG ``src -> dst`` (0 for vertices without
    predecessors, else 1 + the deepest predecessor), by Kahn's algorithm one
    frontier at a time: O(edges) work plus one small step per level. None if the
    graph has a cycle."""
    if len(dst) <= _SMALL_GRAPH:
        # A recurrence has one level per frame or so: hundreds of levels of a few
        # vertices each, where numpy's per-call cost per level would dominate.
        return _levels_small(total, src, dst)
    order = np.argsort(src, kind="stable")
    src, dst = src[order], dst[order]
    starts = np.searchsorted(src, np.arange(total + 1))
    indeg = np.bincount(dst, minlength=total)
    level = np.zeros(total, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    done = 0
    depth = 0
    while len(frontier):
        level[frontier] = depth
        done += len(frontier)
        lo, hi = starts[frontier], starts[frontier + 1]
        cnt = hi - lo
        if cnt.sum() == 0:
            break
        edges = np.repeat(lo - np.cumsum(cnt) + cnt, cnt) + np.arange(cnt.sum())
        targets = dst[edges]
        np.subtract.at(indeg, targets, 1)
        targets = unique_keys(targets)
        frontier = targets[indeg[targets] == 0]
        depth += 1
    return level if done == total else None


def _levels_small(total: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray | None:
    """:func:`_longest_path_levels` by contracting the graph first, then Kahn's
    algorithm in Python on what is left (same result).

    Edges carry weights (levels gained along them, 1 at first). A vertex with a
    single incoming edge is exactly that edge's weight below its source, so it
    needs no visit of its own: pointer jumping finds, for every such vertex, the
    nearest vertex up its chain that has none or several incoming edges and the
    distance to it; the chains' edges are then re-rooted there. Parallel edges
    are merged (the heavier one counts), which can leave new single-edge
    vertices, so this repeats. A recurrence (one link per node and frame, merges
    where a node reads several nodes of the same frame) contracts to its first
    frames in two or three rounds, leaving hardly anything for Python."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    weight = np.ones(len(src), dtype=np.int64)
    # level(v) = level(root[v]) + off[v]; ``alive``: vertices that are their own root
    root = np.arange(total, dtype=np.int64)
    off = np.zeros(total, dtype=np.int64)
    alive = np.ones(total, dtype=bool)
    while len(src):
        key = src * total + dst
        order = np.lexsort((weight, key))
        key = key[order]
        last = np.ones(len(key), dtype=bool)  # the heaviest of each run of parallel edges
        np.not_equal(key[1:], key[:-1], out=last[:-1])
        keep = order[last]
        src, dst, weight = src[keep], dst[keep], weight[keep]
        indeg = np.bincount(dst, minlength=total)
        one = indeg == 1
        link = one[dst]
        if not link.any():
            break
        parent = np.arange(total, dtype=np.int64)
        parent[dst[link]] = src[link]
        dist = np.zeros(total, dtype=np.int64)
        dist[dst[link]] = weight[link]
        for _ in range(total.bit_length() + 1):
            if not one[parent].any():  # every chain followed up to its root
                break
            dist += dist[parent]
            parent = parent[parent]
        else:
            return None  # a cycle of single-edge vertices (a self-loop, say)
        off += dist[root]
        root = parent[root]
        alive &= ~one
        cross = ~link
        s = src[cross]
        src, dst, weight = parent[s], dst[cross], weight[cross] + dist[s]
    if not len(src):  # contracted to the sources
        return off
    order = np.argsort(src, kind="stable")
    starts = np.searchsorted(src[order], np.arange(total + 1)).tolist()
    targets, weights = dst[order].tolist(), weight[order].tolist()
    indeg = np.bincount(dst, minlength=total)
    deg = indeg.tolist()
    todo = np.flatnonzero(alive & (indeg == 0)).tolist()
    level = [0] * total
    done = 0
    while todo:
        v = todo.pop()
        done += 1
        lv = level[v]
        for e in range(starts[v], starts[v + 1]):
            w = targets[e]
            if lv + weights[e] > level[w]:
                level[w] = lv + weights[e]
            deg[w] -= 1
            if not deg[w]:
                todo.append(w)
    if done != int(np.count_nonzero(alive)):
        return None
    return np.array(level, dtype=np.int64)[root] + off


def build_graph(nnet, request) -> tuple[GraphBuilder, ComputationGraph]:
    b = GraphBuilder(nnet, request)
    return b, b.build()
