"""The memory timeline: its maximum is the computation's peak_memory_floats, the
forward/backward boundary and the matrices alive at the peak; the plot when
matplotlib is installed, a clear error when it is not."""

from __future__ import annotations

import sys
from importlib import resources

import numpy as np
import pytest

import pynnet3
from pynnet3.cli.demo import demo_requests
from pynnet3.computation import CommandType as CT
from pynnet3.errors import DependencyError
from pynnet3.viz import memory_timeline, plot_memory


def _computations():
    cfg = resources.files("pynnet3").joinpath("examples/tdnnf.config").read_text()
    nnet = pynnet3.Nnet.from_config(cfg, seed=0)
    for name, _, req in demo_requests(nnet, decode_frames=30, train_seqs=2, train_frames=10):
        for opt in (False, True):
            yield f"tdnnf-{name}-{opt}", pynnet3.compile(nnet, req, optimize=opt)
    from pynnet3.testing.random_nets import case_for_seed

    for seed in range(8):
        case = case_for_seed(seed)
        for opt in (False, True):
            yield f"random-{seed}-{opt}", pynnet3.compile(case.build_nnet(), case.request,
                                                          optimize=opt)


@pytest.fixture(scope="module")
def computations():
    return list(_computations())


def test_the_maximum_is_peak_memory_floats(computations):
    for name, comp in computations:
        tl = memory_timeline(comp)
        peak = comp.stats()["peak_memory_floats"]
        assert len(tl.live_floats) == len(comp.commands), name
        assert tl.live_floats.max() == peak == tl.peak_floats, name
        assert tl.live_floats[tl.peak_command] == peak, name
        assert np.all(tl.live_floats[:tl.peak_command] < peak), name


def test_boundary_and_live_matrices(computations):
    for name, comp in computations:
        tl = memory_timeline(comp)
        markers = [i for i, c in enumerate(comp.commands) if c.type is CT.NO_OPERATION_MARKER]
        assert tl.backward_start == (markers[0] if markers else None), name
        sizes = [m.floats for m in tl.live_at_peak]
        assert sizes == sorted(sizes, reverse=True), name
        if not any(c.type is CT.COMPRESS_MATRIX for c in comp.commands):
            # (a compressed matrix counts its packed bytes in the timeline, its full
            # size here; the rest is a gathering temporary)
            assert sum(sizes) <= tl.peak_floats, name
        for m in tl.live_at_peak:
            info = comp.matrices[m.matrix]
            assert (m.rows, m.cols) == (info.rows, info.cols)
            assert m.what.startswith(info.node)
        assert f"peak {tl.peak_floats} floats" in tl.describe()


def test_plot_without_matplotlib_is_a_clear_error(computations, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(DependencyError, match="matplotlib"):
        plot_memory(tmp_path / "m.png", computations[0][1])
    assert not (tmp_path / "m.png").exists()


def test_plot_needs_a_known_suffix(computations, tmp_path):
    with pytest.raises(ValueError, match=".png"):
        plot_memory(tmp_path / "m.jpeg", computations[0][1])


@pytest.mark.parametrize("suffix,head", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<svg"),
                                         (".pdf", b"%PDF")])
def test_plot(computations, tmp_path, suffix, head):
    pytest.importorskip("matplotlib")
    by_name = dict(computations)
    out = tmp_path / ("memory" + suffix)
    plot_memory(out, by_name["tdnnf-train-False"], memory_timeline(by_name["tdnnf-train-True"]),
                kaldi_peak=1e5, title="bundled TDNN-F, training")
    assert out.read_bytes()[:4096].find(head) >= 0
