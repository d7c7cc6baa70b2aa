"""Strongly connected components of the node graph: Kaldi's epochs.

Nodes of one SCC (an RNN loop) form one epoch; epochs come in topological order
(sources first). A single node without a self-loop is a non-recurrent epoch.
"""

from __future__ import annotations

import numpy as np


def node_sccs(nnet) -> list[list[str]]:
    """SCCs of ``nnet``'s node graph (edge: source -> consumer), topologically ordered."""
    names = [n.name for n in nnet.nodes]
    preds = {n.name: n.inputs() for n in nnet.nodes}
    succ: dict[str, list[str]] = {x: [] for x in names}
    for x in names:
        for p in preds[x]:
            succ[p].append(x)
    # Tarjan's algorithm, iterative (networks can be deep).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    order = {x: k for k, x in enumerate(names)}
    for root in names:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            recurse = False
            children = succ[v]
            while i < len(children):
                w = children[i]
                i += 1
                if w not in index:
                    work.append((v, i))
                    work.append((w, 0))
                    recurse = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp, key=order.__getitem__))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    out.reverse()  # Tarjan emits sinks first
    return out


def is_recurrent_scc(nnet, scc: list[str], node_map: dict | None = None) -> bool:
    """Whether the SCC is a loop (``node_map``: ``nnet.node_map``, if at hand)."""
    if len(scc) > 1:
        return True
    return scc[0] in (node_map or nnet.node_map)[scc[0]].inputs()


def zero_delay_cycle(nnet) -> list[str] | None:
    """A loop of nodes that each *require* the next at the same time index (a
    cindex that needs itself, so nothing on the loop is ever computable), as the
    list of its nodes, or None. Loops through a time offset are recurrences;
    loops through IfDefined/Failover are optional reads: neither is one of these.
    Only dependencies with zero t shift at every probed frame count (Round() and
    ReplaceIndex() shift some frames), so a reported loop is always a real one."""
    node_map = nnet.node_map
    probe = np.zeros((8, 3), dtype=np.int64)
    probe[:, 1] = np.arange(8)
    edges: dict[str, list[str]] = {}
    for scc in node_sccs(nnet):
        if not is_recurrent_scc(nnet, scc, node_map):
            continue
        members = set(scc)
        for name in scc:
            n = node_map[name]
            if n.kind == "dim-range-node":
                edges[name] = [n.source]
                continue
            if n.descriptor is None:
                continue
            comp = nnet.components.get(n.component) if n.component else None
            rows, at = np.arange(8), probe
            if comp is not None and not comp.is_simple():
                deps = comp.input_indexes(probe)
                if deps.any_suffices:
                    continue
                keep = deps.required
                rows, at = deps.owner[keep], deps.indexes[keep]
                # an output frame needing the same input frame from every probe
                same = np.zeros(8, dtype=bool)
                same[rows[at[:, 1] == probe[rows, 1]]] = True
                if not same.all():
                    continue
                at = probe
                rows = np.arange(8)
            out = []
            for d in n.descriptor.dependencies(at):
                if not d.required or d.node not in members:
                    continue
                shift = d.indexes[:, 1] - at[d.rows, 1]
                if len(np.unique(d.rows)) == len(rows) and not shift.any():
                    out.append(d.node)
            edges[name] = out
    # a cycle among the zero-delay edges (iterative DFS, colours)
    colour: dict[str, int] = {}
    for root in edges:
        if colour.get(root):
            continue
        path, work = [], [(root, iter(edges.get(root, ())))]
        colour[root] = 1
        path.append(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                colour[v] = 2
                path.pop()
                work.pop()
            elif colour.get(w, 0) == 1:
                return path[path.index(w):] + [w]
            elif not colour.get(w):
                colour[w] = 1
                path.append(w)
                work.append((w, iter(edges.get(w, ()))))
    return None
