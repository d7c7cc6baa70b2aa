"""A computation's memory over time, as data (:func:`memory_timeline`) and as a plot
(:func:`plot_memory`, matplotlib, an optional extra: ``pip install pynnet3[viz]``).

The numbers are THE accounting of :mod:`pynnet3.analysis.memory`: the timeline's
maximum is ``comp.stats()["peak_memory_floats"]``.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..analysis.memory import memory_profile
from ..computation import CommandType as CT
from ..computation import NnetComputation
from ..errors import DependencyError
from ..io.atomic import atomic_write


@dataclass(frozen=True)
class LiveMatrix:
    """A matrix alive at the peak: its number, size in floats and what it holds."""

    matrix: int
    rows: int
    cols: int
    what: str  # the node (``(deriv)`` for a derivative)

    @property
    def floats(self) -> int:
        return self.rows * self.cols


@dataclass
class MemoryTimeline:
    """Live floats after each command; the (first) peak; the first command of the
    backward pass (the first NO_OPERATION_MARKER; None when there is none); the
    matrices alive at the peak, largest first."""

    live_floats: np.ndarray
    peak_floats: int
    peak_command: int  # -1 for an empty computation
    backward_start: int | None
    live_at_peak: list[LiveMatrix]

    def describe(self, limit: int = 10) -> str:
        lines = [f"{len(self.live_floats)} commands, peak {self.peak_floats} floats at "
                 f"command {self.peak_command}, backward from "
                 f"{'-' if self.backward_start is None else self.backward_start}"]
        for m in self.live_at_peak[:limit]:
            lines.append(f"  m{m.matrix:<5} {m.rows:>6} x {m.cols:<6} {m.floats:>10}  {m.what}")
        if len(self.live_at_peak) > limit:
            lines.append(f"  ... {len(self.live_at_peak) - limit} more")
        return "\n".join(lines)


def memory_timeline(comp: NnetComputation) -> MemoryTimeline:
    """The memory timeline of ``comp`` (class doc)."""
    prof = memory_profile(comp)
    boundary = next((i for i, c in enumerate(comp.commands)
                     if c.type is CT.NO_OPERATION_MARKER), None)
    live = []
    for m in prof.live_at_peak:
        info = comp.matrices[m]
        live.append(LiveMatrix(m, info.rows, info.cols,
                               f"{info.node}{' (deriv)' if info.is_deriv else ''}"))
    return MemoryTimeline(prof.live_floats, prof.peak_floats, prof.peak_command, boundary,
                          live)


_FORMATS = ("png", "svg", "pdf")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise DependencyError("plotting needs matplotlib, which is not installed: "
                              "pip install 'pynnet3[viz]' (or pip install matplotlib)"
                              ) from None
    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot

    return pyplot


def _timeline(x) -> MemoryTimeline:
    return x if isinstance(x, MemoryTimeline) else memory_timeline(x)


def plot_memory(path: str | os.PathLike, unoptimized, optimized=None, *,
                kaldi_peak: float | None = None, title: str | None = None,
                labels: tuple[str, str] = ("unoptimized", "optimized"),
                top: int = 4) -> None:
    """Plot live floats per command to ``path`` (.png, .svg or .pdf, written
    atomically): ``unoptimized`` (and ``optimized``, on the same axes; each a
    computation or a :class:`MemoryTimeline`), each peak marked and annotated with
    the ``top`` largest matrices alive at it, the forward/backward boundary as a
    vertical line, and ``kaldi_peak`` (floats, e.g. Kaldi's from ``stats.json``) as
    a horizontal line. Needs matplotlib (a :class:`DependencyError` otherwise)."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in _FORMATS:
        raise ValueError(f"plot_memory: {path}: the name must end in one of "
                         f"{', '.join('.' + f for f in _FORMATS)}")
    plt = _pyplot()
    series = [(labels[0], _timeline(unoptimized))]
    if optimized is not None:
        series.append((labels[1], _timeline(optimized)))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    longest = max(len(tl.live_floats) for _, tl in series)
    try:
        for (label, tl), colour in zip(series, ("#1f77b4", "#d62728"), strict=False):
            x = np.arange(len(tl.live_floats))
            ax.step(x, tl.live_floats, where="post", color=colour,
                    label=f"{label} (peak {tl.peak_floats} floats)")
            if tl.peak_command >= 0:
                ax.plot([tl.peak_command], [tl.peak_floats], "o", color=colour)
                held = [f"m{m.matrix} {m.what} {m.rows}x{m.cols}" for m in tl.live_at_peak[:top]]
                if len(tl.live_at_peak) > top:
                    held.append(f"+{len(tl.live_at_peak) - top} more")
                right = tl.peak_command > 0.6 * longest
                ax.annotate("\n".join(held), (tl.peak_command, tl.peak_floats),
                            textcoords="offset points", xytext=(-8 if right else 8, -4),
                            ha="right" if right else "left", va="top", fontsize=7,
                            color=colour, bbox={"boxstyle": "round", "fc": "white",
                                                "ec": colour, "alpha": 0.85})
            if tl.backward_start is not None:
                ax.axvline(tl.backward_start, color=colour, linestyle=":", linewidth=1,
                           label=f"{label}: backward pass starts")
        if kaldi_peak is not None:
            ax.axhline(kaldi_peak, color="#2ca02c", linestyle="--", linewidth=1,
                       label=f"Kaldi peak ({int(kaldi_peak)} floats)")
        ax.set_xlabel("command")
        ax.set_ylabel("live floats")
        ax.set_ylim(bottom=0)
        if title:
            ax.set_title(title)
        ax.legend(fontsize=8, loc="upper left", framealpha=0.8)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt)
    finally:
        plt.close(fig)
    atomic_write(path, buf.getvalue())


__all__ = ["LiveMatrix", "MemoryTimeline", "memory_timeline", "plot_memory"]
