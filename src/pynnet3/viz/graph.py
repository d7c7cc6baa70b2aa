"""The network as a Graphviz DOT graph (text; no dependency).

:func:`network_graph` draws input, output, component and dim-range nodes; an edge
per descriptor reference, labelled from :meth:`pynnet3.rewrite.graph.Edge.label`
(``t-1``, ``*0.66``, ``IfDefined`` ...; ``part k`` when the descriptor appends
several parts; ``cols a:b`` into a dim-range node). Edges inside a recurrence (both
ends in one strongly connected component) are red; a loop's back edge (from a node
at or after its consumer in network order) is also dashed and does not constrain
the layout. Component nodes are filled with a colour fixed by their type name and show
their dims and parameter count.

With ``optimized=`` the two networks are drawn side by side as two clusters: in the
original, nodes the optimized network no longer has are greyed and dotted
("removed"); in the optimized one, new nodes (fusions) are bold green ("new") and
nodes whose component changed (folded weights, other type or dims) bold orange
("changed").

:func:`render_dot` turns DOT text into SVG/PNG/PDF bytes with Graphviz's ``dot``.
"""

from __future__ import annotations

import shutil
import subprocess
import zlib

import numpy as np

from ..errors import DependencyError
from ..nnet import Nnet
from ..rewrite.graph import Edge, NetworkGraph

# Fixed colours for the common component types; others get one of _SPARE by a
# stable hash of the type name (the same type has the same colour in every drawing).
PALETTE = {
    "AffineComponent": "#8ecae6",
    "NaturalGradientAffineComponent": "#8ecae6",
    "FixedAffineComponent": "#a8dadc",
    "LinearComponent": "#bde0fe",
    "TdnnComponent": "#90caf9",
    "RectifiedLinearComponent": "#ffd166",
    "SigmoidComponent": "#ffe08a",
    "TanhComponent": "#fcbf49",
    "LogSoftmaxComponent": "#f4a261",
    "SoftmaxComponent": "#f4a261",
    "BatchNormComponent": "#cdb4db",
    "NormalizeComponent": "#e0c3fc",
    "DropoutComponent": "#e9ecef",
    "GeneralDropoutComponent": "#e9ecef",
    "NoOpComponent": "#f1f3f5",
    "ScaleAndOffsetComponent": "#d8f3dc",
    "FixedScaleComponent": "#d8f3dc",
    "ElementwiseProductComponent": "#ffccd5",
    "LstmNonlinearityComponent": "#f28482",
    "GruNonlinearityComponent": "#f5cac3",
    "TimeHeightConvolutionComponent": "#84a59d",
    "StatisticsExtractionComponent": "#b7e4c7",
    "StatisticsPoolingComponent": "#95d5b2",
}
_SPARE = ("#caffbf", "#9bf6ff", "#a0c4ff", "#bdb2ff", "#ffc6ff", "#fdffb6", "#ffd6a5",
          "#e4c1f9", "#d0f4de", "#fcf6bd")
_RECURRENT = 'color="#d62828"'
_BACK = 'style=dashed, constraint=false'
_REMOVED = 'style="dotted,filled", fillcolor="#dddddd", fontcolor="#777777"'
_NEW = 'penwidth=3, color="#2a9d8f"'
_CHANGED = 'penwidth=3, color="#f77f00"'


def type_colour(type_name: str) -> str:
    """The fill colour of components of ``type_name``."""
    if type_name in PALETTE:
        return PALETTE[type_name]
    return _SPARE[zlib.crc32(type_name.encode()) % len(_SPARE)]


def quote(text: str) -> str:
    """``text`` as a DOT quoted string (names may hold '.', '-', quotes ...)."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') \
        .replace("\n", "\\n") + '"'


def edge_label(graph: NetworkGraph, e: Edge) -> str:
    """What the drawing writes on ``e``: the reference's offsets, scale and wrappers,
    ``part k`` in a multi-part (Append) descriptor, ``cols a:b`` into a dim-range."""
    dst = graph[e.dst].node
    if e.ref is None:
        return f"cols {dst.dim_offset}:{dst.dim_offset + dst.dim}"
    bits = []
    if dst.descriptor is not None and len(dst.descriptor.parts) > 1:
        bits.append(f"part {e.ref.part}")
    if e.label():
        bits.append(e.label())
    return " ".join(bits)


def recurrent_nodes(graph: NetworkGraph) -> dict[str, frozenset[str]]:
    """Node -> its strongly connected component, for nodes on a cycle."""
    out: dict[str, frozenset[str]] = {}
    for gn in graph:
        if gn.name in out:
            continue
        scc = graph.scc_of(gn.name)
        if len(scc) > 1 or gn.name in gn.source_names:
            for n in scc:
                out[n] = frozenset(scc)
    return out


def is_recurrent(sccs: dict[str, frozenset[str]], e: Edge) -> bool:
    """True when ``e`` lies inside a recurrence (both ends in one SCC)."""
    return e.src in sccs and e.dst in sccs[e.src]


def _node_label(graph: NetworkGraph, name: str) -> tuple[str, str]:
    """(label, attributes) of one node."""
    gn = graph[name]
    n = gn.node
    if n.kind == "input-node":
        return f"{name}\ninput, dim {n.dim}", 'shape=invhouse, style=filled, fillcolor="#b7e4c7"'
    if n.kind == "output-node":
        dim = graph.nnet.node_dim(name)
        return (f"{name}\noutput, dim {dim}\nobjective {n.objective}",
                'shape=house, style=filled, fillcolor="#ffafcc"')
    if n.kind == "dim-range-node":
        return (f"{name}\ndim-range {n.dim_offset}:{n.dim_offset + n.dim} of {n.source}",
                "shape=box, style=dashed")
    comp = graph.component(name)
    what = comp.type_name if n.component == name else f"{n.component}: {comp.type_name}"
    label = (f"{name}\n{what}\n"
             f"{comp.input_dim} -> {comp.output_dim}, {comp.num_params()} params")
    return label, (f'shape=box, style="rounded,filled", '
                   f'fillcolor="{type_colour(comp.type_name)}"')


def _body(nnet: Nnet, prefix: str, marks: dict[str, str], indent: str) -> list[str]:
    graph = NetworkGraph(nnet)
    sccs = recurrent_nodes(graph)
    lines = []
    for gn in graph:
        label, attrs = _node_label(graph, gn.name)
        mark = marks.get(gn.name)
        if mark is not None:
            label += f"\n({mark})"
            attrs += ", " + {"removed": _REMOVED, "new": _NEW, "changed": _CHANGED}[mark]
        lines.append(f"{indent}{quote(prefix + gn.name)} [label={quote(label)}, {attrs}];")
    for gn in graph:
        for e in gn.inputs:
            attrs = [f"label={quote(edge_label(graph, e))}"]
            if is_recurrent(sccs, e):
                attrs.append(_RECURRENT)
                if graph[e.src].position >= gn.position:  # the loop's back edge
                    attrs.append(_BACK)
            if e.ref is None:
                attrs.append("arrowhead=empty")
            lines.append(f"{indent}{quote(prefix + e.src)} -> {quote(prefix + e.dst)} "
                         f"[{', '.join(attrs)}];")
    return lines


def _same_component(a, b) -> bool:
    if type(a) is not type(b) or a.input_dim != b.input_dim or a.output_dim != b.output_dim:
        return False
    pa, pb = a.params(), b.params()
    if pa.keys() != pb.keys():
        return False
    return all(np.shape(pa[k]) == np.shape(pb[k]) and np.array_equal(pa[k], pb[k])
               for k in pa)


def changes(original: Nnet, optimized: Nnet) -> tuple[dict[str, str], dict[str, str]]:
    """Marks for the side-by-side drawing: (node -> "removed" in the original,
    node -> "new" / "changed" in the optimized network)."""
    before = {n.name: n for n in original.nodes}
    after = {n.name: n for n in optimized.nodes}
    removed = {name: "removed" for name in before if name not in after}
    marks: dict[str, str] = {}
    for name, n in after.items():
        old = before.get(name)
        if old is None or old.kind != n.kind:
            marks[name] = "new"
        elif n.kind == "component-node":
            if not _same_component(original.components[old.component],
                                   optimized.components[n.component]):
                marks[name] = "changed"
        elif str(n.descriptor) != str(old.descriptor) or n.dim != old.dim \
                or n.source != old.source or n.dim_offset != old.dim_offset:
            marks[name] = "changed"
    return removed, marks


def network_graph(nnet: Nnet, optimized: Nnet | None = None, *,
                  rankdir: str = "TB") -> str:
    """The network as DOT text (module doc); with ``optimized``, both networks side
    by side with what the optimizer removed, added or changed marked."""
    head = ["digraph nnet3 {", f"  rankdir={rankdir};", '  charset="UTF-8";',
            '  node [fontname="Helvetica", fontsize=10];',
            '  edge [fontname="Helvetica", fontsize=9];']
    if optimized is None:
        return "\n".join(head + _body(nnet, "", {}, "  ") + ["}"]) + "\n"
    removed, marks = changes(nnet, optimized)
    lines = list(head)
    for cluster, prefix, net, m, title in (
            ("cluster_original", "original/", nnet, removed,
             f"original: {len(nnet.nodes)} nodes, {nnet.num_params()} params"),
            ("cluster_optimized", "optimized/", optimized, marks,
             f"optimized: {len(optimized.nodes)} nodes, {optimized.num_params()} params")):
        lines.append(f"  subgraph {cluster} {{")
        lines.append(f"    label={quote(title)};")
        lines += _body(net, prefix, m, "    ")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


RENDER_FORMATS = ("svg", "png", "pdf")


def render_dot(dot_text: str, fmt: str, timeout: float = 120.0) -> bytes:
    """``dot_text`` rendered by Graphviz's ``dot`` as ``fmt`` (svg, png or pdf);
    a :class:`~pynnet3.errors.DependencyError` when ``dot`` is not on PATH."""
    if fmt not in RENDER_FORMATS:
        raise ValueError(f"render_dot: format {fmt!r} is not one of {RENDER_FORMATS}")
    exe = shutil.which("dot")
    if exe is None:
        raise DependencyError(
            f"drawing {fmt.upper()} needs Graphviz's 'dot' program, which is not on PATH: "
            "install Graphviz (apt-get install graphviz, brew install graphviz, "
            "conda install graphviz) or write a .dot file")
    done = subprocess.run([exe, f"-T{fmt}"], input=dot_text.encode(), capture_output=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise DependencyError(f"Graphviz 'dot -T{fmt}' failed (exit {done.returncode}): "
                              f"{done.stderr.decode(errors='replace').strip()[:500]}")
    return done.stdout


__all__ = ["PALETTE", "RENDER_FORMATS", "changes", "edge_label", "is_recurrent",
           "network_graph", "quote", "recurrent_nodes", "render_dot", "type_colour"]
