"""Pictures: the network as a graph (:func:`network_graph`, DOT text, rendered with
Graphviz by :func:`render_dot`) and a computation's memory over time
(:func:`memory_timeline`, plotted by :func:`plot_memory` with matplotlib).

This room sits above analysis/, rewrite/ and the network; nothing below imports it.
"""

from .graph import network_graph, render_dot
from .memory import LiveMatrix, MemoryTimeline, memory_timeline, plot_memory

__all__ = ["LiveMatrix", "MemoryTimeline", "memory_timeline", "network_graph", "plot_memory",
           "render_dot"]
