"""Strongly connected components of the node graph: Kaldi's epochs.

Nodes of one SCC (an RNN loop) form one epoch; epochs come in topological order
(sources first). A single node without a self-loop is a non-recurrent epoch.
"""

from __future__ import annotations


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
