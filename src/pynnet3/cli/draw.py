"""``pynnet3 draw MODEL OUT``: the network as a graph (pynnet3.viz.network_graph).

The format follows OUT's suffix: ``.dot`` is the DOT text itself (no dependency;
``-`` writes it to stdout), ``.svg``, ``.png`` and ``.pdf`` are rendered by
Graphviz's ``dot`` program. Files are written atomically.

Also the plot flags of ``pynnet3 show-computation``: ``--memory-plot`` (live floats
per command, pynnet3.viz.plot_memory) and ``--report-plot`` (sizes after every
optimizer pass, pynnet3.viz.plot_report).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import PynnetError
from ..io.atomic import atomic_write
from .files import STDIO, read_model
from .kaldi_options import bool_option


def cmd_draw(args) -> int:
    # (viz is loaded here, not with the command line: other commands do without it)
    from ..viz.graph import RENDER_FORMATS, network_graph, render_dot
    from .network import apply_set_test_mode, network_options_from_args

    fmt = "dot" if args.out == STDIO else Path(args.out).suffix.lower().lstrip(".")
    if fmt not in ("dot", "gv", *RENDER_FORMATS):
        raise PynnetError(f"{args.out}: unknown drawing format {fmt or '(no suffix)'!r}; "
                          "OUT must end in .dot, .svg, .png or .pdf")
    nnet = read_model(args.model)
    apply_set_test_mode(nnet, args)
    optimized = None
    if args.optimized:
        from ..graphopt import optimize_network

        optimized = optimize_network(nnet, network_options_from_args(args))
    text = network_graph(nnet, optimized, rankdir=args.rankdir)
    data = text.encode() if fmt in ("dot", "gv") else render_dot(text, fmt)
    if args.out == STDIO:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        atomic_write(args.out, data)
    return 0


def add_draw_command(sub, command) -> None:
    """Register ``draw`` on the subparsers ``sub`` (``command`` makes a subparser)."""
    from .network import add_network_flags, add_set_test_mode_flag

    s = command(sub, "draw", "draw the network as a graph (DOT, SVG, PNG, PDF)",
                "Draw a model's nodes (inputs, outputs, components, dim ranges) and the\n"
                "edges of their descriptors, labelled with time offsets, scales and\n"
                "IfDefined/Failover/ReplaceIndex/Round/Sum; recurrences are red dashed\n"
                "edges, components are coloured by type with their dims and parameter\n"
                "counts. OUT's suffix picks the format: .dot (text, always works; '-'\n"
                "writes it to stdout), or .svg, .png, .pdf rendered with Graphviz's\n"
                "'dot' program (install Graphviz for those). With --optimized=true the\n"
                "network optimizer's result is drawn beside the original, with removed,\n"
                "new and changed nodes marked.")
    s.add_argument("model", metavar="MODEL",
                   help="model file: Kaldi nnet3, text or binary (detected)")
    s.add_argument("out", metavar="OUT",
                   help="where to write the drawing: NAME.dot, NAME.svg, NAME.png or "
                        "NAME.pdf, or '-' for DOT text on stdout")
    bool_option(s, "--optimized", False,
                "also run the network optimizer and draw its result beside the original, marking "
                "removed, new and changed nodes (default: false)")
    add_set_test_mode_flag(s)
    s.add_argument("--rankdir", choices=("TB", "LR", "BT", "RL"), default="TB",
                   help="layout direction: TB top to bottom, LR left to right, BT, RL "
                        "(default: TB)")
    add_network_flags(s)
    s.set_defaults(fn=cmd_draw)


# -- show-computation --memory-plot, --report-plot --------------------------------------

def add_memory_plot_flags(s) -> None:
    """``--memory-plot``, ``--kaldi-stats`` and ``--report-plot`` of
    ``pynnet3 show-computation``."""
    s.add_argument("--memory-plot", dest="memory_plot", default=None, metavar="OUT.png",
                   type=_plot_path,
                   help="also plot live floats per command to OUT (.png, .svg or .pdf; "
                        "needs matplotlib: pip install 'pynnet3[viz]'): with "
                        "--optimize=true the unoptimized computation too, on the same "
                        "axes; the peak marked with the matrices alive at it, the "
                        "forward/backward boundary as a line (default: no plot)")
    s.add_argument("--kaldi-stats", dest="kaldi_stats", default=None, metavar="STATS.json",
                   help="with --memory-plot, draw Kaldi's peak_memory_floats from this "
                        "stats.json (kaldi-reference format; its optimized or unoptimized "
                        "entry, as --optimize says) as a horizontal line (default: none)")
    s.add_argument("--report-plot", dest="report_plot", default=None, metavar="OUT.png",
                   type=_plot_path,
                   help="chart commands, matrices and peak memory after every optimizer "
                        "pass (and, with --network-optimize=true, components, nodes and "
                        "parameters after every network pass) to OUT (.png, .svg or .pdf; "
                        "needs matplotlib) (default: no chart)")


def _plot_path(text: str) -> str:
    import argparse

    if Path(text).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise argparse.ArgumentTypeError(f"{text!r} must end in .png, .svg or .pdf")
    return text


def write_memory_plot(args, nnet, request, comp) -> None:
    """The plot of ``show-computation --memory-plot`` (nothing without the flag)."""
    if not args.memory_plot:
        return
    import json

    from ..compiler import compile_computation
    from ..viz.memory import plot_memory

    kaldi_peak = None
    if args.kaldi_stats:
        with open(args.kaldi_stats, encoding="utf-8") as f:
            stats = json.load(f)
        try:
            kaldi_peak = float(stats["optimized" if args.optimize else "unoptimized"]
                               ["peak_memory_floats"])
        except (KeyError, TypeError, ValueError):
            raise PynnetError(f"{args.kaldi_stats}: no peak_memory_floats under "
                              f"{'optimized' if args.optimize else 'unoptimized'}") from None
    if args.optimize:
        plot_memory(args.memory_plot, compile_computation(nnet, request), comp,
                    kaldi_peak=kaldi_peak)
    else:
        plot_memory(args.memory_plot, comp, kaldi_peak=kaldi_peak, labels=("unoptimized", ""))


def write_report_plot(args, report, net_report) -> None:
    """The chart of ``show-computation --report-plot`` (nothing without the flag)."""
    if args.report_plot:
        from ..viz.report import plot_report

        plot_report(args.report_plot, report, net_report)
