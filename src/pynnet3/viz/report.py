"""The optimizers' reports as a chart (:func:`plot_report`, matplotlib): commands,
matrices and peak memory after every command-level pass (an
:class:`~pynnet3.OptimizeReport`), and components, nodes and parameters after every
network-level pass (a :class:`~pynnet3.NetworkReport`) when one is given.
:func:`report_series` and :func:`network_series` are the plotted numbers."""

from __future__ import annotations

import io
import os
from pathlib import Path

from ..graphopt import NetworkReport
from ..io.atomic import atomic_write
from ..optimize import OptimizeReport
from .memory import _FORMATS, _pyplot


def report_series(report: OptimizeReport) -> dict[str, list]:
    """Per row of ``report`` (the initial computation first): ``pass`` (name),
    ``commands``, ``matrices``, ``peak_floats``."""
    rows = ([report.initial] if report.initial else []) + list(report.passes)
    return {"pass": [r.name for r in rows],
            "commands": [r.num_commands for r in rows],
            "matrices": [r.num_matrices for r in rows],
            "peak_floats": [r.peak_memory_floats for r in rows]}


def network_series(report: NetworkReport) -> dict[str, list]:
    """Per pass run of ``report`` ("before" first): ``pass`` (name and iteration),
    ``components``, ``nodes``, ``parameters``."""
    b = report.before
    return {"pass": ["(before)"] + [f"{p.name} #{p.iteration}" for p in report.passes],
            "components": [b.get("num_components", 0)] + [p.num_components
                                                          for p in report.passes],
            "nodes": [b.get("num_nodes", 0)] + [p.num_nodes for p in report.passes],
            "parameters": [b.get("num_parameters", 0)] + [p.num_parameters
                                                          for p in report.passes]}


def _panel(ax, series: dict[str, list], left: tuple[str, ...], right: str, title: str) -> None:
    x = list(range(len(series["pass"])))
    for key, colour in zip(left, ("#1f77b4", "#ff7f0e"), strict=False):
        ax.plot(x, series[key], "o-", color=colour, label=key)
    ax.set_ylabel(", ".join(left))
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(x, series[right], "s--", color="#d62728", label=right)
    ax2.set_ylabel(right, color="#d62728")
    ax2.set_ylim(bottom=0)
    ax.set_xticks(x)
    ax.set_xticklabels(series["pass"], rotation=60, ha="right", fontsize=7)
    ax.set_title(title, fontsize=10)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="upper right")


def plot_report(path: str | os.PathLike, report: OptimizeReport | None = None,
                network_report: NetworkReport | None = None, *,
                title: str | None = None) -> None:
    """Chart ``report`` (command level) and/or ``network_report`` (network level),
    one panel each, to ``path`` (.png, .svg or .pdf, written atomically). Needs
    matplotlib (a :class:`~pynnet3.errors.DependencyError` otherwise)."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in _FORMATS:
        raise ValueError(f"plot_report: {path}: the name must end in one of "
                         f"{', '.join('.' + f for f in _FORMATS)}")
    if report is None and network_report is None:
        raise ValueError("plot_report: no report to plot")
    plt = _pyplot()
    panels = [p for p in (network_report, report) if p is not None]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 4.2 * len(panels)), squeeze=False)
    try:
        for ax, rep in zip(axes[:, 0], panels, strict=True):
            if isinstance(rep, NetworkReport):
                _panel(ax, network_series(rep), ("components", "nodes"), "parameters",
                       "network optimizer: after each pass")
            else:
                _panel(ax, report_series(rep), ("commands", "matrices"), "peak_floats",
                       "computation optimizer: after each pass")
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt)
    finally:
        plt.close(fig)
    atomic_write(path, buf.getvalue())


__all__ = ["network_series", "plot_report", "report_series"]
