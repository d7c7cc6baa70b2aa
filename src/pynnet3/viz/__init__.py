"""Pictures: the network as a graph (:func:`network_graph`, DOT text, rendered with
Graphviz by :func:`render_dot`), a computation's memory over time
(:func:`memory_timeline`, plotted by :func:`plot_memory` with matplotlib), and the
optimizers' reports as a chart (:func:`plot_report`).

This room sits above analysis/, rewrite/ and the network; nothing below imports it.
"""

from .graph import network_graph, render_dot
from .memory import LiveMatrix, MemoryTimeline, memory_timeline, plot_memory
from .report import network_series, plot_report, report_series

__all__ = ["LiveMatrix", "MemoryTimeline", "memory_timeline", "network_graph", "network_series",
           "plot_memory", "plot_report", "render_dot", "report_series"]
